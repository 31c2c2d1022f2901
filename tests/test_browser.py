"""The app in a real browser: Debian chromium driven by playwright (FACTS.md, "Testing the Streamlit app").

Starts `streamlit run app.py` on a free local port, clicks Step twice with the default trio, checks
that the tree and the charts are drawn with the right number of points (read from each plotly div's
`.data`, and the SVG points actually drawn), and saves a screenshot of every page to docs/screenshots/.
Skips cleanly where chromium or playwright is missing (scripts/install.sh installs both)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("TREEGRAFT_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "docs" / "screenshots"
BUDGET = 16  # the app's default; the default trio's weak pool is far larger, so exactly 16 are verified
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
PLOTS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => ({
    meta: (d.layout || {}).meta || {},
    drawn: d.querySelectorAll('.scatterlayer path.point').length,
    bars: d.querySelectorAll('.barlayer path').length,
    traces: (d.data || []).map(t => ({meta: t.meta, name: t.name, n: (t.x || []).length, type: t.type}))}))"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("streamlit") / "server.log", "w")
    env = os.environ | {"TREEGRAFT_DTYPE": "float32", "TREEGRAFT_DEVICE": "cpu", "TREEGRAFT_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.headless", "true"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read().strip() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"streamlit did not come up; see {log.name}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser_page(app_url):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1500, "height": 1100})
        pg.set_default_timeout(180_000)
        pg.goto(app_url)
        yield pg
        browser.close()


def idle(page, text: str | None = None) -> None:
    """Wait until the script has finished AND the expected content is on screen."""
    if text:
        page.get_by_text(text).first.wait_for()
    page.wait_for_selector(IDLE)


def plots(page) -> dict:
    return {p["meta"].get("kind"): p for p in page.evaluate(PLOTS)}


def count(plot: dict, meta: str) -> int:
    return sum(t["n"] for t in plot["traces"] if t["meta"] == meta)


def wait_for_step(page, step: int) -> None:
    page.wait_for_function(
        "s => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
        "d => d.layout && d.layout.meta && d.layout.meta.kind === 'tree' && d.layout.meta.step === s)", arg=step)
    idle(page)


def shoot(page, name: str, height: int = 2200) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1500, "height": height})
    # Streamlit scrolls inside its own containers: bring every one back to the top.
    page.evaluate("() => document.querySelectorAll('*').forEach(e => { if (e.scrollTop) e.scrollTop = 0; })")
    page.wait_for_timeout(800)  # let plotly finish its transitions
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    page.set_viewport_size({"width": 1500, "height": 1100})


def nav(page, label: str, text: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=label).click()
    idle(page, text)


def test_step_twice_draws_tree_and_charts(browser_page):
    page = browser_page
    idle(page, "Press Step")
    for k in range(2):
        page.get_by_role("button", name="Step", exact=True).click()
        wait_for_step(page, k)
    got = plots(page)
    tree = got["tree"]
    assert tree["meta"]["stage"] == "verified"
    # The tree shows exactly the verified nodes: the budget, as the page's own verdict line says.
    assert count(tree, "tree") == BUDGET == tree["meta"]["tree_nodes"]
    page.get_by_text(f"Step 1: {BUDGET} nodes verified").first.wait_for()
    marker_points = sum(t["n"] for t in tree["traces"] if t["meta"] != "edges")
    assert tree["drawn"] == marker_points  # every node is an SVG point on screen
    accept = got["accept"]
    assert count(accept, "points") == 2 and accept["bars"] >= 2
    assert count(got["throughput"], "points") == 2
    assert count(got["speedup"], "points") == 0  # no ar baseline yet

    page.get_by_role("button", name="Compare with baselines").click()
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
        "d => d.layout && d.layout.meta && d.layout.meta.kind === 'speedup' && d.data.length >= 3)")
    idle(page)
    got = plots(page)
    lines = {t["name"]: t["n"] for t in got["throughput"]["traces"]}
    assert set(lines) == {"treegraft", "ar", "tree-weak", "tree-strong"}
    tokens = int(page.locator('[data-testid="stMetricValue"]').nth(1).inner_text())
    assert lines["ar"] == tokens  # plain decoding: one token per step, to the same length
    speed = {t["name"]: t["n"] for t in got["speedup"]["traces"]}
    assert speed["treegraft"] == 2 and speed["tree-weak"] >= 1 and speed["tree-strong"] >= 1
    assert got["speedup"]["drawn"] == sum(speed.values())
    shoot(page, "step-through", 3300)


def test_other_pages_render(browser_page):
    page = browser_page
    nav(page, "Scheduler", "Decision timeline")
    assert "decisions" in plots(page)
    page.get_by_role("button", name="Rerun this step both ways").click()
    page.wait_for_function(  # both what-if trees drawn (the caption's words would match too early)
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter("
        "d => d.layout && d.layout.meta && d.layout.meta.kind === 'tree').length === 2")
    idle(page)
    trees = [p for p in page.evaluate(PLOTS) if p["meta"].get("kind") == "tree"]
    assert all(count(t, "tree") == t["meta"]["tree_nodes"] == BUDGET for t in trees)
    shoot(page, "scheduler", 2700)

    nav(page, "How it works", "Stage")
    walk = plots(page)["tree"]
    assert walk["meta"]["stage"] in ("weak pool", "strong pool")
    seen = [walk["meta"]["stage"]]
    while seen[-1] != "verified":  # every Next moves one stage on, up to the target's verdict
        assert len(seen) < 8, seen
        page.get_by_role("button", name="Next >").click()
        page.wait_for_function(
            "s => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
            "d => d.layout && d.layout.meta && d.layout.meta.kind === 'tree' && d.layout.meta.stage !== s)",
            arg=seen[-1])
        idle(page)
        seen.append(plots(page)["tree"]["meta"]["stage"])
        if seen[-1] == "grafted":  # the strong drafter's work, when this step called it
            shoot(page, "how-it-works", 1700)
    assert seen[-2:] == ["selected", "verified"] and len(set(seen)) == len(seen), seen
    if "grafted" not in seen:
        shoot(page, "how-it-works", 1700)

    nav(page, "Benchmarks", "Benchmarks")
    shoot(page, "benchmarks", 1800)
    assert page.locator('[data-testid="stException"]').count() == 0

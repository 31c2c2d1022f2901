"""The app in a real browser: Debian chromium driven by playwright (FACTS.md, "Testing the Streamlit app").

Starts `streamlit run app.py` on a free local port and, with the default trio:
- the default demo shows the strong drafter's nodes (rescored / grafted / recovered) within a few
  Steps, or the banner that says why not;
- the tree and the charts are drawn with the right number of points (each plotly div's `.data`, and
  the SVG points actually drawn);
- every method has one colour on the main page's charts and on the Benchmarks page (plotly JSON);
- a step cut at max new tokens states its token arithmetic right ("... = 1 token");
- an invalid setting leaves no stale tree on screen;
- render time vs the engine's own step time is measured and printed (a ratio, never asserted);
and saves a screenshot of every page to docs/screenshots/. Skips cleanly where chromium or playwright
is missing (scripts/install.sh installs both)."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from treegraft import colors

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
    traces: (d.data || []).map(t => ({meta: t.meta, name: t.name, n: (t.x || []).length, type: t.type,
                                      color: (t.marker || {}).color, line: (t.line || {}).color}))}))"""
STRONG_WORK = {colors.PROVENANCE[k][0] for k in ("rescored", "graft", "recovered")}
MAIN_COLOURS: dict = {}  # method -> colour on the main page, compared with the Benchmarks page


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
    try:
        page.wait_for_function(
            "s => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
            "d => d.layout && d.layout.meta && d.layout.meta.kind === 'tree' && d.layout.meta.step === s)", arg=step)
    except sync_api.TimeoutError:
        page.screenshot(path="/tmp/treegraft-browser-failure.png")
        pytest.fail(f"step {step}'s tree never appeared; the page says: {page.inner_text('body')[:3000]}")
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


def tree_on_screen(page) -> bool:
    return page.evaluate("() => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
                         "d => d.layout && d.layout.meta && d.layout.meta.kind === 'tree')")


def timed_step(page, k: int) -> tuple[float, float]:
    """Click Step; seconds from the click until step k's tree is drawn and the script is idle, and
    the engine's own step time as the page reports it."""
    t0 = time.perf_counter()
    page.get_by_role("button", name="Step", exact=True).click()
    wait_for_step(page, k)
    total = time.perf_counter() - t0
    verdict = page.get_by_text(re.compile(rf"^Step {k}: ")).first.inner_text()
    engine = int(re.search(r"step time (\d+) ms", verdict).group(1)) / 1e3
    return total, engine


def method_colours(plot: dict) -> dict:
    return {t["name"]: t["color"] for t in plot["traces"] if t["meta"] == "points"}


def test_default_demo_shows_the_strong_drafter_and_measures_render_time(browser_page):
    page = browser_page
    idle(page, "Press")
    ratios, strong_seen = [], False
    for k in range(5):
        total, engine = timed_step(page, k)
        if k:  # step 0 also loads the models
            ratios.append(total / engine)
        tree = plots(page)["tree"]
        strong_seen = strong_seen or any(t["meta"] == "tree" and t["name"] in STRONG_WORK and t["n"]
                                         for t in tree["traces"])
        if k == 2:  # (a) within 3 steps: the strong drafter's nodes are on screen, or the banner says why not
            assert strong_seen or page.get_by_text("Strong drafter not called").count(), \
                "no strong-drafter node and no banner after 3 steps"
    print(f"\nrender/engine time per Step: median {statistics.median(ratios):.2f}x "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")
    (Path(os.environ.get("TREEGRAFT_TIMING_OUT", "/tmp")) / "treegraft-render-timing.json").write_text(
        json.dumps({"ratios": ratios, "median": statistics.median(ratios)}))
    assert strong_seen  # the default policy (always) calls it on every step
    page.get_by_text("Strong drafter: rescored").first.wait_for()  # what it changed, in words
    got = plots(page)
    tree = got["tree"]
    assert tree["meta"]["stage"] == "verified"
    # The tree shows exactly the verified nodes: the budget, as the page's own verdict line says.
    assert count(tree, "tree") == BUDGET == tree["meta"]["tree_nodes"]
    page.get_by_text(f"Step 4: {BUDGET} nodes verified").first.wait_for()
    marker_points = sum(t["n"] for t in tree["traces"] if t["meta"] != "edges")
    assert tree["drawn"] == marker_points  # every node is an SVG point on screen
    accept = got["accept"]
    assert count(accept, "points") == 5 and accept["bars"] >= 5
    assert "throughput" not in got  # the speed charts wait for a comparison

    page.get_by_role("button", name="Compare with baselines").click()
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
        "d => d.layout && d.layout.meta && d.layout.meta.kind === 'speed_modes' && d.data.length >= 3)")
    idle(page)
    got = plots(page)
    lines = {t["name"]: t["n"] for t in got["throughput"]["traces"]}
    assert set(lines) == {"treegraft", "ar", "tree-weak", "tree-strong"}
    tokens = int(page.locator('[data-testid="stMetricValue"]').nth(1).inner_text())
    assert lines["ar"] == tokens  # plain decoding: one token per step, to the same length
    assert lines["treegraft"] == 5  # the re-run of this method takes the same steps (greedy)
    speed = {t["name"]: t["n"] for t in got["speedup"]["traces"] if t["meta"] == "points"}
    assert speed["treegraft"] == 5 and speed["tree-weak"] >= 1 and speed["tree-strong"] >= 1
    # (b) one colour per method on every chart of the page, the one treegraft.colors defines
    for kind in ("throughput", "speedup", "speed_modes"):
        for name, colour in method_colours(got[kind]).items():
            assert colour == colors.method_color(name), (kind, name, colour)
            assert MAIN_COLOURS.setdefault(name, colour) == colour, (kind, name)
    page.get_by_text("Why wall times move").first.wait_for()
    shoot(page, "step-through", 3600)


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
    page.get_by_text("What differs from the live step").first.wait_for()
    shoot(page, "scheduler", 2900)

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
        if seen[-1] == "grafted":  # the strong drafter's work
            shoot(page, "how-it-works", 1700)
    # The page opens on a step where the strong drafter ran: every stage is there.
    assert seen == ["weak pool", "rescored", "recovered", "grafted", "selected", "verified"], seen

    nav(page, "Benchmarks", "Results directory")
    # The committed benchmark of the shipped trio (a fresh clone opens it by default; runs/ may hold others).
    box = page.get_by_label("Results directory (holds results.csv and, optionally, summary.csv)")
    box.fill(str(ROOT / "docs" / "bench" / "current"))
    box.press("Enter")
    try:
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some(d => d.layout && d.layout.meta && "
            "String(d.layout.meta.kind).startsWith('bench:') && d.data.some(t => t.name === 'tree-strong'))",
            timeout=60_000)
    except sync_api.TimeoutError:
        page.screenshot(path="/tmp/treegraft-browser-failure.png")
        pytest.fail(f"the committed benchmark never showed; the page says: {page.inner_text('body')[:2000]}")
    idle(page, "Mean per category and method")
    bench = [p for p in page.evaluate(PLOTS) if str(p["meta"].get("kind", "")).startswith("bench:")]
    assert bench
    shared = 0
    for p in bench:
        for name, colour in method_colours(p).items():
            assert colour == colors.method_color(name), (p["meta"]["kind"], name, colour)
            main = MAIN_COLOURS.get(name) or MAIN_COLOURS.get(name.partition(":")[0] if name.endswith(":always") else "")
            if main:  # the same method (treegraft:always is the main page's treegraft) in the same colour
                assert main == colour, (name, main, colour)
                shared += 1
    assert not MAIN_COLOURS or shared >= 3 * len(bench), shared  # ar, tree-weak, tree-strong (+ treegraft:always)
    shoot(page, "benchmarks", 2400)
    assert page.locator('[data-testid="stException"]').count() == 0


def set_number(page, label: str, value) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Enter")
    box.blur()
    page.wait_for_timeout(1500)  # the rerun this triggers must start before "idle" means anything
    idle(page)
    assert float(box.input_value()) == float(value)


def test_cut_step_arithmetic_and_no_stale_tree_after_an_invalid_setting(browser_page):
    page = browser_page
    nav(page, "Step through", "TreeGraft: step through")
    page.get_by_role("button", name="Reset", exact=True).click()
    idle(page, "Press")
    set_number(page, "Max new tokens", 1)
    page.get_by_role("button", name="Step", exact=True).click()
    wait_for_step(page, 0)
    # (c) one token out, however many the target accepted: the sum is right and "token" is singular.
    verdict = page.get_by_text(re.compile(r"^Step 0: ")).first.inner_text()
    assert re.search(r"(\d+ of \d+ accepted kept \+ 0 bonus|0 accepted \+ 1 bonus) = 1 token\b", verdict), verdict
    assert "1 tokens" not in page.inner_text("body")
    # (d) an invalid setting: its message at once, and the previous run's tree gone from the screen
    set_number(page, "Budget N (tree nodes sent to the target)", 0)
    page.get_by_text("budget must be an integer in [1, 512], got 0").first.wait_for()
    assert not tree_on_screen(page) and page.get_by_text("Step 0:").count() == 0
    page.get_by_role("button", name="Step", exact=True).click()
    page.wait_for_timeout(1500)  # as in set_number: the rerun must start before "idle" means anything, and a
    idle(page)                   # setting changed while it still runs would race it (once seen stuck "running")
    assert not tree_on_screen(page)
    set_number(page, "Budget N (tree nodes sent to the target)", BUDGET)  # valid again: the run is back
    page.wait_for_function("() => Array.from(document.querySelectorAll('.js-plotly-plot')).some("
                           "d => d.layout && d.layout.meta && d.layout.meta.kind === 'tree')")
    assert page.locator('[data-testid="stException"]').count() == 0

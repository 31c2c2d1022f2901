"""The Streamlit app under AppTest, on the real default trio (fp32, CPU unless TREEGRAFT_TEST_DEVICE).

Every page runs without an exception; after Step the tree figure shows exactly the step record's
selected nodes; the stage slider changes the figure; bad input shows st.error, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import networkx as nx
import pytest
from streamlit.testing.v1 import AppTest

from treegraft import colors, viz
from treegraft.record import StepRecord, loads_trace, provenance_summary

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
PAGES = ["pages/1_Scheduler.py", "pages/2_Benchmarks.py", "pages/3_How_it_works.py"]
TIMEOUT = 180  # first Step loads the trio; a busy shared CPU is slow


@pytest.fixture(autouse=True)
def app_env(monkeypatch):
    monkeypatch.setenv("TREEGRAFT_DTYPE", "float32")
    monkeypatch.setenv("TREEGRAFT_DEVICE", os.environ.get("TREEGRAFT_TEST_DEVICE", "cpu"))


def fresh(max_new_tokens: int = 16) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.number_input(key="w_max_new_tokens").set_value(max_new_tokens).run()
    return at


def clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def figures(at: AppTest) -> dict:
    """Plotly figures on the page by their layout.meta.kind (a list where a kind repeats)."""
    out: dict = {}
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        out.setdefault(spec["layout"]["meta"]["kind"], []).append(spec)
    return out


def test_every_page_runs_before_any_step():
    for page in [APP] + [str(ROOT / p) for p in PAGES]:
        at = AppTest.from_file(page, default_timeout=TIMEOUT).run()
        clean(at)
        # Benchmarks may find a results directory under runs/ and show it straight away.
        assert at.info or at.success, f"{page} should say what to do first"


def test_step_draws_the_selected_tree_and_the_stage_slider_replays_it():
    at = fresh()
    at.button(key="step").click().run()
    clean(at)
    rec = at.session_state["run"].records[-1]
    tree = figures(at)["tree"][0]
    assert tree["layout"]["meta"]["stage"] == "verified"
    assert viz.count_points(tree, "tree") == len(rec.selected) > 0
    # Pruned candidates: each pruned subtree drawn as its top node, the rest counted in its hover.
    meta = tree["layout"]["meta"]
    assert viz.count_points(tree, "pruned") == meta["pruned_nodes"] > 0
    assert meta["pruned_nodes"] + meta["pruned_collapsed"] == len(rec.nodes) - len(rec.selected)
    # The default demo shows the strong drafter at work from the first step (policy always).
    assert rec.strong_called and at.session_state["run"].cfg.policy == "always"
    strong_labels = {viz.PROVENANCE[k][0] for k in ("rescored", "graft", "recovered")}
    assert any(t.get("meta") == "tree" and t["name"] in strong_labels and t["x"] for t in tree["data"])
    assert any(m.value.startswith("Strong drafter: rescored") for m in at.markdown)

    stage = at.select_slider[0]
    assert list(stage.options) == [s["name"] for s in rec.stages]
    stage.set_value("weak pool").run()
    clean(at)
    pool = figures(at)["tree"][0]
    assert pool["layout"]["meta"]["stage"] == "weak pool"
    assert viz.count_points(pool, "tree") == len(viz.stage_nodes(rec, "weak pool")) != len(rec.selected)
    assert pool["data"] != tree["data"]

    at.button(key="step").click().run()
    clean(at)
    recs = at.session_state["run"].records
    charts = figures(at)
    assert len(recs) == 2 and charts["tree"][0]["layout"]["meta"]["step"] == 1
    assert viz.count_points(charts["tree"][0], "tree") == len(recs[-1].selected)
    assert viz.count_points(charts["accept"][0], "points") == 2
    # Tokens per step stacked by provenance: the stack adds up to each step's tokens.
    stack = [t for t in charts["accept"][0]["data"] if t.get("meta") == "stack"]
    assert [sum(t["y"][i] for t in stack) for i in range(2)] == [r.accept_len for r in recs]
    assert "throughput" not in charts  # speed charts wait for a comparison
    # The run's acceptance by provenance and depth: what was sent, and taken, over both steps.
    sent = sum(len(r.selected) for r in recs)
    assert not at.dataframe  # built only when asked for
    at.toggle(key="provenance").set_value(True).run()
    clean(at)
    shown = at.dataframe[0].value
    totals = [int(c.split("/")[1].split(" ")[0]) for c in shown["all depths"]]
    assert sum(totals) == sent and "provenance" in shown.columns
    # Exports: the trace reloads as the same steps, the GraphML as the same tree.
    run = at.session_state["run"]
    meta, steps = loads_trace(run.trace())
    assert [r.new_tokens for r in steps] == [r.new_tokens for r in recs] and meta["names"] == run.trio.names
    graph = nx.parse_graphml(viz.tree_graphml(recs[-1], "verified", run.decode))
    assert graph.number_of_nodes() == len(recs[-1].nodes) + 1  # + the root
    shaded = next(m.value for m in at.markdown if "pre-wrap" in m.value)  # the generated text
    assert all(f"step {r.step}: {viz.plural(r.accept_len, 'token')}" in shaded for r in recs)
    assert any("tokens with the chat template" in c.value for c in at.caption)  # the prompt's token count

    # Compare: every method re-run, interleaved, to the same length; one colour per method.
    at.button(key="baselines").click().run()
    clean(at)
    run = at.session_state["run"]
    assert set(run.race) == {"ar", "tree-weak", "tree-strong", "treegraft"}
    tokens = len(run.engine.new_tokens)
    assert all(len(e.new_tokens) >= tokens or e.done for e in run.race.values())
    assert run.race["treegraft"].new_tokens[:tokens] == run.engine.new_tokens  # greedy: the same text
    charts = figures(at)
    for kind in ("throughput", "speedup", "speed_modes"):
        for t in charts[kind][0]["data"]:
            if t.get("meta") == "points":
                assert t["marker"]["color"] == colors.method_color(t["name"]), (kind, t["name"])
    modes = {t["name"]: t["y"] for t in charts["speed_modes"][0]["data"] if t.get("meta") == "points"}
    table = viz.speed_table(run.runs()).set_index("method")
    assert modes["treegraft"][1] == pytest.approx(table.loc["treegraft", "tau (tokens/forward)"])
    assert table.loc["ar", "x ar: wall time"] == pytest.approx(1.0)
    assert any("Why wall times move" in m.value for m in at.markdown)

    # The other pages read the same run.
    at.switch_page("pages/1_Scheduler.py").run()
    clean(at)
    assert viz.count_points(figures(at)["decisions"][0], "points") == 2
    # Under `always`, the page still says what the distilled scheduler would have decided.
    assert any("Under policy **learned**" in i.value for i in at.info)
    features = figures(at)["features"][0]
    assert viz.count_points(features, "points") == 2 * len(recs[0].decision["features"])
    at.button(key="whatif_go").click().run()
    clean(at)
    trees = figures(at)["tree"]
    assert len(trees) == 2  # with and without the strong drafter, side by side
    # Greedy: the branch deciding as the live step did reproduces its tokens, and the page says what differs.
    assert any("produced the same tokens" in c.value for c in at.caption)
    for t in trees:
        assert viz.count_points(t, "tree") == t["layout"]["meta"]["tree_nodes"] > 0
    assert "with the strong drafter" in trees[0]["layout"]["title"]["text"]

    at.switch_page("pages/3_How_it_works.py").run()
    clean(at)
    walk = figures(at)["tree"][0]
    assert walk["layout"]["meta"]["stage"] == "weak pool"
    at.button(key="walk_1").click().run()
    clean(at)
    assert not at.warning  # no "value set twice" warning from Streamlit
    walked = recs[at.selectbox(key="walk_step").value]  # the page prefers a step where the strong drafter ran
    assert figures(at)["tree"][0]["layout"]["meta"]["stage"] == viz.stage_names(walked)[1]
    at.select_slider[0].set_value("verified").run()
    clean(at)
    assert viz.count_points(figures(at)["tree"][0], "tree") == len(walked.selected)

    at.switch_page("app.py").run()
    clean(at)
    assert len(at.session_state["run"].records) == 2  # the run survives the page round trip


def test_run_n_then_play_to_the_end_and_reset_clears():
    at = fresh(max_new_tokens=3)
    at.number_input(key="n_steps").set_value(2).run()
    at.button(key="run_n").click().run()
    clean(at)
    assert len(at.session_state["run"].records) == 2 or at.session_state["run"].engine.done
    at.button(key="play").click().run()  # Play reruns itself step after step until the run is done
    clean(at)
    run = at.session_state["run"]
    assert run.engine.done and len(run.engine.new_tokens) <= 3 and not at.session_state["playing"]
    at.button(key="reset").click().run()
    clean(at)
    assert "run" not in at.session_state and at.info


def test_settings_survive_a_round_trip_through_the_other_pages():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="w_policy").set_value("never").run()
    at.number_input(key="w_temperature").set_value(0.5).run()
    at.text_area(key="prompt").set_value("Name three trees.").run()
    for page in PAGES + ["app.py"]:
        at.switch_page(page).run()
        clean(at)
    assert at.selectbox(key="w_policy").value == "never"
    assert at.number_input(key="w_temperature").value == 0.5
    assert at.text_area(key="prompt").value == "Name three trees."


def test_how_it_works_runs_its_own_step():
    at = AppTest.from_file(str(ROOT / PAGES[2]), default_timeout=TIMEOUT).run()
    at.button(key="walk_run").click().run()
    clean(at)
    rec = at.session_state["run"].records[-1]
    names = [s["name"] for s in rec.stages]
    assert list(at.select_slider[0].options) == names
    assert figures(at)["tree"][0]["layout"]["meta"]["tree_nodes"] == len(viz.stage_nodes(rec, names[0]))


@pytest.mark.parametrize("widget,key,value,message", [
    ("text_area", "prompt", "   ", "the prompt is empty"),
    ("text_input", "w_target", "/no/such/model", "model path not found: /no/such/model"),
    ("text_input", "w_weak", "no-such-org/no-such-model", "not in the local Hugging Face cache"),
    ("number_input", "w_budget", 0, "budget must be an integer in [1, 512], got 0"),
    ("number_input", "w_budget", 10000, "budget must be an integer in [1, 512], got 10000"),
    ("number_input", "w_depth", 0, "depth must be an integer in [1, 32]"),
    ("number_input", "w_top_p", 0.0, "top_p must be in (0, 1]"),
    ("number_input", "w_temperature", -1.0, "temperature must be in [0, 100]"),
])
def test_bad_input_shows_a_specific_error(widget, key, value, message):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    getattr(at, widget)(key=key).set_value(value).run()
    at.button(key="step").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(message in e for e in errors), errors
    assert not any("Traceback" in e for e in errors)


def test_the_oracle_asked_to_sample_says_why_it_refuses():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="w_policy").set_value("oracle").run()
    at.number_input(key="w_temperature").set_value(0.7).run()
    at.button(key="step").click().run()
    assert not at.exception
    assert any("policy 'oracle' is greedy only" in e.value for e in at.error), [e.value for e in at.error]


def test_benchmarks_page_opens_a_results_directory(tmp_path):
    at = AppTest.from_file(str(ROOT / PAGES[1]), default_timeout=TIMEOUT).run()
    at.text_input(key="bench_dir").set_value(str(tmp_path / "missing")).run()
    assert not at.exception and "not a directory" in at.error[0].value
    at.text_input(key="bench_dir").set_value(str(tmp_path)).run()
    assert not at.exception and "has no results.csv" in at.error[0].value
    (tmp_path / "config.json").write_text("{not json")
    assert viz.bench_config_line(tmp_path) is None  # a broken config is skipped, not raised
    # A results.csv with the bench's columns (test data: the page must plot whatever it is given).
    rows = ["prompt_id,category,method,new_tokens,target_forwards,tau,wall_s,tokens_per_s,speedup_vs_ar,"
            "strong_calls,mean_tree_size"]
    for i, cat in enumerate(("coding", "math")):
        for m, tps in (("ar", 20.0), ("tree-weak", 24.0), ("tree-strong", 22.0), ("treegraft:learned", 27.0)):
            rows.append(f"p{i},{cat},{m},32,{16 if m != 'ar' else 32},{2.0 if m != 'ar' else 1.0},1.5,{tps},"
                        f"{tps / 20.0},{3 if m.startswith('treegraft') else 0},{16 if m != 'ar' else 0}")
    (tmp_path / "results.csv").write_text("\n".join(rows) + "\n")
    at.text_input(key="bench_dir").set_value(str(tmp_path)).run()
    clean(at)
    by_kind = figures(at)
    charts = [c for k, v in by_kind.items() if k.startswith("bench:") for c in v]
    assert len(charts) == 5  # every metric present in the file (matches_ar, strong_forwards are not)
    for c in charts:
        assert viz.count_points(c, "points") == 8  # 2 categories x 4 methods
        for t in c["data"]:  # one colour per method, the same as on the main page
            if t.get("meta") == "points":
                assert t["marker"]["color"] == colors.method_color(t["name"])
    # tree-strong drafts every step with the strong drafter: its steps count, not the scheduler's 0 calls.
    steps = {t["name"]: t["y"] for t in by_kind["bench:strong_steps"][0]["data"]}
    assert steps["tree-strong"] == [16, 16] and steps["treegraft:learned"] == [3, 3] and steps["ar"] == [0, 0]
    (tmp_path / "results.csv").write_text("not,a\n\"broken")
    at.text_input(key="bench_dir").set_value(str(tmp_path) + "/").run()
    assert not at.exception and at.error


def test_benchmarks_page_lists_the_committed_runs_and_opens_the_one_picked():
    at = AppTest.from_file(str(ROOT / PAGES[1]), default_timeout=TIMEOUT).run()
    options = at.selectbox(key="bench_pick").options
    committed = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "docs" / "bench").glob("**/results.csv")}
    assert options[1] == "docs/bench/current" and set(options[1:]) == committed and len(committed) > 100
    picked = "docs/bench/epyc-fast/qwen-coder__ngram_qwen-0.5b"
    at.selectbox(key="bench_pick").set_value(picked).run()
    clean(at)
    assert at.text_input(key="bench_dir").value == str(ROOT / picked)
    said = next(c.value for c in at.caption if c.value.startswith("Measured with:"))
    assert "Qwen2.5-Coder-1.5B" in said and "ngram" in said and "cpu-avx512" in said and "12 prompts x 32 new tokens" in said
    tps = figures(at)["bench:tokens_per_s"][0]
    assert {t["name"] for t in tps["data"] if t.get("meta") == "points"} >= {"ar", "treegraft:learned", "assisted"}
    at.text_input(key="bench_dir").set_value(str(ROOT / "docs" / "bench" / "current")).run()
    assert at.selectbox(key="bench_pick").value == options[0]  # typing a directory clears the pick


def test_benchmarks_page_runs_a_small_benchmark(tmp_path):
    from treegraft.bench.prompts import PromptSetError, package_file
    try:
        package_file("math")
    except PromptSetError as e:
        pytest.skip(str(e))
    at = AppTest.from_file(str(ROOT / PAGES[1]), default_timeout=TIMEOUT).run()
    at.number_input(key="w_max_new_tokens").set_value(4).run()
    at.selectbox(key="bench_suite").set_value("math")
    at.number_input(key="bench_tokens").set_value(4)
    at.text_input(key="bench_out").set_value(str(tmp_path / "bench"))
    at.multiselect(key="bench_methods").set_value(["ar", "treegraft"])
    at.button(key="bench_run").click().run()
    clean(at)
    assert at.text_input(key="bench_dir").value == str(tmp_path / "bench")
    charts = figures(at)
    tps = charts["bench:tokens_per_s"][0]
    assert viz.count_points(tps, "points") == 2  # one prompt, two methods, measured just now
    assert (tmp_path / "bench" / "results.csv").is_file()


def test_viz_alone_on_a_hand_built_record():
    """viz needs no Streamlit and no model: a 4-node record, drawn and exported."""
    def node(i, token, parent, depth, value, origin="weak", **kw):
        return {"id": i, "token": token, "parent": parent, "depth": depth, "score": value, "value": value,
                "origin": origin, "weak_logp": value, "strong_logp": None, "rescored": False,
                "graft_point": False, "selected": True, "accepted": False, "expanded_by": None} | kw
    nodes = [node(0, 10, -1, 1, -0.1, accepted=True), node(1, 11, -1, 1, -2.0),
             node(2, 12, 0, 2, -0.5, origin="graft"), node(3, 13, 0, 2, -3.0, selected=False)]
    rec = StepRecord(step=0, method="treegraft", root_token=1, root_pos=5, nodes=nodes, selected=[0, 1, 2],
                     accepted=[0], bonus=99, new_tokens=[10, 99], stages=[{"name": "verified", "nodes": nodes}],
                     times={"verify": 0.01})
    fig = viz.tree_figure(rec, decode=lambda t: f"t{t}").to_plotly_json()
    assert viz.count_points(fig, "tree") == 3 and viz.count_points(fig, "pruned") == 1
    overlay = {t["name"]: len(t["x"]) for t in fig["data"] if t.get("meta") == "overlay"}
    assert overlay == {"accepted by the target": 1, "first rejected (target disagreed)": 1,
                       "bonus: the target's own next token": 1}
    pos = viz.tidy_layout(viz.tree_graph(nodes))
    assert all(pos[n["id"]][0] == n["depth"] for n in nodes) and pos["root"][0] == 0
    assert pos[0][1] < pos[1][1]  # the more likely branch is drawn on top
    assert "<graphml" in viz.tree_graphml(rec) and len(viz.nodes_table(rec)) == 4
    # Where accepted tokens came from: node 0 (weak, depth 1) taken; 1 (weak, depth 1) and 2 (graft,
    # depth 2) sent but not taken; 3 never sent.
    prov = viz.provenance_table([rec, rec]).set_index("provenance")
    assert list(prov.columns) == ["depth 1", "depth 2", "all depths"]
    assert prov.loc[viz.PROVENANCE["weak"][0]].tolist() == ["2/4 (50%)", "", "2/4 (50%)"]
    assert prov.loc[viz.PROVENANCE["graft"][0]].tolist() == ["", "0/2 (0%)", "0/2 (0%)"]


def test_a_cut_step_counts_its_tokens_right_and_a_long_prompt_prefills_outside_the_step():
    """max_new_tokens = 1: whatever the target accepted, one token comes out, and the page says so
    ("... + 0 bonus = 1 token" or "0 accepted + 1 bonus = 1 token"), never "1 tokens"."""
    at = fresh(max_new_tokens=1)
    long = " ".join(["The river runs past the old mill and under the stone bridge."] * 45) + " Summarize."
    at.text_area(key="prompt").set_value(long).run()
    at.button(key="step").click().run()
    clean(at)
    run = at.session_state["run"]
    rec = run.records[-1]
    assert len(rec.new_tokens) == 1 and run.engine.done
    assert len(run.prompt_ids) > 512 and run.prefill_s > 0 and "prefill" not in rec.times  # prefilled outside
    verdict = next(m.value for m in at.markdown if m.value.startswith("Step 0:"))
    p = provenance_summary(rec)
    assert p["accepted_kept"] + p["bonus"] == 1
    assert viz.token_arithmetic(rec) in verdict and "= 1 token " in verdict + " "
    assert not any("1 tokens" in m.value for m in at.markdown)
    at.button(key="step").click().run()  # a finished run says so instead of stepping
    assert not at.exception and any("finished" in i.value for i in at.info)


def test_token_arithmetic_of_hand_built_cut_steps():
    rec = StepRecord(step=0, method="treegraft", root_token=1, root_pos=3, accepted=[0, 1, 2], bonus=9,
                     new_tokens=[5])
    assert viz.token_arithmetic(rec).startswith("1 of 3 accepted kept + 0 bonus = 1 token (cut")
    rec.new_tokens = [5, 6, 7, 9]
    assert viz.token_arithmetic(rec) == "3 accepted + 1 bonus = 4 tokens"
    rec.accepted, rec.new_tokens = [], [9]
    assert viz.token_arithmetic(rec) == "0 accepted + 1 bonus = 1 token"


def test_invalid_setting_hides_the_run_and_a_changed_one_greys_it():
    at = fresh(max_new_tokens=4)
    at.button(key="step").click().run()
    clean(at)
    assert "tree" in figures(at)
    at.number_input(key="w_budget").set_value(0).run()  # invalid: error at once, no stale tree, no "new run"
    assert not at.exception
    assert any("budget must be an integer in [1, 512], got 0" in e.value for e in at.error)
    assert not figures(at) and not any("starting a new run" in str(i.value) for i in at.info)
    at.button(key="step").click().run()  # stepping with it changes nothing
    assert "tree" not in figures(at) and len(at.session_state["run"].records) == 1
    at.number_input(key="w_budget").set_value(8).run()  # valid but different: the old run is marked stale
    clean(at)
    assert "tree" in figures(at)
    assert any("belong to the previous settings" in w.value and "budget 16 -> 8" in w.value for w in at.warning)
    at.button(key="step").click().run()  # a new run with the new settings
    clean(at)
    run = at.session_state["run"]
    assert run.cfg.budget == 8 and len(run.records) == 1
    assert not any("previous settings" in w.value for w in at.warning)


def test_banner_when_the_scheduler_never_calls_the_strong_drafter_and_a_hot_temperature_warns():
    at = fresh(max_new_tokens=8)
    at.selectbox(key="w_policy").set_value("never").run()
    at.number_input(key="n_steps").set_value(3).run()
    at.button(key="run_n").click().run()
    clean(at)
    recs = at.session_state["run"].records
    assert len(recs) >= 3 and not any(r.strong_called for r in recs)
    assert any(f"Strong drafter not called in {len(recs)} steps" in w.value for w in at.warning)
    at.button(key="use_always").click().run()
    assert at.selectbox(key="w_policy").value == "always" and at.session_state["settings"]["policy"] == "always"
    at.number_input(key="w_temperature").set_value(5.0).run()
    assert any("above 2" in w.value for w in at.warning)


def test_big_tree_stays_legible_and_the_accepted_path_is_on_top():
    """A budget-512-sized tree (no model): labels never closer than the layout allows, pruned
    subtrees collapsed to their tops, the accepted path on the top row even where a sibling had a
    higher path value (a rescored score can reorder siblings)."""
    import random
    rng = random.Random(0)
    nodes, frontier = [], [(-1, 0, 0.0)]
    while len(nodes) < 700:
        parent, depth, value = frontier.pop(0)
        for _ in range(4):
            v = value - rng.uniform(0.05, 3.0)
            i = len(nodes)
            nodes.append({"id": i, "token": 100 + i, "parent": parent, "depth": depth + 1, "score": v - value,
                          "value": v, "origin": rng.choice(["weak", "graft", "recovered"]), "weak_logp": None,
                          "strong_logp": None, "rescored": rng.random() < 0.5, "graft_point": False,
                          "selected": i < 100 or 175 <= i < 400, "accepted": False, "expanded_by": None})
            frontier.append((i, depth + 1, v))
    # Accept the WORST child of the root, then its worst child: the path must still be drawn on top.
    first = min((n for n in nodes if n["parent"] == -1), key=lambda n: n["value"])
    second = min((n for n in nodes if n["parent"] == first["id"]), key=lambda n: n["value"])
    for n in (first, second):
        n["accepted"] = n["selected"] = True
    rec = StepRecord(step=3, method="treegraft", root_token=1, root_pos=9, nodes=nodes,
                     selected=[n["id"] for n in nodes if n["selected"]], accepted=[first["id"], second["id"]],
                     bonus=7, new_tokens=[first["token"], second["token"], 7], stages=[])
    fig = viz.tree_figure(rec, "verified", decode=lambda t: f"tok{t}").to_plotly_json()
    meta = fig["layout"]["meta"]
    assert viz.count_points(fig, "tree") == len(rec.selected)
    assert meta["pruned_nodes"] + meta["pruned_collapsed"] == len(nodes) - len(rec.selected)
    assert meta["pruned_collapsed"] > 100  # pruned subtrees drawn as their tops
    labelled = [(x, y) for t in fig["data"] if t.get("meta") == "tree"
                for x, y, text in zip(t["x"], t["y"], t["text"]) if text]
    assert 0 < len(labelled) <= viz.LABELS_PER_COLUMN * 10
    rows = max(1.0, max(y for t in fig["data"] for y in (t.get("y") or []) if y is not None))
    for x in {x for x, _ in labelled}:
        ys = sorted(y for xx, y in labelled if xx == x)
        assert all(b - a >= 1 for a, b in zip(ys, ys[1:]))  # never two labels on one spot
    pos = viz.tidy_layout(viz.tree_graph([n for n in nodes if n["selected"]]))
    same_depth = [pos[n["id"]][1] for n in nodes if n["selected"] and n["depth"] == 1]
    assert pos[first["id"]][1] == min(same_depth) and rows > 100
    bonus = next(t for t in fig["data"] if t.get("name", "").startswith("bonus"))
    assert bonus["y"][0] < pos[second["id"]][1]  # the bonus has its own row, above its siblings


def test_compare_live_keeps_every_method_in_step_and_how_it_works_can_add_the_strong_drafter():
    at = fresh(max_new_tokens=6)
    at.checkbox(key="live").check().run()
    at.button(key="step").click().run()
    at.button(key="step").click().run()
    clean(at)
    run = at.session_state["run"]
    tokens = len(run.engine.new_tokens)
    assert set(run.race) == {"ar", "tree-weak", "tree-strong", "treegraft"}
    assert all(len(e.new_tokens) >= tokens or e.done for e in run.race.values())
    assert len(run.race["ar"].records) == min(tokens, len(run.race["ar"].new_tokens))
    assert {"throughput", "speedup", "speed_modes"} <= set(figures(at))

    # A run whose scheduler never called the strong drafter: How it works offers to rerun the step with it.
    at.selectbox(key="w_policy").set_value("never").run()
    at.button(key="step").click().run()
    clean(at)
    assert not any(r.strong_called for r in at.session_state["run"].records)
    at.switch_page("pages/3_How_it_works.py").run()
    clean(at)
    assert any("No step of this run called the strong drafter" in i.value for i in at.info)
    assert "rescored" not in at.select_slider[0].options
    at.button(key="walk_strong").click().run()
    clean(at)
    assert "rescored" in at.select_slider[0].options and "grafted" in at.select_slider[0].options


def test_models_section_offers_the_named_trios():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    box = at.selectbox(key="w_trio")
    assert box.value == "smollm2" and set(box.options) == {"smollm2", "qwen-coder"}
    clean(at)


def test_auto_budget_checkbox_sizes_the_tree_to_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))  # its cost curve is measured into a fresh cache
    at = fresh(max_new_tokens=4)
    at.checkbox(key="w_auto_budget").check().run()
    at.button(key="step").click().run()
    clean(at)
    run = at.session_state["run"]
    assert run.cfg.auto_budget and run.cfg.budget == 16  # Budget N stays the cap
    rec = run.records[-1]
    assert rec.budget is not None and len(rec.selected) <= rec.budget <= 16
    assert list((tmp_path / "profiles").glob("*.json"))


def test_when_matched_calls_prompt_lookup_only_where_it_matches_and_the_scheduler_page_shows_why():
    """Prompt lookup as the strong drafter under when-matched: each step calls exactly where the
    recorded strong_match is at least 1, its reason says what the lookup matched, and the Scheduler
    page plots strong_match beside the other features."""
    at = fresh(max_new_tokens=12)
    at.text_input(key="w_strong").set_value("ngram").run()
    at.selectbox(key="w_policy").set_value("when-matched").run()
    at.number_input(key="n_steps").set_value(4).run()
    at.button(key="run_n").click().run()
    clean(at)
    recs = at.session_state["run"].records
    assert len(recs) >= 4
    for r in recs:
        match = r.decision["features"]["strong_match"]
        assert r.decision["call"] == (match >= 1) == r.strong_called
        assert "prompt lookup matches" in r.decision["reason"]
    at.switch_page("pages/1_Scheduler.py").run()
    clean(at)
    assert "strong_match" in json.dumps(figures(at)["features"][0]["layout"])

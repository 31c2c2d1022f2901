"""`pairs`: the pairs x sets table on tiny random trios: every method of every pair runs, resumes
after a kill without losing or redoing a finished row, and the table says outputs equal ar's."""

import pytest

from tiny import tiny_trio
from treegraft.bench.pairs import METHODS, Pair, markdown, parse_pairs, run_pairs
from treegraft.bench.prompts import Prompt
from treegraft.bench.run import finish
from treegraft.bench.store import read_rows
from treegraft.engine import ConfigError, GenConfig

PROMPTS = [Prompt("p0", "alpha", ids=[5, 17, 33, 2, 9, 5, 17], suite="tiny"),
           Prompt("p1", "beta", ids=[40, 41, 42, 43, 40, 41], suite="tiny2")]
PAIRS = [Pair("smollm2", "perturbed", "copy"), Pair("smollm2", "ngram", "perturbed")]
CFG = GenConfig(method="ar", max_new_tokens=12, budget=12, depth=4, topk=2)


def load(trio, weak, strong):
    return tiny_trio(weak or "perturbed", strong or "copy")


def rows(out):
    return {d.name: [(r["prompt_id"], r["method"]) for r in read_rows(d)] for d in sorted(out.iterdir()) if d.is_dir()}


def test_pairs_resume_after_a_kill_and_table(tmp_path):
    done = []

    def kill_after_7(d, total, row):
        done.append(row)
        if len(done) == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_pairs(PAIRS, PROMPTS, CFG, tmp_path, load, progress=kill_after_7, warmup=False)
    before = rows(tmp_path)
    assert sum(len(v) for v in before.values()) == 7
    table = run_pairs(PAIRS, PROMPTS, CFG, tmp_path, load, warmup=False)
    after = rows(tmp_path)
    for name, kept in before.items():
        assert after[name][:len(kept)] == kept          # finished rows untouched, in order
    assert sorted(after) == sorted([PAIRS[0].slug, PAIRS[1].slug])
    for p in PAIRS:
        assert sorted(after[p.slug]) == sorted((q.id, m) for q in PROMPTS for m in METHODS)
    per_set = table[table["set"].isin(["tiny", "tiny2"])]
    assert list(per_set["pair"]) == [p.label for p in PAIRS for _ in range(2)] and per_set["outputs = ar"].all()
    assert (table["tau tree-strong"] >= 1).all()
    ratio = per_set["treegraft:always / best endpoint"]
    best = per_set[["tau tree-weak", "tau tree-strong"]].max(axis=1)
    assert (ratio - per_set["tau treegraft:always"] / best).abs().max() < 1e-9
    assert "| pair | set |" in markdown(table)
    # Per pair: the mean of its sets, then its prompts pooled (tokens over forwards, one better endpoint).
    assert list(table["set"]) == ["tiny", "tiny2", "mean", "pooled"] * 2
    for p in PAIRS:
        res = finish(tmp_path / p.slug)
        pooled = table[(table["pair"] == p.label) & (table["set"] == "pooled")].iloc[0]
        tau = {m: g["new_tokens"].sum() / g["target_forwards"].sum() for m, g in res.groupby("method")}
        assert pooled["prompts"] == 2 and pooled["tau treegraft:always"] == pytest.approx(tau["treegraft:always"])
        best = max(tau["tree-weak"], tau["tree-strong"])
        assert pooled["treegraft:always / best endpoint"] == pytest.approx(tau["treegraft:always"] / best)


def test_pair_specs_are_checked():
    assert parse_pairs("qwen-coder/ngram+qwen-0.5b, smollm2/weak+strong") == [
        Pair("qwen-coder", "ngram", "qwen-0.5b"), Pair("smollm2", "weak", "strong")]
    for bad, msg in [("qwen-coder/ngram", "TARGET/WEAK"), ("llama/weak+strong", "unknown trio"),
                     ("smollm2/weak+strong,smollm2/weak+strong", "twice"), ("", "empty")]:
        with pytest.raises(ConfigError, match=msg):
            parse_pairs(bad)

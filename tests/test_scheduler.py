"""The value system, the distilled scheduler, and the policies' guarantees."""

import json

import pytest
import torch

from tiny import ids, tiny_trio
from treegraft.engine import Engine, GenConfig
from treegraft.schedule import DEFAULT_SCHEDULER, FEATURES, LearnedPolicy, scheduler_for
from treegraft.scheduler_train import train
from treegraft.models import save_json


def oracle_rows(prompts, n=24):
    trio = tiny_trio("random", "perturbed")
    rows = []
    for k, prompt in enumerate(prompts):
        engine = Engine(trio, GenConfig(method="treegraft", policy="oracle", max_new_tokens=n, budget=12, depth=4,
                                        topk=3, record_stages=False))
        for rec in engine.generate(prompt):
            o = rec.decision["oracle"]
            rows.append({"prompt_id": f"p{k}", "features": rec.decision["features"], **o})
    return rows


@pytest.fixture(scope="module")
def rows():
    return oracle_rows([[5, 17, 33, 2, 9], [1, 2, 3], [40, 41, 42, 43], [77, 3], [9, 9, 8], [60, 61], [11, 30, 12]])


def test_oracle_rows_are_consistent(rows):
    for r in rows:
        assert r["a0"] >= 1 and r["a1"] >= 1 and r["c0"] > 0 and r["c1"] > 0
        assert r["delta"] == pytest.approx(r["a1"] / r["c1"] - r["a0"] / r["c0"])
        assert set(FEATURES) <= set(r["features"])
        assert r["strong_forwards"] >= 1 and r["extra_s"] >= 0


def test_train_writes_an_artifact_that_reproduces_its_predictions(rows, tmp_path):
    art, report = train(rows, holdout=0.3)
    save_json(tmp_path / "s.json", art)
    policy = LearnedPolicy.load(tmp_path / "s.json")
    assert art["test_vectors"]
    for tv in art["test_vectors"]:
        assert policy.prob(tv["features"]) == pytest.approx(tv["prob"], abs=1e-12)
    r = art["report"]
    sim = r["sim_tokens_per_s_heldout"]
    # The threshold is tuned on held-out throughput: never worse than the better fixed policy there.
    assert sim["learned"] >= max(sim["never"], sim["always"]) - 1e-9
    assert sim["oracle"] >= sim["learned"] - 1e-9
    assert "agreement with the oracle" in report


@pytest.mark.parametrize("trio", ["smollm2", "qwen-coder"])
def test_shipped_scheduler_reproduces_recorded_predictions(trio):
    path = scheduler_for(trio)
    if not path.exists():
        pytest.skip("no shipped scheduler yet")
    assert trio == "smollm2" or path != DEFAULT_SCHEDULER  # each shipped pair has its own
    art = json.loads(path.read_text())
    policy = LearnedPolicy.load(path)
    assert len(art["test_vectors"]) >= 4
    for tv in art["test_vectors"]:
        assert policy.prob(tv["features"]) == pytest.approx(tv["prob"], abs=1e-12)
        d = policy.decide(tv["features"], 0)
        assert d.call == (tv["prob"] > art["threshold"]) and d.reason and d.threshold == art["threshold"]


class Watching:
    """Wraps a policy and checks that no model runs while it decides."""

    def __init__(self, inner, engine_ref):
        self.inner, self.engine_ref, self.calls = inner, engine_ref, 0

    def decide(self, feats, step):
        e = self.engine_ref[0]
        before = [r.forwards for r in (e.target, e.weak, e.strong)]
        d = self.inner.decide(feats, step)
        assert [r.forwards for r in (e.target, e.weak, e.strong)] == before
        self.calls += 1
        return d


@pytest.mark.parametrize("policy", ["never", "always", "every-k", "learned"])
def test_every_policy_is_lossless_and_decisions_cost_no_forward(rows, tmp_path, policy):
    from treegraft.schedule import make_policy
    art, _ = train(rows, holdout=0.3)
    save_json(tmp_path / "s.json", art)
    trio = tiny_trio("random", "perturbed")
    prompt = [5, 17, 33, 2, 9]
    ref = trio.target.generate(ids(prompt), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    ref_engine = [None]
    watcher = Watching(make_policy(policy, 2, str(tmp_path / "s.json")), ref_engine)
    engine = Engine(trio, GenConfig(method="treegraft", max_new_tokens=30, budget=12, depth=4, topk=3), policy=watcher)
    ref_engine[0] = engine
    records = list(engine.generate(prompt))
    assert engine.new_tokens == ref
    assert watcher.calls == len(records)
    for rec in records:
        assert rec.decision["policy"] == policy and rec.decision["reason"]
        assert rec.strong_called == rec.decision["call"]
        assert (rec.forwards["strong"] > 0) == rec.strong_called
        if policy == "learned":
            assert rec.decision["score"] is not None and rec.decision["threshold"] is not None


def test_compare_runs_through_the_bench_runner(tmp_path):
    from treegraft.bench import Prompt, run_bench
    from treegraft.scheduler_train import compare_table
    trio = tiny_trio("random", "perturbed")
    prompts = [Prompt("p0", "x", ids=[5, 17, 33, 2, 9]), Prompt("p1", "x", ids=[1, 2, 3])]
    cfg = GenConfig(method="treegraft", max_new_tokens=12, budget=12, depth=4, topk=3)
    df = run_bench(trio, prompts, "treegraft:never,treegraft:oracle,treegraft:always[graft_g=0,blend=0.5]", cfg, tmp_path,
                   warmup=False)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in compare_table(df).splitlines()[2:]]
    assert [r[0] for r in rows] == ["treegraft:never", "treegraft:oracle", "treegraft:always[graft_g=0,blend=0.5]"]
    never, oracle, always = ({"tau": float(r[1]), "tps": float(r[2]), "net": float(r[3]), "calls": float(r[4])}
                             for r in rows)
    assert never["calls"] == 0 and always["calls"] == 1 and never["net"] == pytest.approx(never["tps"], rel=1e-2)
    assert oracle["net"] >= oracle["tps"]  # net of the second branch the oracle paid for
    assert (df.groupby("prompt_id")["output_sha1"].nunique() == 1).all()  # every method: the same tokens


def test_features_are_the_scheduler_inputs_in_order():
    from treegraft.schedule import History, features
    from treegraft.tree import DraftTree
    assert tuple(features(DraftTree(), History(), depth=6)) == FEATURES

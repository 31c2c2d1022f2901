"""The value system, the distilled scheduler, and the policies' guarantees."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny import DEVICE, ids, tiny_trio
from treegraft.engine import ConfigError, Engine, GenConfig
from treegraft.schedule import (COSTS, DEFAULT_SCHEDULER, FEATURES, POOL_FEATURES, GainPolicy, History, Trees,
                                load_learned, scheduler_for)
from treegraft.scheduler_train import EXPLORE, KAPPAS, arm_label, train
from treegraft.models import save_json


def oracle_rows(prompts, n=24):
    trio = tiny_trio("random", "perturbed")
    rows = []
    for k, prompt in enumerate(prompts):
        engine = Engine(trio, GenConfig(method="treegraft", policy="oracle", max_new_tokens=n, budget=12, depth=4,
                                        topk=3, record_stages=False))
        for rec in engine.generate(prompt):
            o = rec.decision["oracle"]
            rows.append({"prompt_id": f"p{k}", "step": rec.step, "features": rec.decision["features"], **o})
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


def test_the_oracle_net_keeps_what_every_policy_pays():
    """The oracle's extra seconds are only its own: the unkept branch, the rewinds, the reading of
    the kept branch's forward that chose it. What remains of a step is the kept branch, its forward
    timed a second time, plus what every policy pays: the schedule, the commit and, for a feature
    drafter, the target's prompt prefill."""
    trio = tiny_trio("random", "perturbed")
    engine = Engine(trio, GenConfig(method="treegraft", policy="oracle", max_new_tokens=24, budget=12, depth=4,
                                    topk=3, record_stages=False))
    kept = set()
    for rec in engine.generate([5, 17, 33, 2, 9]):
        o = rec.decision["oracle"]
        shared = sum(rec.times.get(k, 0.0) for k in ("schedule", "overhead", "prefill"))
        assert rec.wall_s - o["extra_s"] == pytest.approx(o["kept_s"] + shared, abs=1e-9)
        # what is charged is the kept branch with a second reading of its forward, not the one that chose
        chose = o["verify1_s"] if o["call"] else o["verify0_s"]
        assert o["kept_s"] == pytest.approx((o["c1"] if o["call"] else o["c0"]) - chose + o["kept_verify_s"], abs=1e-9)
        assert o["kept_verify_s"] > 0 and o["kept_verify_s"] != chose
        assert rec.times["overhead"] > 0 and o["extra_s"] > chose
        kept.add(o["call"])
    assert kept == {True, False}  # both kinds of step were checked


def test_the_oracle_owes_the_strong_prefill_it_skipped_at_step_0():
    """A policy that first calls at step k pays the strong drafter's prompt prefill there; the oracle
    paid it in step 0's unkept branch, so its extra seconds give it back, once, and only then."""
    from treegraft.record import StepRecord, first_call_excess, oracle_extra_s

    def gen(calls, first_cost=1.0):
        recs = []
        for k, call in enumerate(calls):
            o = {"c0": 0.5, "c1": 0.5 + (first_cost if k == 0 else 0.1), "call": call, "extra_s": 2.0}
            recs.append(StepRecord(k, "treegraft", 0, k, decision={"oracle": o}))
        return recs

    assert first_call_excess([(0, 1.0), (1, 0.1), (2, 0.3), (3, 0.2)]) == pytest.approx(0.8)
    assert first_call_excess([(1, 0.1)]) == 0.0
    assert oracle_extra_s(gen([False, False, True, False])) == pytest.approx(8.0 - 0.9)
    assert oracle_extra_s(gen([False, False, False])) == pytest.approx(6.0)  # never called: owes nothing
    assert oracle_extra_s(gen([True, False, True])) == pytest.approx(6.0)    # kept step 0: paid there
    assert oracle_extra_s(gen([False, True], first_cost=9.0)) == pytest.approx(2.0)  # at most step 0's extra


def test_train_writes_an_artifact_that_reproduces_its_predictions(rows, tmp_path):
    art, report = train(rows, holdout=0.3)
    save_json(tmp_path / "s.json", art)
    policy = load_learned(tmp_path / "s.json")
    assert isinstance(policy, GainPolicy) and art["kind"] == "gain"
    assert art["test_vectors"]
    for tv in art["test_vectors"]:
        # The exported trees give scikit-learn's own a0, and the file its recorded scores.
        assert policy.a0.predict([tv["features"][f] for f in policy.features]) == pytest.approx(tv["a0"], abs=1e-9)
        assert policy.prob(tv["features"]) == pytest.approx(tv["prob"], abs=1e-12)
    assert art["kappa"] in KAPPAS and art["explore"] in EXPLORE and art["strong_units"] >= 0
    sim = art["report"]["sim_tokens_per_s_heldout"]
    assert set(sim) == {"never", "always", "learned", "hindsight"}
    assert sim["hindsight"] >= max(sim.values()) - 1e-9  # the pooled optimum bounds every policy
    assert "mean abs. error of a0" in report


def test_replay_follows_the_policys_own_state(rows):
    """Replaying oracle steps: never and always reproduce the fixed branches, and a policy that
    calls only on a schedule (kappa out of reach, explore=2) calls every third step."""
    from treegraft.scheduler_train import fit_cost_model, replay, throughput
    cm = fit_cost_model(rows)
    a0 = np.array([r["a0"] for r in rows], float)
    tps, calls = replay(rows, a0, cm, kappa=1e9, explore=1000, prior_gain=1.0, strong_units=1.0)
    assert not calls.any() and tps == pytest.approx(throughput(rows, calls, cm))
    tps, calls = replay(rows, a0, cm, kappa=-1.0, explore=1000, prior_gain=1.0, strong_units=1.0)
    assert calls.all() and tps == pytest.approx(throughput(rows, calls, cm))
    _, calls = replay(rows, a0, cm, kappa=1e9, explore=2, prior_gain=1.0, strong_units=1.0)
    first = [c for r, c in zip(rows, calls) if r["prompt_id"] == rows[0]["prompt_id"]]
    assert first[:6] == [False, False, True, False, False, True]


def test_a_first_call_pays_the_strong_prefill_once(rows):
    """The oracle runs both branches every step, so only a prompt's first step holds the strong
    drafter's prefill; a replayed generation pays it at its first call, wherever that comes, once."""
    from treegraft.scheduler_train import fit_cost_model, hindsight, one_time_costs, replay, throughput
    cm = fit_cost_model(rows)
    pre = one_time_costs(rows)
    assert set(pre) == {r["prompt_id"] for r in rows} and all(v >= 0 for v in pre.values())
    pre = {p: 1.0 for p in pre}  # a clear one-time cost per prompt
    a0 = np.array([r["a0"] for r in rows], float)
    always = replay(rows, a0, cm, kappa=-1.0, explore=1000, prior_gain=1.0, strong_units=1.0, pre=pre)[0]
    assert always == pytest.approx(throughput(rows, np.ones(len(rows), bool), cm, pre))
    assert always < throughput(rows, np.ones(len(rows), bool), cm)
    late = replay(rows, a0, cm, kappa=1e9, explore=2, prior_gain=1.0, strong_units=1.0, pre=pre)
    free = replay(rows, a0, cm, kappa=1e9, explore=2, prior_gain=1.0, strong_units=1.0)
    assert (late[1] == free[1]).all() and late[0] < free[0]  # same calls (from step 2), the prefill on top
    best = hindsight(rows, cm, pre)
    for k in (-1.0, 1.0, 1e9):
        assert throughput(rows, best, cm, pre) >= replay(rows, a0, cm, k, 1000, 1.0, 1.0, pre=pre)[0] - 1e-9


def test_every_replayed_policy_pays_the_targets_prompt_prefill(rows):
    """A generation's seconds hold the target's prompt prefill, whatever the policy: step 0's plain
    verification beyond the modelled one, plus a feature drafter's separate prefill phase. The
    replay and every rate charge it once per prompt, calling or not."""
    from treegraft.scheduler_train import (Branches, fit_cost_model, replay, target_prefill, throughput,
                                           verify_cost)
    cm = fit_cost_model(rows)
    rows = [dict(r, verify0_s=verify_cost(cm, r["n0"]) + 1.0, prefill_s=0.5) if r["step"] == 0 else r for r in rows]
    prompts = {r["prompt_id"] for r in rows}
    assert target_prefill(rows, cm) == pytest.approx({p: 1.5 for p in prompts})
    b, never = Branches(rows, cm), np.zeros(len(rows), bool)
    assert b.rate(never) == pytest.approx(b.a0.sum() / (b.c[:, 0].sum() + 1.5 * len(prompts)))
    a0 = np.array([r["a0"] for r in rows], float)
    for kappa in (1e9, -1.0):  # never and always, replayed step by step
        tps, calls = replay(rows, a0, cm, kappa, 1000, 1.0, 1.0)
        assert tps == pytest.approx(throughput(rows, calls, cm))


def test_hindsight_per_prompt_lies_between_the_fixed_policies_and_per_step_hindsight(rows):
    """Choosing each prompt's better fixed policy in hindsight calls at all of a prompt's steps or at
    none, beats both fixed policies, and is bounded by the per-step optimum."""
    from treegraft.scheduler_train import fit_cost_model, hindsight, hindsight_per_prompt, one_time_costs, throughput
    cm = fit_cost_model(rows)
    for pre in (None, one_time_costs(rows), {r["prompt_id"]: 1.0 for r in rows}):
        calls = hindsight_per_prompt(rows, cm, pre)
        for p in {r["prompt_id"] for r in rows}:
            assert len({bool(c) for r, c in zip(rows, calls) if r["prompt_id"] == p}) == 1
        tps = throughput(rows, calls, cm, pre)
        fixed = max(throughput(rows, np.full(len(rows), c), cm, pre) for c in (False, True))
        assert fixed - 1e-9 <= tps <= throughput(rows, hindsight(rows, cm, pre), cm, pre) + 1e-9
    # A prompt whose calls add nothing does not call; one whose calls double its tokens for free does.
    two = [dict(r, prompt_id="dear", a1=r["a0"]) for r in rows[:6]] + \
          [dict(r, prompt_id="cheap", a1=2 * r["a0"], strong_forwards=0, n1=r["n0"]) for r in rows[:6]]
    calls = hindsight_per_prompt(two, fit_cost_model(two))
    assert not calls[:6].any() and calls[6:].all()


def test_the_first_design_still_trains_and_loads(rows, tmp_path):
    art, report = train(rows, holdout=0.3, kind="logistic")
    save_json(tmp_path / "s.json", art)
    policy = load_learned(tmp_path / "s.json")
    for tv in art["test_vectors"]:
        assert policy.prob(tv["features"]) == pytest.approx(tv["prob"], abs=1e-12)
    sim = art["report"]["sim_tokens_per_s_heldout"]
    assert sim["learned"] >= max(sim["never"], sim["always"]) - 1e-9  # its threshold is tuned there
    with pytest.raises(ValueError, match="unknown scheduler kind"):
        train(rows, kind="forest")


def test_old_steps_without_the_new_features_are_refused(rows):
    old = [dict(r, features={k: v for k, v in r["features"].items() if k in FEATURES[:8]}) for r in rows]
    assert set(POOL_FEATURES) - set(FEATURES[:8])
    with pytest.raises(ValueError, match="collect them again"):
        train(old)


def test_the_gain_scheduler_weighs_this_devices_costs():
    """The same file calls where the strong drafter's recent calls added more than their seconds
    would buy at this generation's pace, not where it is dear, and uses its priors until it has seen
    a call."""
    policy = GainPolicy(POOL_FEATURES, Trees(1.0, 1.0, []), kappa=1.0, explore=1000, prior_gain=2.0,
                        strong_units=1.0)
    feats = dict.fromkeys(FEATURES, 0.0) | {"weak_n": 0, "c0_s": 0.5, "t1_s": 0.5, "strong_s": 0.0,
                                            "recent_gain": 0.0, "calls_seen": 0, "rate_so_far": 0.0}
    # Before any call: a call adds 2 tokens (prior) and costs 1 forward of 0.5 s; pace 1 token / 0.5 s.
    assert policy.prob(feats) == pytest.approx(2.0 / (2.0 * 0.5)) and policy.decide(feats, 0).call
    seen = dict(feats, calls_seen=2, recent_gain=1.0, rate_so_far=4.0)
    cheap, dear = dict(seen, strong_s=0.2), dict(seen, strong_s=0.5)
    assert policy.prob(cheap) == pytest.approx(1.0 / (4.0 * 0.2)) and policy.decide(cheap, 0).call
    assert not policy.decide(dear, 0).call and "would buy" in policy.decide(dear, 0).reason
    assert policy.decide(dear, 0).expected == 1.0
    # A generation's first call also carries its share of the strong prefill (4 forwards of 0.5 s),
    # spread over the calls the 12 tokens left would take at a0 + gain = 3 tokens a call.
    first = GainPolicy(POOL_FEATURES, Trees(1.0, 1.0, []), kappa=1.0, explore=1000, prior_gain=2.0,
                       strong_units=1.0, first_units=4.0)
    fresh = dict(feats, tokens_left=12)
    assert first.terms(fresh)[3] == pytest.approx(0.5 + 4 * 0.5 / 4)
    assert not first.decide(fresh, 0).call and "prefill" in first.decide(fresh, 0).reason
    assert first.terms(dict(fresh, tokens_left=2))[3] == pytest.approx(0.5 + 4 * 0.5)  # one call left: all of it
    assert first.terms(dict(seen, strong_s=0.5, tokens_left=12))[3] == pytest.approx(0.5)  # paid already
    looked = GainPolicy(POOL_FEATURES, Trees(1.0, 1.0, []), kappa=1.0, explore=3, prior_gain=2.0, strong_units=1.0)
    assert looked.decide(dict(dear, steps_since_call=math.log1p(3)), 0).call  # time to look again
    assert not looked.decide(dict(dear, steps_since_call=math.log1p(2)), 0).call


def test_the_scheduler_is_chosen_per_pair(tmp_path, monkeypatch):
    import treegraft.schedule as sched
    monkeypatch.setattr(sched, "ASSETS", tmp_path)
    own = tmp_path / "scheduler" / "qwen-coder" / "ngram+qwen-coder-0.5b" / "scheduler.json"
    own.parent.mkdir(parents=True)
    own.write_text("{}")
    assert sched.scheduler_for("qwen-coder", "ngram+qwen-coder-0.5b") == own
    assert sched.scheduler_for("qwen-coder", "qwen-coder-weak+qwen-coder-0.5b") == DEFAULT_SCHEDULER
    assert sched.scheduler_for("custom", "ngram+qwen-coder-0.5b") == DEFAULT_SCHEDULER


def test_drafter_keys_name_pairs():
    from treegraft.models import drafter_key
    assert drafter_key("default", "weak") == "weak" and drafter_key("asset:qwen-coder-weak", "weak") == "qwen-coder-weak"
    assert drafter_key("ngram", "weak") == "ngram" and drafter_key("qwen-coder-0.5b", "strong") == "qwen-coder-0.5b"
    assert drafter_key("/some/where/my-drafter", "strong") == "my-drafter"


SHIPPED = [(t, p) for t, ps in {"smollm2": ["weak+strong", "ngram+strong", "ngram+weak", "weak+ngram"],
                                 "qwen-coder": ["ngram+qwen-coder-0.5b", "qwen-coder-weak+qwen-coder-0.5b",
                                                "ngram+qwen-coder-weak"]}.items() for p in ps]


@pytest.mark.parametrize("trio,pair", SHIPPED)
def test_shipped_scheduler_reproduces_recorded_predictions(trio, pair):
    path = scheduler_for(trio, pair)
    assert path.exists()
    assert trio == "smollm2" or path != DEFAULT_SCHEDULER  # each shipped pair has its own
    art = json.loads(path.read_text())
    policy = load_learned(path)
    if "arm" in art:  # the arm chosen on validation prompts is the fastest there (pooled over runs where
        # it was chosen so), and the one played
        rates = art["arm"].get("pooled", art["arm"]["rates"])
        knobs = {k: art["arm"][k] for k in ("sure", "unsure") if k in art["arm"]}
        assert policy.arm == art["arm"]["arm"] and arm_label(policy.arm, knobs) == max(rates, key=rates.get)
        assert policy.first == (policy.arm in ("solo", "strong-first"))
        assert policy.unsure == art["arm"].get("unsure", 2.0) and policy.sure == art["arm"].get("sure", 3.0)
        policy = policy.gain
    assert len(art["test_vectors"]) >= 4
    for tv in art["test_vectors"]:
        assert policy.prob(tv["features"]) == pytest.approx(tv["prob"], abs=1e-12)
        d = policy.decide(tv["features"], 0)
        due = art.get("kind") == "gain" and tv["features"]["steps_since_call"] >= math.log1p(art["explore"])
        assert d.call == (tv["prob"] > art["threshold"] or due) and d.reason and d.threshold == art["threshold"]


def test_the_engine_measures_what_strong_calls_cost_and_bought():
    trio = tiny_trio("random", "perturbed")
    engine = Engine(trio, GenConfig(method="treegraft", policy="always", max_new_tokens=20, budget=12, depth=4,
                                    topk=3, auto_budget=True))
    records = list(engine.generate([5, 17, 33, 2, 9]))
    h = engine.history
    assert len(h.strong_tokens) == len(records) == len(h.strong_extra_s) + 1  # the first call holds a prefill
    for rec, made in zip(records, h.strong_tokens):
        assert made == sum(n["origin"] in ("graft", "recovered") for n in rec.nodes if n["accepted"])
    assert len(h.gains) == len(records) and h.tokens == len(engine.new_tokens) - len(records[0].new_tokens)
    for rec, gain in zip(records, h.gains):
        assert gain == pytest.approx(len(rec.accepted) + 1 - rec.decision["features"]["weak_expected"])
    later = records[-1].decision["features"]
    assert later["c0_s"] > 0 and later["t1_s"] > 0 and later["strong_s"] == pytest.approx(
        sum(h.strong_extra_s[-5:-1]) / 4)


class Watching:
    """Wraps a policy and checks that no model runs while it decides."""

    def __init__(self, inner, engine_ref):
        self.inner, self.engine_ref, self.calls = inner, engine_ref, 0
        self.first = inner.first

    def watch(self, rule, feats, step):
        e = self.engine_ref[0]
        before = [r.forwards for r in (e.target, e.weak, e.strong)]
        d = rule(feats, step)
        assert [r.forwards for r in (e.target, e.weak, e.strong)] == before
        return d

    def alone(self, feats, step):
        d = self.watch(self.inner.alone, feats, step)
        self.calls += d is not None
        return d

    def decide(self, feats, step):
        self.calls += 1
        return self.watch(self.inner.decide, feats, step)


@pytest.mark.parametrize("policy", ["never", "always", "every-k", "when-empty", "when-unsure", "when-matched",
                                    "strong-first", "learned"])
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
        alone = "drafts the step alone" in rec.decision["reason"]  # strong-first's tree-strong steps
        assert rec.strong_called == (rec.decision["call"] or alone)
        assert (rec.forwards["weak"] > 0) == (not alone)
        if policy != "strong-first":  # which drafts strong first, even where its tree is then dropped
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


@pytest.mark.parametrize("policy", ["always", "oracle"])
def test_the_targets_own_sureness_at_the_last_step_is_the_next_decisions_feature(policy):
    """target_top1 / target_sure: the target's top-1 probability at the last step's bonus row and its mean
    along the accepted path, read off the verification; checked against a plain forward of the target
    over the text so far (the oracle's must be its kept branch's)."""
    trio = tiny_trio("random", "perturbed")
    prompt = [5, 17, 33, 2, 9]
    engine = Engine(trio, GenConfig(method="treegraft", policy=policy, max_new_tokens=16, budget=8, depth=4, topk=3))
    records = list(engine.generate(prompt))
    assert records[0].decision["features"]["target_top1"] == 0.0  # nothing verified yet
    with torch.no_grad():
        top1 = torch.softmax(trio.target(ids(prompt + engine.new_tokens)).logits[0].float(), -1).amax(-1)
    before = len(prompt) - 1  # the row that predicts the step's first new token
    for rec, nxt in zip(records, records[1:]):
        rows = top1[before:before + len(rec.new_tokens)].tolist()
        feats = nxt.decision["features"]
        assert feats["target_top1"] == pytest.approx(rows[-1], abs=1e-4)
        assert feats["target_sure"] == pytest.approx(sum(rows) / len(rows), abs=1e-4)
        assert 0 < feats["target_top1"] <= 1
        before += len(rec.new_tokens)
    assert any(len(r.new_tokens) > 1 for r in records[:-1])  # paths longer than the bonus were checked
    ar = Engine(trio, GenConfig(method="ar", max_new_tokens=4))
    list(ar.generate(prompt))
    assert ar.history.target_conf == []  # only treegraft's scheduler reads it, so only treegraft pays


def test_features_are_the_scheduler_inputs_in_order():
    from treegraft.schedule import features
    from treegraft.tree import DraftTree
    assert tuple(features(DraftTree(), History(), depth=6)) == FEATURES + COSTS
    from treegraft.viz import FEATURE_UNITS
    assert set(FEATURES + COSTS) <= set(FEATURE_UNITS)  # the app labels every panel with its unit


@pytest.mark.parametrize("arm", ["solo", "never", "always", "when-empty", "when-unsure", "when-matched",
                                 "strong-first"])
def test_a_chosen_arm_plays_that_method_losslessly(rows, tmp_path, arm):
    """`scheduler choose` may pick a fixed arm for a pair; `solo` steps are tree-strong steps (the same
    trees, the weak drafter never runs), never/always the fixed policies, and output stays greedy."""
    art, _ = train(rows, holdout=0.3)
    save_json(tmp_path / "s.json", art | {"arm": {"arm": arm, "rates": {"gain": 1.0, arm: 2.0}, "prompts": 1}})
    trio = tiny_trio("random", "perturbed")
    prompt = [5, 17, 33, 2, 9]
    cfg = dict(max_new_tokens=30, budget=12, depth=4, topk=3)
    same = {"solo": "tree-strong"}.get(arm, "treegraft")
    ref = Engine(trio, GenConfig(method=same, policy=arm if arm != "solo" else "always", **cfg))
    ref_records = list(ref.generate(prompt))
    engine = Engine(trio, GenConfig(method="treegraft", policy="learned", scheduler_path=str(tmp_path / "s.json"), **cfg))
    records = list(engine.generate(prompt))
    assert engine.new_tokens == ref.new_tokens == trio.target.generate(
        ids(prompt), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    assert [r.accepted for r in records] == [r.accepted for r in ref_records]  # the same trees, step by step
    for rec in records:
        assert f"arm '{arm}'" in rec.decision["reason"]
        alone = arm == "solo" or "drafts the step alone" in rec.decision["reason"]
        assert (rec.forwards["weak"] > 0) == (not alone)
        if arm == "strong-first":
            assert rec.strong_called == (alone or rec.decision["call"]) and rec.forwards["strong"] > 0
        else:
            assert rec.strong_called == (rec.forwards["strong"] > 0)
        if arm not in ("when-empty", "when-unsure", "strong-first"):
            assert rec.strong_called == (arm != "never")
    if arm != "solo":  # a tree-strong step records no call
        assert [r.strong_called for r in records] == [r.strong_called for r in ref_records]


def test_when_empty_calls_exactly_where_the_weak_tree_sends_nothing():
    """Prompt lookup as the weak drafter: no match, no weak node, a strong call; a match, no call."""
    trio = tiny_trio("ngram", "perturbed")
    prompt = [5, 17, 33, 2, 9, 5, 17, 33, 2, 9, 40, 41]
    ref = trio.target.generate(ids(prompt), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    engine = Engine(trio, GenConfig(method="treegraft", policy="when-empty", max_new_tokens=30, budget=12, depth=4,
                                    topk=3))
    records = list(engine.generate(prompt))
    assert engine.new_tokens == ref
    calls = [r.decision["call"] for r in records]
    assert calls == [r.decision["features"]["weak_n"] == 0 for r in records] == [r.strong_called for r in records]
    assert any(calls) and not all(calls)  # both kinds of step happen here


@pytest.mark.parametrize("below", [1.0, 2.0, 64.0])
def test_when_unsure_calls_where_the_weak_tree_expects_fewer_tokens_than_its_threshold(below):
    """At 1 token it never calls (an empty tree expects exactly 1), at 64 always; in between, exactly
    where the weak tree's expectation is under the threshold, and output stays greedy."""
    trio = tiny_trio("ngram", "perturbed")
    prompt = [5, 17, 33, 2, 9, 5, 17, 33, 2, 9, 40, 41]
    ref = trio.target.generate(ids(prompt), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    engine = Engine(trio, GenConfig(method="treegraft", policy="when-unsure", unsure=below, max_new_tokens=30,
                                    budget=12, depth=4, topk=3))
    records = list(engine.generate(prompt))
    assert engine.new_tokens == ref
    calls = [r.decision["call"] for r in records]
    assert calls == [r.decision["features"]["weak_expected"] < below for r in records] == [r.strong_called for r in records]
    assert {1.0: not any(calls), 64.0: all(calls)}.get(below, any(calls) and not all(calls))
    with pytest.raises(ConfigError, match="unsure"):
        GenConfig(unsure=0.5).check()


def test_prompt_lookup_reads_its_root_match_without_running():
    from treegraft.kv import Runner
    from treegraft.lookup import LookupRunner, NgramDrafter
    lookup = LookupRunner(NgramDrafter(96, device=DEVICE), "strong")
    assert lookup.root_match([5, 17, 33, 2, 9]) == 0          # the last token never occurred before
    assert lookup.root_match([5, 17, 33, 2, 9, 5]) == 1       # "5" did, followed by 17
    assert lookup.root_match([5, 17, 33, 2, 9, 5, 17, 33]) == 3
    assert lookup.forwards == 0
    trio = tiny_trio("perturbed", "perturbed")
    assert Runner(trio.strong, "strong").root_match([5, 17, 5]) is None  # a model must run to know


def test_when_matched_calls_prompt_lookup_exactly_where_it_matches_at_the_root():
    """Prompt lookup as the strong drafter: a call exactly on the steps where the root's context
    matches an n-gram earlier in it (read before any strong forward), none elsewhere; output stays
    greedy. With a model as the strong drafter there is no free look: it is called every step."""
    from treegraft.lookup import propose
    trio = tiny_trio("perturbed", "ngram")
    prompt = [5, 17, 33, 2, 9, 5, 17, 33, 2, 9, 40, 41]
    ref = trio.target.generate(ids(prompt), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    cfg = dict(max_new_tokens=30, budget=12, depth=4, topk=3)
    engine = Engine(trio, GenConfig(method="treegraft", policy="when-matched", **cfg))
    records, seq = list(engine.generate(prompt)), list(prompt)
    assert engine.new_tokens == ref
    for rec in records:
        match = propose(np.asarray(seq), 4)[1]
        assert rec.decision["features"]["strong_match"] == match
        assert rec.decision["call"] == (match >= 1) == rec.strong_called == (rec.forwards["strong"] > 0)
        seq += rec.new_tokens
    calls = [r.strong_called for r in records]
    assert any(calls) and not all(calls)  # both kinds of step happen here
    model = Engine(tiny_trio("random", "perturbed"), GenConfig(method="treegraft", policy="when-matched", **cfg))
    steps = list(model.generate(prompt))
    assert all(r.strong_called and "strong_match" not in r.decision["features"] for r in steps)


@pytest.mark.parametrize("sure", [1.0, 3.0, 64.0])
def test_strong_first_verifies_the_strong_tree_alone_exactly_where_it_is_sure(sure):
    """Prompt lookup as the strong drafter, drafting first: at 1 token every step is a tree-strong step
    (a tree expects at least its bonus token), at 64 none is (the weak pool and when-unsure decide, as
    when-unsure itself would); in between both happen, each alone step's strong tree expected at least
    `sure` tokens, and output stays greedy throughout."""
    trio = tiny_trio("perturbed", "ngram")
    prompt = [5, 17, 33, 2, 9, 5, 17, 33, 2, 9, 40, 41, 5, 17, 33]
    ref = trio.target.generate(ids(prompt), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    cfg = dict(max_new_tokens=30, budget=12, depth=4, topk=3)
    engine = Engine(trio, GenConfig(method="treegraft", policy="strong-first", sure=sure, unsure=2.5, **cfg))
    records = list(engine.generate(prompt))
    assert engine.new_tokens == ref
    alone = ["drafts the step alone" in r.decision["reason"] for r in records]
    for rec, solo in zip(records, alone):
        assert (rec.forwards["weak"] == 0) == solo and rec.forwards["strong"] > 0
        if solo:
            assert rec.strong_called and rec.decision["features"]["weak_expected"] >= sure
            assert {n["origin"] for n in rec.nodes} <= {"strong"}
        else:
            assert rec.decision["call"] == (rec.decision["features"]["weak_expected"] < 2.5) == rec.strong_called
    assert {1.0: all(alone), 64.0: not any(alone)}.get(sure, any(alone) and not all(alone))
    if sure == 1.0:
        strong = Engine(trio, GenConfig(method="tree-strong", **cfg))
        assert [r.accepted for r in strong.generate(prompt)] == [r.accepted for r in records]
    if sure == 64.0:
        unsure = Engine(trio, GenConfig(method="treegraft", policy="when-unsure", unsure=2.5, **cfg))
        assert [r.accepted for r in list(unsure.generate(prompt))] == [r.accepted for r in records]
    with pytest.raises(ConfigError, match="sure"):
        GenConfig(sure=0.5).check()


def test_scheduler_figures_mark_solo_steps_apart():
    """On strong-first's solo steps the recorded pool features are the strong tree's: the Scheduler
    page's table, decision chart and feature panels say so step for step, not "skipped"."""
    from treegraft import viz
    trio = tiny_trio("perturbed", "ngram")
    prompt = [5, 17, 33, 2, 9, 5, 17, 33, 2, 9, 40, 41, 5, 17, 33]
    engine = Engine(trio, GenConfig(method="treegraft", policy="strong-first", sure=3.0, unsure=2.5,
                                    max_new_tokens=30, budget=12, depth=4, topk=3))
    records = list(engine.generate(prompt))
    kinds = [viz.step_kind(r) for r in records]
    solo = [k == "solo" for k in kinds]
    assert any(solo) and not all(solo)
    assert all(("drafts the step alone" in r.decision["reason"]) == s for r, s in zip(records, solo))
    table = viz.decisions_table(records)
    assert (table["features of"] == "strong tree alone").tolist() == solo
    decisions = viz.decision_figure(records).data[0]
    assert [y == 2 for y in decisions.y] == solo and [y == 1 for y in decisions.y] == [k == "call" for k in kinds]
    features = viz.features_figure(records)
    assert features.layout.meta["solo_steps"] == sum(solo)
    assert [m == "star" for m in features.data[0].marker.symbol] == solo
    # Every panel keeps its height however many features there are (a fraction-of-height spacing once
    # squashed six rows into a tenth of the figure).
    panels = [features.layout[k].domain for k in features.layout if k.startswith("yaxis")]
    area = features.layout.height - features.layout.margin.t - features.layout.margin.b
    assert len(panels) >= 24 and min((d[1] - d[0]) * area for d in panels) >= 100
    # Without solo steps the chart keeps its two rows and says nothing of the strong tree.
    plain = list(Engine(trio, GenConfig(method="treegraft", policy="when-unsure", unsure=2.5, max_new_tokens=30,
                                        budget=12, depth=4, topk=3)).generate(prompt))
    assert "solo" not in {viz.step_kind(r) for r in plain}
    assert viz.features_figure(plain).layout.meta["solo_steps"] == 0
    assert set(viz.decision_figure(plain).data[0].y) <= {0, 1}


def test_choose_reads_when_unsure_at_another_threshold_as_that_arm(rows, tmp_path):
    from treegraft.bench.store import append_row
    from treegraft.scheduler_train import arm_of, main
    assert arm_of("treegraft:when-unsure[unsure=1.5]") == ("when-unsure", {"unsure": 1.5})
    assert arm_of("treegraft:when-unsure") == ("when-unsure", {})
    assert arm_of("treegraft:strong-first[unsure=1.5,sure=2.5]") == ("strong-first", {"sure": 2.5, "unsure": 1.5})
    assert arm_of("treegraft:when-unsure[sure=2.5]") is None  # not when-unsure's knob
    assert arm_of("treegraft:always[budget=8]") is None   # an ablation is not an arm
    art, _ = train(rows, holdout=0.3)
    (tmp_path / "s").mkdir()
    save_json(tmp_path / "s" / "scheduler.json", art)
    run = tmp_path / "run"
    run.mkdir()
    walls = {"treegraft:when-unsure": 3.0, "treegraft:when-unsure[unsure=2.5]": 2.0, "treegraft:learned": 4.0,
             "treegraft:always[budget=8]": 1.0}
    for m, w in walls.items():
        append_row(run, {"prompt_id": "a", "suite": "x", "category": "x", "method": m, "new_tokens": 10,
                         "target_forwards": 5, "wall_s": w, "strong_calls": 2})
    assert main(["choose", "--compare", str(run), "--scheduler", str(tmp_path / "s")]) == 0
    saved = json.loads((tmp_path / "s" / "scheduler.json").read_text())["arm"]
    assert saved["arm"] == "when-unsure" and saved["unsure"] == 2.5
    assert set(saved["rates"]) == {"when-unsure", "when-unsure[unsure=2.5]", "gain"}
    report = (tmp_path / "s" / "REPORT.md").read_text()
    assert "**when-unsure[unsure=2.5]**" in report
    assert 'EXTRA_ARMS="treegraft:when-unsure[unsure=2.5]" PER_SUITE=1' in report
    policy = load_learned(tmp_path / "s" / "scheduler.json")
    assert policy.arm == "when-unsure" and policy.unsure == 2.5


def test_choose_writes_the_fastest_arm_of_a_validation_run(rows, tmp_path):
    import pandas as pd
    from treegraft.scheduler_train import choose_arm, main
    from treegraft.bench.store import COLUMNS, append_row
    art, _ = train(rows, holdout=0.3)
    (tmp_path / "s").mkdir()
    save_json(tmp_path / "s" / "scheduler.json", art)
    walls = {"tree-strong": 2.0, "treegraft:never": 3.0, "treegraft:always": 4.0, "treegraft:learned": 2.5}
    run = tmp_path / "run"
    run.mkdir()
    for p in ("a", "b"):
        for m, w in walls.items():
            append_row(run, {"prompt_id": p, "suite": "x", "category": "x", "method": m, "new_tokens": 10,
                             "target_forwards": 5, "wall_s": w, "strong_calls": 5 if m != "treegraft:never" else 0})
    assert main(["choose", "--compare", str(run), "--scheduler", str(tmp_path / "s")]) == 0
    saved = json.loads((tmp_path / "s" / "scheduler.json").read_text())["arm"]
    assert saved["arm"] == "solo" and saved["rates"]["gain"] == pytest.approx(4.0) and saved["prompts"] == 2
    report = (tmp_path / "s" / "REPORT.md").read_text()
    assert "**solo**" in report and "PER_SUITE=2 REPEATS=1 scripts/choose_arms.sh" in report
    # two prompts alike: every redraw of them ranks solo first
    assert saved["first"]["solo"] == 1.0 and sum(saved["first"].values()) == pytest.approx(1.0)
    assert "**solo** ranks first in 100% of the draws" in report and "| solo | tree-strong | 5.00 | 100% |" in report
    policy = load_learned(tmp_path / "s" / "scheduler.json")
    assert policy.arm == "solo" and policy.first and policy.gain.kappa == art["kappa"]
    assert policy.certainty == 1.0 and "first in 100% of redraws of those prompts" in policy.why()
    with pytest.raises(ValueError, match="treegraft:learned"):
        choose_arm(pd.DataFrame({c: [] for c in COLUMNS}))


def test_choose_pools_earlier_runs_of_the_same_prompts_by_relative_speed(rows, tmp_path):
    """An earlier run on a slower machine: its fixed arms count by their speed relative to its own
    fixed arms, never by raw tokens/s, and its `learned` (an older rule) not at all."""
    from treegraft.bench.store import append_row
    from treegraft.scheduler_train import main, pooled_scores
    art, _ = train(rows, holdout=0.3)
    (tmp_path / "s").mkdir()
    save_json(tmp_path / "s" / "scheduler.json", art)

    def run(name, walls, prompts=("a", "b")):
        d = tmp_path / name
        d.mkdir()
        for p in prompts:
            for m, w in walls.items():
                append_row(d, {"prompt_id": p, "suite": "x", "category": "x", "method": m, "new_tokens": 10,
                               "target_forwards": 5, "wall_s": w, "strong_calls": 2})
        return str(d)

    new = run("new", {"treegraft:never": 3.0, "treegraft:always": 2.9, "treegraft:learned": 3.5})
    old = run("old", {"treegraft:never": 4.0, "treegraft:always": 6.0, "treegraft:learned": 1.0})
    assert main(["choose", "--compare", new, "--scheduler", str(tmp_path / "s")]) == 0
    assert json.loads((tmp_path / "s" / "scheduler.json").read_text())["arm"]["arm"] == "always"
    assert main(["choose", "--compare", new, "--pool", old, "--scheduler", str(tmp_path / "s")]) == 0
    saved = json.loads((tmp_path / "s" / "scheduler.json").read_text())["arm"]
    assert saved["arm"] == "never" and saved["pool"] == [old]
    assert saved["rates"]["gain"] == pytest.approx(20 / 7.0)   # this run's, not the earlier run's
    # never: (1/3 / gm(1/3, 1/2.9) + 1/4 / gm(1/4, 1/6)) / 2; gain relative to this run only
    gm = lambda a, b: (a * b) ** 0.5
    assert saved["pooled"]["never"] == pytest.approx((1 / 3 / gm(1 / 3, 1 / 2.9) + 1 / 4 / gm(1 / 4, 1 / 6)) / 2)
    assert saved["pooled"]["gain"] == pytest.approx(1 / 3.5 / gm(1 / 3, 1 / 2.9))
    report = (tmp_path / "s" / "REPORT.md").read_text()
    assert "**never**" in report and f"--pool {old}" in report and "relative speed, pooled" in report
    policy = load_learned(tmp_path / "s" / "scheduler.json")
    assert policy.arm == "never" and "over several runs" in policy.why() and "never 1.10" in policy.why()
    # --archive copies the runs beside the scheduler's record and points at the copies
    kept = tmp_path / "docs" / "arm"
    assert main(["choose", "--compare", new, "--pool", old, "--scheduler", str(tmp_path / "s"),
                 "--archive", str(kept)]) == 0
    saved = json.loads((tmp_path / "s" / "scheduler.json").read_text())["arm"]
    assert saved["source"] == str(kept) and saved["pool"] == [str(kept / "pool1")]
    assert (kept / "results.csv").read_text() == (Path(new) / "results.csv").read_text()
    assert (kept / "pool1" / "results.csv").read_text() == (Path(old) / "results.csv").read_text()
    assert f"`{kept}`" in (tmp_path / "s" / "REPORT.md").read_text()
    # choosing again from the archived copy, archived to the same place, keeps it (it was a SameFileError)
    assert main(["choose", "--compare", str(kept), "--scheduler", str(tmp_path / "s"), "--archive", str(kept)]) == 0
    assert (kept / "results.csv").read_text() == (Path(new) / "results.csv").read_text()
    other = run("other", {"treegraft:never": 3.0, "treegraft:always": 2.0}, prompts=("a", "c"))
    assert main(["choose", "--compare", new, "--pool", other, "--scheduler", str(tmp_path / "s")]) == 2
    with pytest.raises(ValueError, match="share no fixed arm"):
        pooled_scores({"never": 1.0, "gain": 2.0}, [{"always": 1.0}])


def trained_scheduler(rows, tmp_path):
    """A gain scheduler trained on the rows in tmp_path/s, and a maker of validation runs beside it."""
    art, _ = train(rows, holdout=0.3)
    (tmp_path / "s").mkdir()
    save_json(tmp_path / "s" / "scheduler.json", art)
    return lambda name, walls, config: validation_run(tmp_path / name, walls, config)


def validation_run(d, walls: dict, config: dict) -> str:
    """A one-prompt `scheduler compare` run on disk: each method's wall seconds for 10 tokens."""
    from treegraft.bench.store import append_row
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    for m, w in walls.items():
        append_row(d, {"prompt_id": "a", "suite": "x", "category": "x", "method": m, "new_tokens": 10,
                       "target_forwards": 5, "wall_s": w, "strong_calls": 2})
    return str(d)


def test_an_int8_validation_run_chooses_its_own_arm_beside_the_fp32_one(rows, tmp_path):
    """A strong drafter in int8 costs less, so another arm may win: its run writes arm_int8, never the
    fp32 arm, and only a trio whose strong drafter runs in int8 plays it."""
    from treegraft.scheduler_train import ARM_HEADING, arm_heading, main
    run = trained_scheduler(rows, tmp_path)

    fp32 = run("fp32", {"treegraft:never": 2.0, "treegraft:always": 3.0, "treegraft:learned": 4.0},
               {"models": {"weak": "ngram", "strong": "Qwen 0.5B"}})
    # an older run records int8 only in its drafter's label
    int8 = run("int8", {"treegraft:never": 3.0, "treegraft:always": 2.0, "treegraft:learned": 4.0},
               {"models": {"weak": "ngram", "strong": "Qwen 0.5B (int8)"}})
    assert main(["choose", "--compare", fp32, "--scheduler", str(tmp_path / "s")]) == 0
    assert main(["choose", "--compare", int8, "--scheduler", str(tmp_path / "s")]) == 0
    saved = json.loads((tmp_path / "s" / "scheduler.json").read_text())
    assert saved["arm"]["arm"] == "never" and saved["arm_int8"]["strong"]["arm"] == "always"
    report = (tmp_path / "s" / "REPORT.md").read_text()
    assert report.count(ARM_HEADING) == 1 and report.count(arm_heading("strong")) == 1
    assert "INT8=strong scripts/choose_arms.sh" in report.split(arm_heading("strong"))[1]
    # choosing again replaces each section in place
    assert main(["choose", "--compare", fp32, "--scheduler", str(tmp_path / "s")]) == 0
    again = (tmp_path / "s" / "REPORT.md").read_text()
    assert again.count(ARM_HEADING) == 1 and arm_heading("strong") in again
    plain = load_learned(tmp_path / "s" / "scheduler.json")
    assert plain.arm == "never" and "int8" not in plain.why()
    quantized = load_learned(tmp_path / "s" / "scheduler.json", int8="strong")
    assert quantized.arm == "always" and "chosen with the strong drafter in int8" in quantized.why()
    assert load_learned(tmp_path / "s" / "scheduler.json", int8="both").arm == "never"  # none chosen: fp32's
    both = run("both", {"treegraft:never": 3.0, "treegraft:learned": 4.0}, {"int8": "both", "models": {}})
    assert main(["choose", "--compare", int8, "--pool", both, "--scheduler", str(tmp_path / "s")]) == 2


def test_arm_certainty_says_when_the_choice_of_arm_is_a_coin_toss(rows):
    """Two arms that each win on half of the prompts by the same margin: a redraw of the prompts ranks
    either first about as often; one that wins on every prompt ranks first in every redraw; a pooled
    run redrawn alongside (the same prompts) can overturn a lead."""
    import pandas as pd
    from treegraft.scheduler_train import arm_certainty

    def frame(walls):
        return pd.DataFrame([{"prompt_id": p, "method": m, "new_tokens": 10, "wall_s": w}
                             for p, per in walls.items() for m, w in per.items()])
    split = {f"p{i}": {"treegraft:never": 2.0 if i % 2 else 3.0, "treegraft:always": 3.0 if i % 2 else 2.0,
                       "treegraft:learned": 9.0} for i in range(10)}
    first = arm_certainty(frame(split), n=400)
    assert set(first) == {"never", "always", "gain"} and first["gain"] == 0.0
    assert 0.3 < first["never"] < 0.7 and first["never"] + first["always"] == pytest.approx(1.0)
    clear = {p: per | {"treegraft:never": 1.5} for p, per in split.items()}
    assert arm_certainty(frame(clear), n=400)["never"] == 1.0
    # an earlier run of the same prompts where always is twice as fast relative to never: pooled, always leads
    earlier = {p: {"treegraft:never": 4.0, "treegraft:always": 1.0} for p in split}
    assert arm_certainty(frame(clear), [frame(earlier)], n=400)["always"] == 1.0


def test_replacing_a_report_section_keeps_the_others_and_adds_no_blank_lines():
    """A report whose first section is the one replaced must not grow a blank line at its top on
    every `scheduler choose`; the sections around the replaced one stay, in order."""
    from treegraft.scheduler_train import replace_section
    text = "## Arm\nold arm\n\n## Rules\nrule text\n"
    once = replace_section(text, "## Arm", "## Arm\nnew arm\n")
    assert once == "## Arm\nnew arm\n\n## Rules\nrule text\n"
    assert replace_section(once, "## Arm", "## Arm\nnew arm\n") == once
    middle = replace_section("# Report\n\n## Arm\nold\n\n## Rules\nr\n", "## Arm", "## Arm\nnew\n")
    assert middle == "# Report\n\n## Arm\nnew\n\n## Rules\nr\n"
    assert replace_section("# Report\n", "## Int8", "## Int8\nx\n") == "# Report\n\n## Int8\nx\n"
    assert replace_section("", "## Int8", "## Int8\nx\n") == "## Int8\nx\n"


def test_an_arm_chosen_on_one_machine_class_is_played_there_only(rows, tmp_path):
    """What verifying a tree costs differs by machine class (AVX2 and AVX-512 CPUs measured apart), and
    with it the fastest arm: `choose --hardware` keeps a class's arm beside the default one, a trio
    on that class plays it, any other class plays the default, and an int8 arm still comes first."""
    from treegraft.scheduler_train import ARM_HEADING, arm_heading, main
    run = trained_scheduler(rows, tmp_path)

    avx2 = run("avx2", {"tree-strong": 4.0, "treegraft:always": 2.0, "treegraft:learned": 3.0},
               {"hardware": "cpu-avx2", "models": {}})
    avx512 = run("avx512", {"tree-strong": 2.0, "treegraft:always": 4.0, "treegraft:learned": 3.0},
                 {"hardware": "cpu-avx512", "models": {}})
    older = run("older", {"tree-strong": 2.0, "treegraft:always": 4.0, "treegraft:learned": 3.0}, {"models": {}})
    assert main(["choose", "--compare", avx2, "--scheduler", str(tmp_path / "s")]) == 0
    assert main(["choose", "--compare", avx512, "--scheduler", str(tmp_path / "s"), "--hardware", "cpu-avx512"]) == 0
    saved = json.loads((tmp_path / "s" / "scheduler.json").read_text())
    assert saved["arm"]["arm"] == "always" and saved["arm_hardware"]["cpu-avx512"]["arm"] == "solo"
    report = (tmp_path / "s" / "REPORT.md").read_text()
    assert report.count(ARM_HEADING) == 1 and report.count(arm_heading(hardware="cpu-avx512")) == 1
    assert "HARDWARE=cpu-avx512 scripts/choose_arms.sh" in report.split(arm_heading(hardware="cpu-avx512"))[1]
    s = tmp_path / "s" / "scheduler.json"
    assert load_learned(s).arm == "always" and load_learned(s, hardware="cpu-avx2").arm == "always"
    here = load_learned(s, hardware="cpu-avx512")
    assert here.arm == "solo" and "chosen on cpu-avx512 machines" in here.why()
    assert "machines" not in load_learned(s, hardware="cpu-avx2").why()
    # a run that predates the record may be named by whoever measured it; a recorded other class may not
    assert main(["choose", "--compare", older, "--scheduler", str(tmp_path / "s"), "--hardware", "cpu-avx512"]) == 0
    before = s.read_text()
    assert main(["choose", "--compare", avx2, "--scheduler", str(tmp_path / "s"), "--hardware", "cpu-avx512"]) == 2
    int8 = run("int8", {"tree-strong": 4.0, "treegraft:learned": 3.0}, {"int8": "strong", "models": {}})
    assert main(["choose", "--compare", int8, "--scheduler", str(tmp_path / "s"), "--hardware", "cpu-avx512"]) == 2
    assert s.read_text() == before  # refused: nothing written
    assert main(["choose", "--compare", int8, "--scheduler", str(tmp_path / "s")]) == 0
    assert load_learned(s, int8="strong", hardware="cpu-avx512").arm == "gain"  # the int8 arm comes first


def test_call_replay_scores_each_rule_on_the_branch_it_picks(tmp_path):
    """scripts/call_replay.py: where prompt lookup matches, a call adds a token for 10% more time (it
    pays); where it does not, it adds nothing for the same time. Replayed on the shared cost model,
    when-matched picks exactly hindsight's calls, `always` pays for the useless ones, and rows without
    strong_match get no when-matched rule. A file that is not `scheduler collect` output is refused by name."""
    import importlib.util
    from treegraft.scheduler_train import Branches, fit_cost_model, one_time_costs
    spec = importlib.util.spec_from_file_location("call_replay", "scripts/call_replay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [{"prompt_id": f"p{i % 3}", "step": i // 3, "a0": 2, "a1": 2 + match, "c0": 1.0, "c1": 1.1,
             "n0": 3, "n1": 5, "verify0_s": 1.0, "verify1_s": 1.1, "weak_s": 0.0, "refine_s": 0.0,
             "strong_forwards": 1, "features": {"weak_expected": 1.0 + i % 2, "strong_match": match}}
            for i, match in enumerate([0, 1, 0, 0, 2, 1, 0, 1])]
    path = tmp_path / "collect.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    loaded = mod.load(path)
    cm, pre = fit_cost_model(loaded), one_time_costs(loaded)
    rules = mod.rules(loaded, cm, pre)
    rate = {k: Branches(loaded, cm).rate(call, pre) for k, call in rules.items()}
    assert rules["when-matched"].tolist() == rules[mod.HINDSIGHT].tolist() == [r["features"]["strong_match"] >= 1
                                                                               for r in rows]
    assert rate["never"] < rate["always"] < rate["when-matched"] == rate[mod.HINDSIGHT]
    path.write_text("\n".join(json.dumps(r | {"features": {"weak_expected": 1.5}}) for r in rows))
    assert "when-matched" not in mod.rules(mod.load(path), cm, pre)
    path.write_text(json.dumps({"prompt_id": "p0", "a0": 1}))
    with pytest.raises(SystemExit, match="not `scheduler collect` steps"):
        mod.load(path)
    with pytest.raises(SystemExit, match="no such file"):
        mod.load(tmp_path / "missing.jsonl")


def test_collect_refuses_to_sample_before_it_loads_or_writes_anything(tmp_path, capsys):
    """Collection runs the oracle, which is greedy only: asked to sample it stops at once, with the
    oracle's message, before a model loads or its --out directory exists."""
    from treegraft.cli import main
    out = tmp_path / "runs" / "collect.jsonl"
    assert main(["scheduler", "collect", "--temperature", "0.7", "--target", "/no/such/model", "--out", str(out)]) == 2
    assert "policy 'oracle' is greedy only" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()

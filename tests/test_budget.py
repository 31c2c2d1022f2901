"""`--budget auto`: the tree size that maximises expected tokens per second on a cost curve."""

import json

import pytest
import torch

from tiny import ids, tiny_llama, tiny_trio
from treegraft import costs
from treegraft.budget import LiveCurve, another_level_pays, choose_budget, forward_ms
from treegraft.engine import Clock, Engine, GenConfig
from treegraft.tree import ROOT, DraftTree


def chain(values):
    tree, parent = DraftTree(), ROOT
    prev = 0.0
    for v in values:
        parent, _ = tree.add(parent, len(tree) + 1, v - prev, "weak")
        prev = v
    return tree


def test_interpolation_and_extrapolation():
    curve = {1: 10.0, 2: 12.0, 4: 16.0}
    assert forward_ms(curve, 1) == 10 and forward_ms(curve, 3) == 14 and forward_ms(curve, 6) == 20


def test_flat_curve_sends_everything_steep_curve_sends_only_sure_nodes():
    tree = chain([-0.05, -0.1, -0.7, -2.0, -4.0])   # path values: sure, sure, likely, unlikely, hopeless
    flat = {1: 10.0, 8: 10.0}                       # a GPU: nodes are free
    steep = {1: 10.0, 2: 20.0, 8: 80.0}             # every node costs a whole forward
    assert choose_budget(tree, flat, 0.0, 64, 10)[0] == 5
    n, rate = choose_budget(tree, steep, 0.0, 64, 10)
    assert n == 0 and rate == pytest.approx(1 / 0.010)   # 0.95 extra tokens never pay a doubled step
    mid = {1: 10.0, 2: 11.0, 3: 12.0, 4: 20.0, 8: 60.0}
    assert choose_budget(tree, mid, 0.0, 64, 10)[0] == 2
    assert choose_budget(tree, flat, 0.0, 3, 10)[0] == 3      # the cap holds
    assert choose_budget(tree, flat, 0.0, 64, 2)[0] == 2      # so does the depth


def test_another_level_pays_only_when_cheap_and_likely():
    tree = chain([-0.05, -0.1])                       # a sure chain: the next token is likely too
    frontier = [1]
    flat = {1: 10.0, 64: 10.0}
    assert another_level_pays(tree, frontier, flat, 0.02, 0.001, 64, 10)      # a free level always pays
    assert not another_level_pays(tree, frontier, flat, 0.02, 1.0, 64, 10)    # a level of 100 target steps never
    doubt = chain([-2.0, -4.0])                       # hopeless already: another level adds ~nothing
    assert not another_level_pays(doubt, [1], flat, 0.02, 0.005, 64, 10)
    assert not another_level_pays(tree, [], flat, 0.02, 0.001, 64, 10)


def test_auto_budget_is_lossless_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))
    trio = tiny_trio("perturbed", "copy")
    prompt = [5, 17, 33, 2, 9]
    ref = trio.target.generate(ids(prompt), max_new_tokens=20, do_sample=False, min_new_tokens=0)[0, 5:].tolist()
    for method in ("tree-weak", "tree-strong", "treegraft"):
        engine = Engine(trio, GenConfig(method=method, policy="always", max_new_tokens=20, budget=64, auto_budget=True))
        records = list(engine.generate(prompt))
        assert engine.new_tokens == ref
        assert all(r.budget is not None and r.budget <= 64 and len(r.selected) <= r.budget for r in records)
    assert list((tmp_path / "profiles").glob("*.json"))     # measured once, then read
    assert set(costs.target_curve(trio)) == set(costs.QS[:-1])


def test_target_curve_reads_a_full_profile_only_on_the_current_grid(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))
    trio = tiny_trio("perturbed", "copy")
    full = costs._path(trio, 200, costs.ROLES)
    full.parent.mkdir(parents=True)
    dense = {str(q): 1000.0 + q for q in costs.QS}
    full.write_text(json.dumps({"target": dense, "repeats": costs.CURVE_REPEATS}))
    assert costs.target_curve(trio) == {q: 1000.0 + q for q in costs.QS}      # read, not re-measured
    full.write_text(json.dumps({"target": {"1": 1000.0, "2": 1001.0, "4": 1002.0, "8": 1003.0},
                                "repeats": costs.CURVE_REPEATS}))
    curve = costs.target_curve(trio)                 # a coarse grid from before: measured again, densely
    assert set(curve) == set(costs.QS[:-1]) and all(ms < 1000.0 for ms in curve.values())


def test_a_curve_of_too_few_rounds_is_measured_again(tmp_path, monkeypatch):
    # the cache key holds no round count, so a 2-round curve from before would size trees for good
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))
    trio = tiny_trio("perturbed", "copy")
    full = costs._path(trio, 200, costs.ROLES)
    full.parent.mkdir(parents=True)
    full.write_text(json.dumps({"target": {str(q): 1000.0 + q for q in costs.QS}, "repeats": 2}))
    curve = costs.target_curve(trio)
    assert set(curve) == set(costs.QS[:-1]) and all(ms < 1000.0 for ms in curve.values())
    again = costs.profile(trio, costs.QS[:-1], 200, costs.CURVE_REPEATS, roles=("target",))
    assert again["cached"] and again["repeats"] == costs.CURVE_REPEATS        # kept once it has enough
    assert not costs.profile(trio, costs.QS[:-1], 200, costs.CURVE_REPEATS + 1, roles=("target",))["cached"]


def test_a_profile_is_keyed_by_the_models_shapes_not_only_their_names():
    trio = tiny_trio("perturbed", "copy")
    path = costs._path(trio, 200, costs.ROLES)
    reweighted = tiny_trio("perturbed", "copy", seed=1)          # same shapes, other weights: same costs
    assert costs._path(reweighted, 200, costs.ROLES) == path
    resized = tiny_trio("perturbed", "copy")
    resized.weak = tiny_llama(7, vocab=96, hidden=16, layers=1)  # retrained at another size, same name
    assert resized.names == trio.names and costs._path(resized, 200, costs.ROLES) != path
    lookup = tiny_trio("perturbed", "ngram")                     # no tensors at all: still a key
    assert costs._path(lookup, 200, costs.ROLES) != path


def test_live_curve_scales_the_profile_by_measured_verifications():
    live = LiveCurve({1: 10.0, 8: 20.0})
    assert forward_ms(live, 8) == 20.0 and live.scale == 1.0
    live.observe(1, 0.020)                       # twice the profile's 10 ms
    assert live.scale == pytest.approx(2.0) and forward_ms(live, 8) == pytest.approx(40.0)
    live.observe(8, 0.010)                       # half the profile's 20 ms
    live.observe(8, 0.010)
    assert live.scale == pytest.approx(0.5)      # the median of the recent ratios, not the last one
    live.observe(1, 0.0)                         # nothing measured: ignored
    assert len(live.ratios) == 3
    live.reset()
    assert dict(live) == {1: 10.0, 8: 20.0} and live.scale == 1.0


def test_engine_feeds_each_verification_but_the_prefill_to_its_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))
    engine = Engine(tiny_trio("perturbed", "copy"), GenConfig(method="tree-weak", max_new_tokens=12, budget=8,
                                                              auto_budget=True))
    records = list(engine.generate([5, 17, 33, 2, 9]))
    assert len(engine.curve.ratios) == len(records) - 1 > 0          # step 0 holds the prompt's prefill
    assert dict(engine.curve) == pytest.approx({q: ms * engine.curve.scale for q, ms in engine.curve.base.items()})
    list(engine.generate([1, 2, 3]))
    assert len(engine.curve.ratios) == len(engine.records) - 1       # a new generation starts afresh


def test_clock_hides_a_discarded_branch_from_elapsed_not_from_phases():
    clock = Clock(torch.device("cpu"))
    clock.times["verify"] = 2.0
    clock.hide(1.5)
    assert clock.elapsed() == pytest.approx(0.5, abs=0.05) and clock.times["verify"] == 2.0

"""TreeGraft's provenance invariants, step by step, on tiny random models."""

import pytest
import torch

from tiny import ids, tiny_trio
from treegraft.engine import Engine, GenConfig
from treegraft.graft import GraftConfig

CONFIGS = [GraftConfig(), GraftConfig(rescore_m=6, recover_k=3, graft_g=3, graft_h=3, graft_k=2, blend=0.7),
           GraftConfig(rescore_m=30, recover_k=1, graft_g=1, graft_h=1)]


def steps(policy="always", graft=None, n=20, budget=16, depth=5, prompt=(5, 17, 33, 2, 9)):
    trio = tiny_trio("random", "perturbed")
    engine = Engine(trio, GenConfig(method="treegraft", policy=policy, graft=graft or GraftConfig(),
                                    max_new_tokens=n, budget=budget, depth=depth, topk=3))
    return trio, engine, list(engine.generate(list(prompt)))


def stage(rec, name):
    return next(s["nodes"] for s in rec.stages if s["name"] == name)


@pytest.mark.parametrize("graft", CONFIGS)
def test_refinement_is_non_destructive_and_merges_duplicates(graft):
    _, _, records = steps(graft=graft)
    for rec in records:
        weak = stage(rec, "weak pool")
        final = {n["id"]: n for n in rec.nodes}
        for n in weak:  # every weak node survives with its token and parent
            assert final[n["id"]]["token"] == n["token"] and final[n["id"]]["parent"] == n["parent"]
        pairs = [(n["parent"], n["token"]) for n in rec.nodes]
        assert len(pairs) == len(set(pairs)), "two siblings share a token"
        for n in rec.nodes:
            if n["rescored"]:
                assert n["strong_logp"] is not None
            if n["origin"] == "weak":
                assert n["weak_logp"] is not None


@pytest.mark.parametrize("graft", CONFIGS)
def test_recovered_and_graft_provenance(graft):
    _, _, records = steps(graft=graft)
    seen_recovered = seen_graft = 0
    for rec in records:
        weak_pairs = {(n["parent"], n["token"]) for n in stage(rec, "weak pool")}
        nodes = {n["id"]: n for n in rec.nodes}
        for n in rec.nodes:
            if n["origin"] == "recovered":
                seen_recovered += 1
                assert (n["parent"], n["token"]) not in weak_pairs
            if n["origin"] == "graft":
                seen_graft += 1
                up, found = n["parent"], False
                while up != -1:
                    found |= nodes[up]["graft_point"]
                    up = nodes[up]["parent"]
                assert found, "a graft node must descend from a graft point"
    assert seen_recovered > 0 or graft.recover_k == 0
    assert seen_graft > 0 or graft.graft_g == 0


def test_selection_budget_depth_ancestor_closed_and_stages_in_order():
    _, _, records = steps(budget=12, depth=4)
    for rec in records:
        nodes = {n["id"]: n for n in rec.nodes}
        assert len(rec.selected) <= 12
        for i in rec.selected:
            assert nodes[i]["depth"] <= 4 and nodes[i]["selected"]
            assert nodes[i]["parent"] == -1 or nodes[i]["parent"] in rec.selected
        assert set(rec.accepted) <= set(rec.selected)
        assert [s["name"] for s in rec.stages] == ["weak pool", "rescored", "recovered", "grafted", "selected",
                                                   "verified"]
        assert rec.strong_called and set(rec.stage_times) == {"rescore", "recover", "graft"}


def strong_logp_sequential(trio, tokens):
    with torch.inference_mode():
        return torch.log_softmax(trio.strong(input_ids=ids(tokens)).logits[0, -1].float(), -1)


@pytest.mark.parametrize("policy", ["every-k", "always"])
def test_strong_scores_are_exact_after_catching_up(policy):
    """On steps after the strong drafter sat out, it catches up in one forward: its scores must
    equal a fresh sequential run over the accepted prefix (a stale cache would shift them)."""
    trio, engine, records = steps(policy=policy, n=24)
    prompt = [5, 17, 33, 2, 9]
    produced = []
    checked = 0
    for rec in records:
        prefix = prompt + produced
        nodes = {n["id"]: n for n in rec.nodes}
        if rec.strong_called:
            for n in rec.nodes[:12]:
                if n["rescored"] and n["origin"] != "graft":
                    path, up = [], n["parent"]
                    while up != -1:
                        path.append(nodes[up]["token"])
                        up = nodes[up]["parent"]
                    ref = strong_logp_sequential(trio, prefix + path[::-1])[n["token"]]
                    assert abs(ref - n["strong_logp"]) < 1e-4
                    checked += 1
        produced += rec.new_tokens
    assert checked > 20
    if policy == "every-k":
        assert [r.strong_called for r in records[:4]] == [True, False, True, False]


@pytest.mark.parametrize("keep", [0, 1])
def test_a_calibrated_weak_score_is_kept_only_when_asked(keep):
    """With prompt lookup as the weak drafter its scores are measured hit rates: keep_calibrated=1 keeps
    such a score where it beats q_s's (never below the blend); 0 is the plain rescoring. Lossless both ways."""
    trio = tiny_trio("ngram", "perturbed")
    prompt = [5, 17, 33, 2, 9, 5, 17, 33, 2, 9, 5, 17]  # repetitive: lookup proposes long chains
    cfg = GenConfig(method="treegraft", policy="always", max_new_tokens=16, budget=16, depth=5, topk=3,
                    graft=GraftConfig(keep_calibrated=keep))
    engine = Engine(trio, cfg)
    records = list(engine.generate(prompt))
    ref = trio.target.generate(ids(prompt), max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
    assert engine.new_tokens == ref
    both = [n for rec in records for n in rec.nodes if n["weak_logp"] is not None and n["strong_logp"] is not None]
    assert both
    for n in both:
        plain = n["strong_logp"]  # blend = 1
        assert n["score"] == pytest.approx(max(plain, n["weak_logp"]) if keep else plain)
    assert any(n["weak_logp"] > n["strong_logp"] for n in both)  # the rule had something to decide


def test_a_strong_row_at_its_floor_has_no_opinion():
    """Prompt lookup as the STRONG drafter: a weak child that lookup never proposed sits at its row's
    floor; rescoring must leave that child's weak score alone, not sink it to the floor."""
    from treegraft.graft import _rescore_children
    from treegraft.tree import ROOT, DraftTree
    tree = DraftTree()
    tree.add(ROOT, 3, -0.2, "weak", weak_logp=-0.2)
    tree.add(ROOT, 4, -1.5, "weak", weak_logp=-1.5)
    row = torch.full((8,), -30.0)
    row[4] = -0.1  # lookup saw 4 follow this context, never 3
    _rescore_children(tree, ROOT, row, GraftConfig(keep_calibrated=0), float(row.min()))
    kept, rescored = tree.nodes
    assert (kept.score, kept.strong_logp, kept.rescored) == (-0.2, None, False)
    assert rescored.rescored and rescored.score == pytest.approx(-0.1)

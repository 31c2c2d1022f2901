"""Online calibration of drafter scores (treegraft.calibrate): what it counts, how it shrinks, and
that decoding with it stays token-identical to the target's greedy decoding."""

import math

import pytest

from tiny import tiny_trio
from test_lossless import hf_greedy, run
from treegraft.calibrate import FLOOR, Calibration
from treegraft.draft import add_children, proposals
from treegraft.tree import ROOT, DraftTree


def tree_of(edges):
    """edges: (parent, token, weak_logp, strong_logp) in id order."""
    t = DraftTree()
    for parent, tok, w, s in edges:
        t.add(parent, tok, w if w is not None else s, "weak", weak_logp=w, strong_logp=s)
    return t


def test_unseen_cells_score_what_the_drafter_said():
    cal = Calibration()
    for lp in (-6.0, -2.2, -0.7, -0.01):
        assert cal.score("weak", lp, 3) == pytest.approx(lp)
    assert cal.score("weak", -20.0, 1) == pytest.approx(math.log(FLOOR))


def test_counts_only_children_of_taken_parents():
    # root -> 0 (tok 5, accepted) -> 2 (tok 7); root -> 1 (tok 6); 0 -> 3 (tok 8); 1 -> 4 (tok 9)
    t = tree_of([(ROOT, 5, -0.5, None), (ROOT, 6, -1.0, -0.3), (0, 7, -0.2, None), (0, 8, -2.5, None),
                 (1, 9, -0.1, None)])
    cal = Calibration()
    tests = cal.update(t, path=[0], bonus=8)  # the target took 5, then 8 (the bonus)
    # nodes 0,1 (below the root) and 2,3 (below accepted 0); node 1's strong score too; not node 4
    assert tests == 5
    hits = {}
    for (r, d, _), (h, _) in cal.counts.items():
        hits[(r, d)] = hits.get((r, d), 0.0) + h
    assert hits[("weak", 1)] == 1.0 and hits[("strong", 1)] == 0.0  # 5 taken, 6 not
    assert hits[("weak", 2)] == 1.0  # 8 taken as the bonus, 7 not
    assert sum(t for (_, d, _), (_, t) in cal.counts.items() if d == 0) == 5


def test_misses_pull_a_bin_down_and_hits_up_per_depth():
    cal = Calibration()
    t = tree_of([(ROOT, 1, -0.3, None), (0, 2, -0.3, None)])
    for _ in range(30):
        cal.update(t, path=[0], bonus=99)  # depth 1 always taken, depth 2 never
    assert cal.score("weak", -0.3, 1) > -0.3 > cal.score("weak", -0.3, 2)
    assert cal.score("weak", -0.3, 1) > math.log(0.9) and cal.score("weak", -0.3, 2) < math.log(0.2)
    # a depth never seen leans on the bin over all depths (half taken), not on the raw score
    assert cal.score("weak", -0.3, 3) == pytest.approx(math.log(0.5), abs=0.15)
    # inside a bin the drafter's order survives
    assert cal.score("weak", -0.26, 3) > cal.score("weak", -0.45, 3)


def test_skipped_roles_are_rates_already():
    cal = Calibration(skip=("weak",))
    t = tree_of([(ROOT, 1, -0.3, -0.3)])
    assert cal.update(t, path=[], bonus=99) == 1  # only the strong score was a test
    assert cal.score("weak", -0.3, 1) == -0.3
    assert cal.score("strong", -0.3, 1) < -0.3


def test_drafting_uses_the_scale():
    import torch
    t = DraftTree(scale=lambda role, lp, depth: lp - depth)
    logp = torch.log_softmax(torch.tensor([3.0, 1.0, 0.0, -1.0]), dim=-1)
    add_children(t, ROOT, proposals(logp[None], 2)[0], "weak", "weak")
    add_children(t, 0, proposals(logp[None], 1)[0], "weak", "weak")
    assert t.nodes[0].score == pytest.approx(float(logp[0]) - 1)
    assert t.nodes[0].weak_logp == pytest.approx(float(logp[0]))  # the raw opinion is kept
    assert t.nodes[2].score == pytest.approx(float(logp[0]) - 2)


@pytest.mark.parametrize("method", ["tree-weak", "tree-strong", "treegraft"])
def test_calibrated_decoding_matches_greedy(method):
    trio = tiny_trio("random", "perturbed")
    for prompt in ([5, 17, 33, 2, 9], [40, 41, 42, 43, 44, 45]):
        ref = hf_greedy(trio.target, prompt, 30)
        new, records = run(trio, prompt, method=method, max_new_tokens=30, budget=12, depth=5, topk=3,
                           calibrate=True, policy="always")
        assert new == ref
        scored = [n for r in records for n in r.nodes if n["depth"] > 1]
        assert scored  # deep nodes exist, so the depth cells were exercised

"""Property tests on random trees: selection and acceptance."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treegraft.tree import ROOT, DraftTree, select
from treegraft.verify import accept_greedy, accept_sample, target_probs

VOCAB = 7


@st.composite
def trees(draw):
    tree = DraftTree()
    n = draw(st.integers(1, 40))
    for _ in range(n):
        parent = draw(st.integers(-1, len(tree) - 1))
        token = draw(st.integers(0, VOCAB - 1))
        score = draw(st.floats(-6.0, 0.0))
        tree.add(parent, token, score, draw(st.sampled_from(["weak", "graft", "recovered"])))
    return tree


@given(trees(), st.integers(1, 50), st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_select_is_ancestor_closed_and_within_budget_and_depth(tree, budget, depth):
    chosen = select(tree, budget, depth)
    assert len(chosen) <= budget
    assert len(set(chosen)) == len(chosen)
    ids = set(chosen)
    for i in chosen:
        node = tree.nodes[i]
        assert node.depth <= depth
        assert node.parent == ROOT or node.parent in ids
        assert node.selected
    eligible = [n for n in tree.nodes if n.depth <= depth]
    # Nothing left out that could have fitted: the budget is used whenever candidates exist.
    assert len(chosen) == min(budget, len(eligible)) or len(chosen) == budget


@given(trees(), st.integers(1, 50), st.integers(1, 8))
@settings(max_examples=100, deadline=None)
def test_select_takes_the_best_values_when_scores_are_logprobs(tree, budget, depth):
    chosen = set(select(tree, budget, depth))
    eligible = [n for n in tree.nodes if n.depth <= depth]
    if len(chosen) < len(eligible):
        worst_in = min(tree.nodes[i].value for i in chosen)
        best_out = max(n.value for n in eligible if n.id not in chosen)
        assert best_out <= worst_in + 1e-9


def test_no_duplicate_siblings():
    tree = DraftTree()
    a, made = tree.add(ROOT, 3, -0.1, "weak")
    b, made2 = tree.add(ROOT, 3, -0.5, "graft")
    assert made and not made2 and a == b and len(tree) == 1 and tree.nodes[a].origin == "weak"


@given(trees(), st.integers(1, 30), st.integers(0, 2**31 - 1))
@settings(max_examples=200, deadline=None)
def test_greedy_acceptance_follows_argmax(tree, budget, seed):
    selected = select(tree, budget, 10)
    logits = torch.randn(len(selected) + 1, VOCAB, generator=torch.Generator().manual_seed(seed))
    path, bonus = accept_greedy(tree, selected, logits)
    row = {ROOT: 0} | {i: 1 + j for j, i in enumerate(selected)}
    node = ROOT
    for i in path:
        assert i in selected and tree.nodes[i].parent == node
        assert tree.nodes[i].token == int(logits[row[node]].argmax())
        node = i
    assert bonus == int(logits[row[node]].argmax())
    # The walk stops only where no selected child carries the argmax.
    assert all(not (tree.nodes[c].parent == node and tree.nodes[c].token == bonus) for c in selected)


@given(trees(), st.integers(1, 30), st.integers(0, 2**31 - 1))
@settings(max_examples=200, deadline=None)
def test_sampled_acceptance_is_a_selected_chain_and_bonus_has_mass(tree, budget, seed):
    selected = select(tree, budget, 10)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(selected) + 1, VOCAB, generator=g)
    probs = target_probs(logits, 0.7, 0.9)
    path, bonus = accept_sample(tree, selected, logits, g, 0.7, 0.9)
    row = {ROOT: 0} | {i: 1 + j for j, i in enumerate(selected)}
    node = ROOT
    for i in path:
        assert i in selected and tree.nodes[i].parent == node
        assert probs[row[node], tree.nodes[i].token] > 0
        node = i
    assert probs[row[node], bonus] > 0
    assert not any(tree.nodes[c].parent == node and tree.nodes[c].token == bonus for c in selected)


def test_top_p_keeps_the_nucleus():
    probs = target_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 0.8)
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def sorted_nucleus(probs, top_p):
    """The whole-row sort the nucleus used to be, as the reference."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)
    out = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("scale,look,whole_sort", [(8.0, 1024, False), (0.05, 1024, True), (8.0, 8, True)])
def test_nucleus_from_the_top_rows_equals_a_whole_row_sort(scale, look, whole_sort):
    """Sharp rows keep their nucleus within the top `look`; flat ones (and a tiny `look`) need the
    whole sort. Either way the kept set and its weights are the whole-row sort's."""
    from treegraft.verify import nucleus
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(5, 20000, generator=g) * scale, dim=-1)
    for top_p in (0.5, 0.9, 0.99):
        fast, ref = nucleus(probs, top_p, look), sorted_nucleus(probs, top_p)
        assert torch.equal(fast > 0, ref > 0)
        assert torch.allclose(fast, ref, rtol=1e-6, atol=0)
    # Both branches are exercised: some row's nucleus at 0.99 is wider than `look`, or none is.
    assert bool(((sorted_nucleus(probs, 0.99) > 0).sum(-1) > look).any()) == whole_sort


def test_proposals_are_each_rows_top_k_above_its_floor():
    from treegraft.draft import proposals
    logp = torch.tensor([[-1.0, -3.0, -0.5, -9.0, -9.0],     # two above the floor, then the floor
                         [-9.0, -9.0, -9.0, -9.0, -9.0],     # a flat row: no proposal at all
                         [-0.25, -2.0, -3.0, -4.0, -5.0]])
    assert proposals(logp, 3) == [[(-0.5, 2), (-1.0, 0), (-3.0, 1)], [], [(-0.25, 0), (-2.0, 1), (-3.0, 2)]]
    assert proposals(logp, 9)[2] == [(-0.25, 0), (-2.0, 1), (-3.0, 2), (-4.0, 3)]  # k past the vocabulary
    for row, k in ((0, 2), (2, 2)):
        one = torch.topk(logp[row], k)
        assert proposals(logp, k)[row] == list(zip(one.values.tolist(), one.indices.tolist()))

"""The prompt-lookup drafter (`ngram`): what it proposes, and that it keeps decoding lossless in
either role."""

import numpy as np
import pytest
import torch

from tiny import ids, tiny_trio
from treegraft.engine import Engine, GenConfig
from treegraft.lookup import lookup_logp, propose

PROMPTS = [[5, 17, 33, 2, 9], [1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 9, 10, 7, 8, 9, 11, 7, 8]]


def test_longest_match_wins_and_branches_where_occurrences_differ():
    # "7 8" was followed by 9 twice; "9 7 8" once by 9 and once... the 3-gram "9 7 8" is followed by 9 only
    scores, longest = propose(np.array([7, 8, 9, 7, 8, 9, 7, 8, 5, 1, 7, 8]), max_n=4)
    assert longest == 2 and set(scores) == {9, 5}   # two continuations of "7 8": a branch
    assert scores[9] > scores[5]                    # seen twice vs once
    scores, longest = propose(np.array([1, 2, 3, 4, 1, 2, 3]), max_n=4)
    assert longest == 3 and max(scores, key=scores.get) == 4


def test_no_match_is_a_flat_row_and_matches_are_log_probabilities():
    flat = lookup_logp(np.array([1, 2, 3]), vocab=50, max_n=4)
    assert torch.allclose(flat, flat[0].expand(50))
    row = lookup_logp(np.array([1, 2, 3, 1, 2]), vocab=50, max_n=4)
    assert int(row.argmax()) == 3 and torch.isclose(row.exp().sum(), torch.tensor(1.0), atol=1e-5)


@pytest.mark.parametrize("roles", [("ngram", "copy"), ("perturbed", "ngram"), ("ngram", "features")])
@pytest.mark.parametrize("method", ["tree-weak", "tree-strong", "treegraft"])
def test_lookup_drafter_keeps_greedy_lossless(roles, method):
    trio = tiny_trio(*roles)
    for prompt in PROMPTS:
        ref = trio.target.generate(ids(prompt), max_new_tokens=30, do_sample=False, min_new_tokens=0)[0, len(prompt):]
        engine = Engine(trio, GenConfig(method=method, policy="always", max_new_tokens=30, budget=16, depth=5, topk=3))
        records = list(engine.generate(prompt))
        assert engine.new_tokens == ref.tolist()
        assert sum(r.accept_len for r in records) == len(engine.new_tokens)


def test_lookup_drafter_gets_accepted_on_repetitive_output():
    """The tiny target loops; prompt lookup must then propose its loop and be accepted."""
    trio = tiny_trio("ngram", "copy")
    engine = Engine(trio, GenConfig(method="tree-weak", max_new_tokens=60, budget=16, depth=6, topk=2))
    records = list(engine.generate(PROMPTS[1]))
    assert len(engine.new_tokens) / len(records) > 1.5
    assert any(r.accept_len > 2 for r in records)


def test_lookup_drafter_costs_no_model_forward_and_proposes_nothing_without_a_match():
    trio = tiny_trio("ngram", "copy")
    engine = Engine(trio, GenConfig(method="tree-weak", max_new_tokens=1, budget=16, depth=4, topk=3))
    engine.start([11, 12, 13, 14])   # no repeated n-gram: nothing to look up
    rec = engine.step()
    assert rec.nodes == [] and rec.accept_len == 1

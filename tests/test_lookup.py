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


def test_match_mass_is_calibrated_on_the_generation_itself():
    from treegraft.kv import make_runner
    from treegraft.lookup import NgramDrafter, prior_mass

    copying = make_runner(NgramDrafter(vocab_size=50), "weak")
    seq = [1, 2, 3, 4]
    copying.catch_up(seq)                       # the prompt: not scored
    for t in [1, 2, 3, 4] * 4:                  # the output repeats it: long matches continue
        seq.append(t)
        copying.catch_up(seq)
    assert copying.mass_by_n()[4] > prior_mass(4) and sum(copying.tries.values()) > 0

    wandering = make_runner(NgramDrafter(vocab_size=50), "weak")
    seq = [5, 6]
    wandering.catch_up(seq)
    for t in [5, 7, 5, 8, 5, 9, 5, 10, 5, 11]:  # after 5 comes something new every time
        seq.append(t)
        wandering.catch_up(seq)
    mass = wandering.mass_by_n()
    assert mass[1] < prior_mass(1) / 2 and wandering.hits.get(1, 0) == 0
    row = lookup_logp(np.array(seq), vocab=50, max_n=4, mass_by_n=mass)
    assert row.exp().max() < 0.3                # so a 1-token match is no longer sent as a sure thing

"""Speculative sampling over a tree keeps the target's distribution (chi-square tests)."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tiny import ids, tiny_trio
from treegraft.engine import ConfigError, Engine, GenConfig
from treegraft.tree import ROOT, DraftTree
from treegraft.verify import accept_sample, target_probs


def chi2_pvalue(counts: dict, expected: dict, n: int) -> float:
    keys = sorted(expected, key=lambda k: -expected[k])
    obs, exp = [], []
    rest_o = rest_e = 0.0
    for k in keys:  # pool rare cells so every expected count is >= 5
        if expected[k] * n >= 5:
            obs.append(counts.get(k, 0))
            exp.append(expected[k] * n)
        else:
            rest_o += counts.get(k, 0)
            rest_e += expected[k] * n
    obs.append(rest_o + sum(v for k, v in counts.items() if k not in expected))
    exp.append(rest_e)
    obs, exp = np.array(obs, float), np.array(exp, float)
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()
    return chisquare(obs, exp).pvalue


def test_accept_sample_reproduces_two_token_joint():
    """A fixed tree whose children include likely and unlikely tokens; the emitted first two
    tokens must follow p(t1) p(t2 | t1) exactly."""
    vocab, g = 5, torch.Generator().manual_seed(0)
    tree = DraftTree()
    for t in (0, 3, 4):
        tree.add(ROOT, t, -1.0, "weak")
    for parent in (0, 1):
        for t in (1, 2):
            tree.add(parent, t, -2.0, "graft")
    selected = list(range(len(tree)))
    logits = torch.randn(len(selected) + 1, vocab, generator=g) * 1.5
    probs = target_probs(logits, 1.0)
    # The target's distribution after a non-tree token is unknown to the tree; give it one too.
    after = target_probs(torch.randn(vocab, vocab, generator=g), 1.0)
    row = {tree.nodes[i].token: 1 + j for j, i in enumerate(selected) if tree.nodes[i].parent == ROOT}
    expected = {}
    for t1, t2 in itertools.product(range(vocab), repeat=2):
        p2 = probs[row[t1], t2] if t1 in row else after[t1, t2]
        expected[(t1, t2)] = float(probs[0, t1] * p2)
    counts, n = {}, 20000
    for _ in range(n):
        path, bonus = accept_sample(tree, selected, logits, g, 1.0)
        toks = [tree.nodes[i].token for i in path] + [bonus]
        if len(toks) == 1:  # the first token left the tree: draw the second from the target
            toks.append(int(torch.multinomial(after[toks[0]], 1, generator=g)))
        counts[tuple(toks[:2])] = counts.get(tuple(toks[:2]), 0) + 1
    assert chi2_pvalue(counts, expected, n) > 1e-3


def test_accept_sample_detects_a_biased_rule():
    """The chi-square check has power: min(1, p/q)-style acceptance with a made-up q would fail."""
    vocab, g = 4, torch.Generator().manual_seed(1)
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    counts = {}
    for _ in range(5000):  # biased sampler: always emits the top token half the time
        t = 3 if torch.rand((), generator=g) < 0.5 else int(torch.multinomial(probs[0], 1, generator=g))
        counts[(t,)] = counts.get((t,), 0) + 1
    expected = {(t,): float(probs[0, t]) for t in range(vocab)}
    assert chi2_pvalue(counts, expected, 5000) < 1e-6


@pytest.mark.parametrize("method,kw", [("treegraft", {"policy": "always", "temperature": 1.3, "top_p": 1.0}),
                                       ("tree-weak", {"temperature": 0.9, "top_p": 0.9})])
def test_engine_sampling_keeps_the_target_distribution(method, kw):
    trio = tiny_trio("perturbed", "copy", vocab=6, sharpen=1.5)
    prompt = [1, 4, 2]
    with torch.inference_mode():
        logits = trio.target(input_ids=ids(prompt)).logits[0, -1]
        p1 = target_probs(logits, kw["temperature"], kw["top_p"])
        expected = {}
        for t1 in range(6):
            if p1[t1] == 0:
                continue
            l2 = trio.target(input_ids=ids(prompt + [t1])).logits[0, -1]
            p2 = target_probs(l2, kw["temperature"], kw["top_p"])
            for t2 in range(6):
                expected[(t1, t2)] = float(p1[t1] * p2[t2])
    n, counts = 1500, {}
    engine = Engine(trio, GenConfig(method=method, max_new_tokens=2, budget=10, depth=3, topk=3,
                                    record_stages=False, **kw))
    for seed in range(n):
        engine.cfg.seed = seed
        list(engine.generate(prompt))
        key = tuple(engine.new_tokens)
        counts[key] = counts.get(key, 0) + 1
    assert chi2_pvalue(counts, expected, n) > 1e-3


def test_real_trees_sample_the_target_own_distribution(default_trio, chat_ids):
    """The default trio builds a real merged tree (distilled weak drafter, a feature drafter that reads
    the target, cut heads, grafted and recovered nodes) and the target verifies it in one forward
    under the tree mask. Resampling that one step's acceptance, each emitted token sequence (accepted
    path + bonus) must come out as often as the target's own plain decoding gives it, token by token:
    p(t1) p(t2 | t1) ..., each p from a separate forward without a tree."""
    temperature, top_p = 0.7, 0.9
    prompt = chat_ids("Name a fruit.")
    engine = Engine(default_trio, GenConfig(method="treegraft", policy="always", budget=8, depth=4,
                                            max_new_tokens=1, temperature=temperature, top_p=top_p))
    seen = []
    accept = engine.accept
    engine.accept = lambda tree, selected, logits: seen.append((tree, selected, logits)) or accept(tree, selected, logits)
    list(engine.generate(prompt))
    tree, selected, logits = seen[0]
    depth = {i: tree.nodes[i].depth for i in selected}
    assert len(selected) == 8 and max(depth.values()) >= 2, depth
    assert {tree.nodes[i].origin for i in selected} - {"weak"}, "the strong drafter changed nothing"

    kids = {}
    for i in selected:
        kids.setdefault(tree.nodes[i].parent, {})[tree.nodes[i].token] = i
    expected = {}

    def expect(node: int, prefix: tuple, mass: float):
        with torch.inference_mode():
            plain = default_trio.target(input_ids=ids(prompt + list(prefix))).logits[0, -1]
        p = target_probs(plain, temperature, top_p)
        for t in torch.nonzero(p).flatten().tolist():
            if t in kids.get(node, {}):
                expect(kids[node][t], prefix + (t,), mass * float(p[t]))
            else:
                expected[prefix + (t,)] = mass * float(p[t])
    expect(ROOT, (), 1.0)

    g, n, counts = torch.Generator().manual_seed(0), 4000, {}
    for _ in range(n):
        path, bonus = accept_sample(tree, selected, logits, g, temperature, top_p)
        key = tuple(tree.nodes[i].token for i in path) + (bonus,)
        counts[key] = counts.get(key, 0) + 1
    assert sum(v for k, v in counts.items() if len(k) > 1) > n / 4  # the tree is accepted into, often
    assert chi2_pvalue(counts, expected, n) > 1e-3


def test_temper_scores_neural_drafters_at_the_sampling_temperature():
    """--temper divides a neural drafter's logits by the sampling temperature before scoring; prompt
    lookup's hit rates and every greedy run are left on their own scale."""
    trio = tiny_trio("perturbed", "ngram", vocab=12, sharpen=1.5)
    prompt = [1, 4, 2, 7, 1, 4]
    runs = {}
    for temper, temperature in ((False, 0.5), (True, 0.5), (True, 0.0)):
        engine = Engine(trio, GenConfig(method="treegraft", policy="always", max_new_tokens=1, budget=10,
                                        depth=2, topk=3, temper=temper, temperature=temperature))
        records = list(engine.generate(prompt))
        assert engine.strong.score_temperature == 1.0  # the n-gram drafter
        assert engine.weak.score_temperature == (0.5 if temper and temperature else 1.0)
        runs[temper, temperature] = next(s["nodes"] for s in records[0].stages if s["name"] == "weak pool")
    with torch.inference_mode():
        logits = trio.weak(input_ids=ids(prompt)).logits[0, -1]
    for key, t in (((False, 0.5), 1.0), ((True, 0.5), 0.5), ((True, 0.0), 1.0)):
        roots = [n for n in runs[key] if n["parent"] == ROOT]
        want = torch.log_softmax(logits / t, dim=-1)
        assert roots and all(abs(n["weak_logp"] - float(want[n["token"]])) < 1e-5 for n in roots), key


def test_the_oracle_is_greedy_only():
    """The oracle samples both branches from one random stream and keeps the one that accepted more,
    so what it emits is not a draw from the target (scripts/oracle_bias.py measures how far). It
    refuses to sample, with a message; greedy, where both branches emit the same tokens, and every
    other policy sample as before."""
    with pytest.raises(ConfigError, match="oracle.*greedy only"):
        Engine(tiny_trio("perturbed", "copy"), GenConfig(policy="oracle", temperature=0.7))
    for ok in (GenConfig(policy="oracle"), GenConfig(policy="always", temperature=0.7),
               GenConfig(method="tree-weak", policy="oracle", temperature=0.7)):
        ok.check()

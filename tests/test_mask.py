"""The tree attention mask gives the same logits as running each path sequentially."""

import pytest
import torch

from tiny import ids, tiny_llama
from treegraft.kv import Runner
from treegraft.tree import ROOT, DraftTree


def random_tree(seed, vocab, n=14):
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree()
    while len(tree) < n:
        parent = int(torch.randint(-1, len(tree), (1,), generator=g))
        tree.add(parent, int(torch.randint(0, vocab, (1,), generator=g)), -1.0, "weak")
    return tree


def sequential_logits(model, tokens):
    with torch.inference_mode():
        return model(input_ids=ids(tokens)).logits[0, -1].float()


def check(model, prefix, tree, atol=1e-4):
    runner = Runner(model)
    runner.catch_up(prefix[:-1])  # a committed prefix, then root + whole tree in one forward
    nodes = list(range(len(tree)))
    logits = runner.catch_up(prefix, nodes, tree)
    assert torch.allclose(logits[0], sequential_logits(model, prefix), atol=atol)
    for j, i in enumerate(nodes):
        ref = sequential_logits(model, prefix + tree.tokens(i))
        assert torch.allclose(logits[1 + j], ref, atol=atol), (i, (logits[1 + j] - ref).abs().max())
    # Level by level through forward_nodes (the drafter's path) agrees too.
    runner = Runner(model)
    runner.catch_up(prefix)
    for depth in range(1, max(n.depth for n in tree.nodes) + 1):
        level = [n.id for n in tree.nodes if n.depth == depth]
        out = runner.forward_nodes(tree, level, len(prefix) - 1)
        for row, i in enumerate(level):
            assert torch.allclose(out[row], sequential_logits(model, prefix + tree.tokens(i)), atol=atol)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_mask_matches_sequential_tiny(seed):
    model = tiny_llama(seed, vocab=64)
    check(model, [3, 9, 27, 1, 40, 5][: 3 + seed], random_tree(seed, 64))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tree_mask_matches_under_both_attention_kernels(attn):
    model = tiny_llama(7, vocab=64)
    model.config._attn_implementation = attn
    check(model, [1, 2, 3, 4], random_tree(7, 64, n=10))


def test_commit_keeps_only_the_accepted_path():
    model = tiny_llama(3, vocab=64)
    tree = DraftTree()
    a, _ = tree.add(ROOT, 5, -0.1, "weak")
    b, _ = tree.add(ROOT, 6, -0.2, "weak")
    c, _ = tree.add(a, 7, -0.1, "weak")
    prefix = [1, 2, 3]
    runner = Runner(model)
    runner.catch_up(prefix, [a, b, c], tree)
    runner.commit([a, c])
    assert runner.n == runner.cache_len == 5
    # Continuing from the kept cache equals a fresh run over the accepted sequence.
    out = runner.catch_up(prefix + [5, 7, 11])
    assert torch.allclose(out[0], sequential_logits(model, prefix + [5, 7, 11]), atol=1e-4)


def test_tree_mask_matches_sequential_on_the_default_target(default_trio, chat_ids):
    prefix = chat_ids("Name three colours.")
    tree = DraftTree()
    top = torch.topk(sequential_logits(default_trio.target, prefix), 3).indices.tolist()
    for t in top:
        i, _ = tree.add(ROOT, t, -1.0, "weak")
        nxt = torch.topk(sequential_logits(default_trio.target, prefix + [t]), 2).indices.tolist()
        for u in nxt:
            tree.add(i, u, -1.0, "weak")
    check(default_trio.target, prefix, tree)

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


# ---------------------------------------------------------------- feature drafters (treegraft.eagle)

def feature_reference(drafter, target, prefix, path_tokens):
    """Without any cache: the drafter over prefix + path, reading the target's features for the prefix
    and its own prediction at the previous position for every path token. Logits of the last token."""
    from treegraft.eagle import target_features
    with torch.inference_mode():
        h, _ = target_features(target, ids(prefix[:-1])) if len(prefix) > 1 else (None, None)
        feats = [torch.zeros(target.config.hidden_size, device=ids([0]).device)]
        feats += [h[0, j] for j in range(len(prefix) - 1)]
        tokens = list(prefix)
        for t in [None] + list(path_tokens):
            if t is not None:
                tokens.append(t)
                feats.append(out.hidden[0, -1])
            out = drafter(ids(tokens), torch.stack(feats)[None])
        return out.logits[0, -1].float()


@pytest.mark.parametrize("seed", [0, 1])
def test_feature_drafter_tree_reads_parent_features(seed):
    """Tree slots of a feature drafter equal running each path on its own, with the target's features
    on the committed prefix and the drafter's own predictions inside the tree."""
    from treegraft import eagle
    target = tiny_llama(seed, vocab=64)
    drafter = eagle.build(target, seed=seed).eval()
    tr, dr = Runner(target, "target"), None
    dr = Runner(drafter, "strong", features_from=tr)
    assert tr.keep_features and dr.needs_features
    prefix = [3, 9, 27, 1, 40, 5][: 3 + seed]
    tr.catch_up(prefix[:-1])  # the target's features of the prompt
    tree = random_tree(seed, 64, n=10)
    logits = dr.catch_up(prefix, list(range(len(tree))), tree)  # one call, level by level inside
    assert dr.forwards == 1 + max(n.depth for n in tree.nodes)
    assert torch.allclose(logits[0], feature_reference(drafter, target, prefix, []), atol=1e-4)
    for i in range(len(tree)):
        ref = feature_reference(drafter, target, prefix, tree.tokens(i))
        assert torch.allclose(logits[1 + i], ref, atol=1e-4), (i, (logits[1 + i] - ref).abs().max())
    # After commit the accepted tokens are re-read with the target's real features.
    path = tree.path(len(tree) - 1)
    tr.catch_up(prefix, path, tree)
    tr.commit(path)
    dr.commit(path)
    assert dr.n == len(prefix) and tr.n == len(prefix) + len(path)
    seq = prefix + tree.tokens(len(tree) - 1) + [11]
    out = dr.catch_up(seq)
    assert torch.allclose(out[0], feature_reference(drafter, target, seq, []), atol=1e-4)


def test_feature_drafter_refuses_to_read_features_the_target_has_not_computed():
    from treegraft import eagle
    target = tiny_llama(0, vocab=64)
    dr = Runner(eagle.build(target).eval(), "strong", features_from=Runner(target, "target"))
    with pytest.raises(RuntimeError, match="no feature for position"):
        dr.catch_up([1, 2, 3])
    with pytest.raises(ValueError, match="features_from"):
        Runner(eagle.build(target).eval(), "strong")


def test_catch_up_runs_the_head_only_on_the_rows_it_returns():
    """A prefill or a multi-token catch-up returns the root's row (plus one per tree node); the head
    over the other positions would be wasted work, so it must not run there."""
    model = tiny_llama(5, vocab=64)
    rows = []
    model.lm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[-2]))
    tree = random_tree(5, 64, n=6)
    runner = Runner(model)
    prefix = [4, 8, 15, 16, 23, 42]
    out = runner.catch_up(prefix[:3])
    assert rows == [1] and torch.allclose(out[0], sequential_logits(model, prefix[:3]), atol=1e-4)
    nodes = list(range(len(tree)))
    rows.clear()
    out = runner.catch_up(prefix, nodes, tree)  # three tokens to catch up, then the tree
    assert rows == [1 + len(nodes)] and out.shape[0] == 1 + len(nodes)
    assert torch.allclose(out[0], sequential_logits(model, prefix), atol=1e-4)
    for j, i in enumerate(nodes):
        assert torch.allclose(out[1 + j], sequential_logits(model, prefix + tree.tokens(i)), atol=1e-4)


def test_a_drafter_window_reads_only_the_last_tokens_at_positions_from_zero():
    """limit_context(W): the first catch-up keeps the last W tokens; later catch-ups and tree nodes
    continue from there, each row what the model gives on the windowed sequence alone."""
    model = tiny_llama(6, vocab=64)
    prompt, window = [3, 9, 27, 17, 51, 25, 11, 33, 5, 60], 4
    runner = Runner(model, "strong")
    runner.limit_context(window)
    out = runner.catch_up(prompt)
    assert runner.offset == len(prompt) - window and runner.cache_len == window
    assert torch.allclose(out[0], sequential_logits(model, prompt[-window:]), atol=1e-4)
    assert not torch.allclose(out[0], sequential_logits(model, prompt), atol=1e-2)  # the window matters
    tree = random_tree(6, 64, n=5)
    nodes = list(range(len(tree)))
    runner.commit([])
    seq = prompt + [7, 8]                       # two accepted tokens since, then a tree below the root
    out = runner.catch_up(seq, nodes, tree)
    windowed = seq[len(prompt) - window:]
    assert torch.allclose(out[0], sequential_logits(model, windowed), atol=1e-4)
    for j, i in enumerate(nodes):
        assert torch.allclose(out[1 + j], sequential_logits(model, windowed + tree.tokens(i)), atol=1e-4)
    runner.commit([])
    lone = runner.forward_nodes(tree, [0], len(seq) - 1)  # root_pos is a sequence position
    assert torch.allclose(lone[0], sequential_logits(model, windowed + tree.tokens(0)), atol=1e-4)
    runner.reset()
    runner.catch_up(prompt[:3])                 # shorter than the window: everything, offset 0
    assert runner.offset == 0 and runner.cache_len == 3


def test_a_feature_drafter_refuses_a_window():
    from treegraft import eagle
    target = tiny_llama(7, vocab=64)
    runner = Runner(eagle.build(target).eval(), "strong", features_from=Runner(target))
    with pytest.raises(ValueError, match="context window"):
        runner.limit_context(8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_mask_opens_exactly_each_rows_prefix_and_tail(dtype):
    from treegraft.kv import tree_mask
    prefix, tails = [3, 4, 2, 5], [[], [6], [5, 7], []]
    mask = tree_mask(prefix, tails, 8, dtype, "cpu")
    assert mask.shape == (1, 1, 4, 8) and mask.dtype == dtype
    for r in range(4):
        open_cols = set(range(prefix[r])) | set(tails[r])
        for c in range(8):
            assert mask[0, 0, r, c].item() == (0.0 if c in open_cols else torch.finfo(dtype).min), (r, c)


@pytest.mark.parametrize("tail", [[], [4], [4, 5, 6], [5, 7], [6], [4, 7]])
def test_keep_rows_equals_a_gather_of_prefix_and_tail(tail):
    from treegraft.kv import keep_rows
    x = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(1, 2, 8, 3)
    want = x.index_select(-2, torch.tensor(list(range(4)) + tail))
    assert torch.equal(keep_rows(x.clone(), 4, tail, -2), want)
    h = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    assert torch.equal(keep_rows(h.clone(), 4, tail, 0), h[list(range(4)) + tail])

"""Acceptance over a verified tree: greedy, and lossless multi-round speculative sampling.

Row 0 of the target's logits belongs to the root; row 1 + j to the j-th selected node.
"""

from __future__ import annotations

import torch

from .tree import ROOT, DraftTree


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The distribution the target would sample from: temperature, then nucleus (top-p) truncation."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return nucleus(probs, top_p) if top_p < 1.0 else probs


def nucleus(probs: torch.Tensor, top_p: float, look: int = 1024) -> torch.Tensor:
    """Keep the smallest prefix of each row, by probability, whose mass reaches top_p (the first
    token is always kept), renormalised.

    Sorting a whole vocabulary row costs milliseconds on a CPU (150k entries for Qwen), while the
    nucleus nearly always lies among the top few hundred tokens: sort only the top `look`, and the
    whole row only when those do not reach top_p."""
    top, order = probs.topk(min(look, probs.shape[-1]), dim=-1)
    if top.shape[-1] < probs.shape[-1] and bool((top.sum(-1) < top_p).any()):
        top, order = probs.sort(dim=-1, descending=True)
    top = top.masked_fill(top.cumsum(-1) - top >= top_p, 0.0)
    out = torch.zeros_like(probs).scatter(-1, order, top)
    return out / out.sum(-1, keepdim=True)


def path_confidence(logits: torch.Tensor, selected: list[int], path: list[int]) -> list[float]:
    """The target's top-1 probability on each row it read along the accepted path, the root's first
    and the bonus token's last: how sure the target was of what it just emitted. It comes free with
    the verification and says how predictable the text is here, on the target's own scale rather
    than a drafter's."""
    row = {i: 1 + j for j, i in enumerate(selected)}
    rows = [0] + [row[i] for i in path]
    return torch.softmax(logits[rows].float(), dim=-1).amax(dim=-1).tolist()


def children_in_order(tree: DraftTree, selected: list[int]) -> dict[int, list[int]]:
    """Selected children of each node, best path value first (the order siblings are tried in)."""
    kids: dict[int, list[int]] = {}
    for i in sorted(selected, key=lambda i: (-tree.nodes[i].value, i)):
        kids.setdefault(tree.nodes[i].parent, []).append(i)
    return kids


def accept_greedy(tree: DraftTree, selected: list[int], logits: torch.Tensor) -> tuple[list[int], int]:
    """Walk down the child whose token is the target's argmax; the bonus is the argmax below."""
    row = {ROOT: 0} | {i: 1 + j for j, i in enumerate(selected)}
    kids = children_in_order(tree, selected)
    argmax = logits.argmax(dim=-1).tolist()
    path, node = [], ROOT
    while True:
        want = argmax[row[node]]
        nxt = next((c for c in kids.get(node, []) if tree.nodes[c].token == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def accept_sample(tree: DraftTree, selected: list[int], logits: torch.Tensor, generator: torch.Generator,
                  temperature: float, top_p: float = 1.0) -> tuple[list[int], int]:
    """Multi-round speculative sampling for deterministic candidates (as EAGLE does).

    At a node with target distribution p, try its children in order: accept child x with
    probability p(x); on rejection set p(x) = 0 and renormalise. If all are rejected (or there are
    none) sample the next token from what remains. Each token is thus drawn exactly from p.

    p is computed only for the rows the walk reaches (at most depth + 1 of the tree's rows): a
    whole tree's distributions, 65 rows of Qwen's vocabulary, cost more than a target forward."""
    row = {ROOT: 0} | {i: 1 + j for j, i in enumerate(selected)}
    kids = children_in_order(tree, selected)
    path, node = [], ROOT
    while True:
        p = target_probs(logits[row[node]], temperature, top_p).double().cpu()
        moved = False
        for c in kids.get(node, []):
            tok = tree.nodes[c].token
            total = p.sum()
            if total <= 0:
                break
            if torch.rand((), generator=generator, dtype=torch.float64) * total < p[tok]:
                path.append(c)
                node, moved = c, True
                break
            p[tok] = 0.0
        if not moved:
            bonus = int(torch.multinomial(p / p.sum(), 1, generator=generator))
            return path, bonus

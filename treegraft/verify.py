"""Acceptance over a verified tree: greedy, and lossless multi-round speculative sampling.

Row 0 of the target's logits belongs to the root; row 1 + j to the j-th selected node.
"""

from __future__ import annotations

import torch

from .tree import ROOT, DraftTree


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The distribution the target would sample from: temperature, then nucleus (top-p) truncation."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


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


def accept_sample(tree: DraftTree, selected: list[int], probs: torch.Tensor,
                  generator: torch.Generator) -> tuple[list[int], int]:
    """Multi-round speculative sampling for deterministic candidates (as EAGLE does).

    At a node with target distribution p, try its children in order: accept child x with
    probability p(x); on rejection set p(x) = 0 and renormalise. If all are rejected (or there are
    none) sample the next token from what remains. Each token is thus drawn exactly from p."""
    row = {ROOT: 0} | {i: 1 + j for j, i in enumerate(selected)}
    kids = children_in_order(tree, selected)
    probs = probs.double().cpu()
    path, node = [], ROOT
    while True:
        p = probs[row[node]].clone()
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

"""EAGLE-2-style dynamic tree drafting with one drafter.

Depth 1: the root's top-k children. Depth 2..D: the `width` best frontier nodes by path value are
run through the drafter in ONE batched tree-attention forward, each gets its top-k children.
Every candidate stays in the pool; the final budgeted rerank is `tree.select`.
"""

from __future__ import annotations

import torch

from .kv import Runner
from .tree import ROOT, DraftTree


def drafter_logp(runner: Runner, logits: torch.Tensor) -> torch.Tensor:
    """A drafter's log-probabilities, at its score temperature (1 unless GenConfig.temper)."""
    t = getattr(runner, "score_temperature", 1.0)
    return torch.log_softmax(logits if t == 1.0 else logits.float() / t, dim=-1)


def proposals(logp: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """Per row of `logp` [R, V]: its top-k (log-prob, token), best first, above the row's floor.
    Tokens at the floor are no proposal (a prompt-lookup row puts every unseen token there, a cut head
    every token it does not keep). One top-k over all rows: per row it cost ~80 us on a 49k vocabulary."""
    top = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
    floors = logp.amin(dim=-1).tolist()
    return [[(v, t) for v, t in zip(vs, ts) if v > f]
            for vs, ts, f in zip(top.values.tolist(), top.indices.tolist(), floors)]


def add_children(tree: DraftTree, parent: int, proposed: list[tuple[float, int]], origin: str, role: str) -> list[int]:
    """Give `parent` these children (from `proposals`) under this drafter's log-probs; existing
    children merge. Returns the ids of the new ones."""
    made, depth = [], 1 if parent == ROOT else tree.nodes[parent].depth + 1
    for lp, tok in proposed:
        i, created = tree.add(parent, tok, tree.scored(role, lp, depth), origin, **{f"{role}_logp": lp})
        if created:
            made.append(i)
    return made


def expand(runner: Runner, tree: DraftTree, parents: list[int], root_pos: int, k: int,
           origin: str, role: str) -> torch.Tensor:
    """One batched drafter forward over `parents`; returns their log-probs [len(parents), V]."""
    logp = drafter_logp(runner, runner.forward_nodes(tree, parents, root_pos))
    for row, (i, proposed) in enumerate(zip(parents, proposals(logp, k))):
        tree.nodes[i].expanded_by = role
        tree.rows[role][i] = logp[row]
        add_children(tree, i, proposed, origin, role)
    return logp


def draft_tree(runner: Runner, seq: list[int], depth: int, topk: int, width: int | None = None,
               role: str = "weak", origin: str | None = None, more=None, scale=None) -> tuple[DraftTree, int]:
    """Build a drafter's candidate pool below the root seq[-1]. Returns (tree, drafter forwards).
    `more(tree, parents)`, if given, may stop before a level (the hardware-aware depth); `scale`
    (treegraft.calibrate) puts scores on the acceptance scale."""
    origin = origin or role
    width = width or topk
    tree = DraftTree(scale=scale)
    root_pos = len(seq) - 1
    root_logp = drafter_logp(runner, runner.catch_up(seq)[0])
    tree.rows[role][ROOT] = root_logp
    add_children(tree, ROOT, proposals(root_logp[None], topk)[0], origin, role)
    forwards = 1
    for d in range(1, depth):
        frontier = [n.id for n in tree.nodes if n.depth == d and n.expanded_by is None]
        parents = tree.top(width, frontier)
        if not parents or (more is not None and not more(tree, parents)):
            break
        expand(runner, tree, parents, root_pos, topk, origin, role)
        forwards += 1
    return tree, forwards

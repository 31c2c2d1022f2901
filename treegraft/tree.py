"""The draft tree: nodes with token, parent, depth, score, path value and provenance.

The root (the last accepted token) is implicit: a node whose parent is ROOT hangs directly below it.
Node ids are indices into ``DraftTree.nodes`` and never change once assigned, so every stage of a
step (weak pool, rescored, grafted, selected, verified) can refer to the same node by the same id.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = -1
ORIGINS = ("weak", "strong", "graft", "recovered")


@dataclass
class Node:
    id: int
    token: int
    parent: int
    depth: int
    score: float          # s(v): the log-probability used for ranking (weak, strong, or a blend)
    value: float          # V(v) = sum of s(u) over the path root..v
    origin: str = "weak"  # who proposed it: weak | strong (tree-strong) | graft | recovered
    weak_logp: float | None = None
    strong_logp: float | None = None
    rescored: bool = False
    graft_point: bool = False
    selected: bool = False
    accepted: bool = False
    expanded_by: str | None = None  # which drafter has run on this node (its children came from there)

    def to_dict(self) -> dict:
        return dict(self.__dict__)  # flat fields only; dataclasses.asdict is 50x slower here


@dataclass
class DraftTree:
    nodes: list[Node] = field(default_factory=list)
    _child: dict = field(default_factory=dict)  # (parent, token) -> node id; one child per token
    # log-prob rows each drafter produced, by parent id: lets a strong-recovered node still carry
    # the weak drafter's opinion of it. Not part of snapshots.
    rows: dict = field(default_factory=lambda: {"weak": {}, "strong": {}})
    weak_calibrated: bool = False  # the weak drafter's scores are measured hit rates (prompt lookup)
    # (role, log-prob, depth) -> score: treegraft.calibrate's measured acceptance rates, or None to rank
    # by the drafters' own log-probabilities. Not part of snapshots.
    scale: Callable[[str, float, int], float] | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    def add(self, parent: int, token: int, score: float, origin: str, **logps) -> tuple[int, bool]:
        """Add a child, or return the existing child with that token (no duplicate siblings).
        Returns (node id, created)."""
        key = (parent, int(token))
        if key in self._child:
            return self._child[key], False
        depth = 1 if parent == ROOT else self.nodes[parent].depth + 1
        base = 0.0 if parent == ROOT else self.nodes[parent].value
        node = Node(len(self.nodes), int(token), parent, depth, float(score), base + float(score), origin, **logps)
        self.nodes.append(node)
        self._child[key] = node.id
        return node.id, True

    def scored(self, role: str, logp: float, depth: int) -> float:
        return logp if self.scale is None else self.scale(role, logp, depth)

    def child(self, parent: int, token: int) -> int | None:
        return self._child.get((parent, int(token)))

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root's child down to node_id."""
        out = []
        while node_id != ROOT:
            out.append(node_id)
            node_id = self.nodes[node_id].parent
        return out[::-1]

    def tokens(self, node_id: int) -> list[int]:
        return [self.nodes[i].token for i in self.path(node_id)]

    def refresh_values(self) -> None:
        """Recompute V after scores changed; parents always precede children in id order."""
        for n in self.nodes:
            n.value = n.score + (0.0 if n.parent == ROOT else self.nodes[n.parent].value)

    def top(self, k: int, ids=None) -> list[int]:
        ids = range(len(self.nodes)) if ids is None else ids
        return sorted(ids, key=lambda i: (-self.nodes[i].value, self.nodes[i].depth, i))[:k]

    def snapshot(self) -> list[dict]:
        return [n.to_dict() for n in self.nodes]


def select(tree: DraftTree, budget: int, max_depth: int) -> list[int]:
    """Top-`budget` nodes by path value, ancestor-closed and no deeper than `max_depth`.

    Best-first from the root: a node becomes a candidate only once its parent is chosen, so the
    result is ancestor-closed even if a refined score made a child outrank its parent. With
    log-prob scores (<= 0) a child never outranks its parent and this equals plain top-N."""
    kids: dict[int, list[int]] = {}
    for n in tree.nodes:
        if n.depth <= max_depth:
            kids.setdefault(n.parent, []).append(n.id)
    heap = [(-tree.nodes[i].value, tree.nodes[i].depth, i) for i in kids.get(ROOT, [])]
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < budget:
        _, _, i = heapq.heappop(heap)
        chosen.append(i)
        for c in kids.get(i, []):
            heapq.heappush(heap, (-tree.nodes[c].value, tree.nodes[c].depth, c))
    for n in tree.nodes:
        n.selected = False
    for i in chosen:
        tree.nodes[i].selected = True
    return sorted(chosen)  # id order keeps parents before children

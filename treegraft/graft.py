"""The strong drafter's work on the weak pool: rescore, recover, reselect graft positions, graft.

Everything is non-destructive: nodes are only added or rescored, never removed. A strong proposal
equal to an existing child (same parent, same token) merges into it (DraftTree.add never makes a
duplicate sibling). Strong forwards per call: 1 (catch-up + rescore) + h (graft levels); a feature
drafter (treegraft.eagle) rescores one tree level per forward, so 1 + (depth of the scored set) + h.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .draft import add_children, drafter_logp, proposals
from .kv import Runner
from .tree import ROOT, DraftTree, select


def knob(default, what: str, lo, hi):
    return field(default=default, metadata={"help": what, "range": (lo, hi)})


@dataclass
class GraftConfig:
    """The strong drafter's knobs: each one's default, help (the command line's --rescore-m etc.)
    and allowed range live here, once."""
    # The strong drafter's own subtree is shaped like the tree it would draft alone (4 children per
    # node, 4 positions, as deep as the tree): measured at a fixed budget on all seven pairs, a
    # narrower one (k_r=2, G=2, h=2, 3 children) lost to tree-strong wherever the strong drafter is
    # the better one (qwen-coder: 0.75-0.83 of its tau; README "Tree quality at one fixed budget").
    # With --budget auto a graft level still runs only while it pays.
    rescore_m: int = knob(16, "M: pool nodes the strong drafter rescores", 0, 256)
    recover_k: int = knob(4, "k_r: strong top-k recovered per scored parent", 0, 256)
    graft_g: int = knob(4, "G: graft positions", 0, 256)
    graft_h: int = knob(6, "h: graft subtree depth (the tree's depth D caps it)", 0, 256)
    graft_k: int = knob(4, "children per node inside a graft", 0, 256)
    # s = blend * log q_s + (1 - blend) * log q_w where both are known
    blend: float = knob(1.0, "weight of log q_s in a rescored node's score", 0, 1)
    # 0 reads everything. A window cuts the strong drafter's prompt prefill, paid at a generation's first
    # call (the 0.5B's: 3.2 target one-token forwards on the qwen-coder training prompts), to W tokens.
    strong_context: int = knob(0, "W: the strong drafter reads only the last W tokens of the context it "
                                   "first sees (0: all); a drafter-side cost cut, the target still verifies",
                               0, 1_000_000)
    # A weak score that is a measured hit rate (prompt lookup calibrates itself online) is evidence of
    # acceptance, not just a model's guess: 1 keeps it where it beats the (blended) strong score.
    keep_calibrated: int = knob(1, "1: keep a calibrated weak score (prompt lookup's hit rate) above q_s's; "
                                   "0: replace it", 0, 1)

    def check(self) -> None:
        """Raises ValueError naming the first knob out of its range."""
        for f in fields(self):
            lo, hi = f.metadata["range"]
            if not lo <= getattr(self, f.name) <= hi:
                raise ValueError(f"{f.name} must be in [{lo}, {hi}], got {getattr(self, f.name)}")


def _blend(node, cfg: GraftConfig, tree: DraftTree) -> float:
    w = None if node.weak_logp is None else tree.scored("weak", node.weak_logp, node.depth)
    s = None if node.strong_logp is None else tree.scored("strong", node.strong_logp, node.depth)
    if w is None or s is None:
        return s if s is not None else w
    mixed = cfg.blend * s + (1.0 - cfg.blend) * w
    return max(mixed, w) if cfg.keep_calibrated and tree.weak_calibrated else mixed


def _rescore_children(tree: DraftTree, parent: int, logp: torch.Tensor, cfg: GraftConfig, floor: float) -> None:
    kids = [n for n in tree.nodes if n.parent == parent]
    if not kids:
        return
    for n, lp in zip(kids, logp[[n.token for n in kids]].tolist()):
        if lp <= floor:
            continue  # the row's floor is no proposal (prompt lookup's unseen tokens, or a flat row): no opinion
        n.strong_logp = lp
        n.rescored = True
        n.score = _blend(n, cfg, tree)


def rescore(strong: Runner, tree: DraftTree, seq: list[int], cfg: GraftConfig) -> dict[int, torch.Tensor]:
    """Run q_s over the root and the top-M pool nodes (ancestor-closed) in ONE forward, catching
    up on accepted tokens it missed; rescore every existing child of each scored parent."""
    scored = select(tree, cfg.rescore_m, max_depth=10**6) if cfg.rescore_m > 0 else []
    for n in tree.nodes:
        n.selected = False  # select() marks nodes; here it only picked the rescoring set
    logp = drafter_logp(strong, strong.catch_up(seq, scored, tree))
    rows = {ROOT: logp[0]} | {i: logp[1 + j] for j, i in enumerate(scored)}
    for (parent, lp), floor in zip(rows.items(), logp.amin(dim=-1).tolist()):
        if parent != ROOT:
            tree.nodes[parent].expanded_by = tree.nodes[parent].expanded_by or "strong"
        _rescore_children(tree, parent, lp, cfg, floor)
    tree.refresh_values()
    return rows


def recover(tree: DraftTree, rows: dict[int, torch.Tensor], cfg: GraftConfig,
            weak_rows: dict[int, torch.Tensor] | None = None) -> list[int]:
    """Add q_s's top-k_r tokens under each scored parent that q_w never proposed there."""
    made = []
    if cfg.recover_k == 0 or not rows:
        return made
    for parent, proposed in zip(rows, proposals(torch.stack(list(rows.values())), cfg.recover_k)):
        for s_lp, tok in proposed:
            if tree.child(parent, tok) is not None:
                continue
            w_lp = float(weak_rows[parent][tok]) if weak_rows and parent in weak_rows else None
            i, _ = tree.add(parent, tok, 0.0, "recovered", strong_logp=s_lp, weak_logp=w_lp)
            node = tree.nodes[i]
            node.rescored = True
            node.score = _blend(node, cfg, tree)
            node.value = node.score + (0.0 if parent == ROOT else tree.nodes[parent].value)
            made.append(i)
    return made


def reselect(tree: DraftTree, rows: dict, cfg: GraftConfig, max_depth: int) -> list[int]:
    """Graft positions, chosen with the REFINED values: the G best nodes just below the scored
    region (their parent was scored, they were not), so q_s adds what it has not seen yet."""
    boundary = [n.id for n in tree.nodes
                if n.parent in rows and n.id not in rows and n.depth < max_depth]
    points = tree.top(cfg.graft_g, boundary)
    for i in points:
        tree.nodes[i].graft_point = True
    return points


def graft(strong: Runner, tree: DraftTree, points: list[int], root_pos: int, cfg: GraftConfig,
          max_depth: int, more=None) -> tuple[list[int], int]:
    """Expand strong subtrees of depth h below the graft points, one batched forward per level.
    `more(tree, parents)`, if given, may stop before a level (the hardware-aware depth).
    Returns (ids of nodes touched by the graft, strong forwards)."""
    frontier, touched, forwards = list(points), [], 0
    for _ in range(cfg.graft_h):
        frontier = [i for i in frontier if tree.nodes[i].depth < max_depth]
        if not frontier or (more is not None and not more(tree, frontier)):
            break
        logp = drafter_logp(strong, strong.forward_nodes(tree, frontier, root_pos))
        forwards += 1
        level = []
        floors = logp.amin(dim=-1).tolist()
        for row, (parent, proposed) in enumerate(zip(frontier, proposals(logp, cfg.graft_k))):
            tree.nodes[parent].expanded_by = "strong"
            _rescore_children(tree, parent, logp[row], cfg, floors[row])  # merge into existing children
            tree.refresh_values()
            before = len(tree)
            add_children(tree, parent, proposed, "graft", "strong")
            for i in range(before, len(tree)):
                tree.nodes[i].rescored = True
            kids = [n.id for n in tree.nodes if n.parent == parent]
            top = set(tree.top(cfg.graft_k, kids))
            level += [i for i in kids if tree.nodes[i].strong_logp is not None and i in top]
        tree.refresh_values()
        touched += level
        frontier = tree.top(len(points), level)
    return touched, forwards

"""Drafter scores put on one scale: the rate at which the target took tokens a drafter gave a
similar log-probability at the same depth, measured online on this generation.

Why: path values are summed log-probabilities that `select`, the auto budget (expected tokens =
1 + sum exp V) and the scheduler's features read as acceptance chances. A distilled drafter's
probabilities are not that (it is over- or under-confident, and more so deeper in the tree), and a
weak and a strong drafter's are not on one scale, so a merged tree ranks one drafter's nodes
against the other's on unlike numbers. Prompt lookup's scores are measured hit rates already
(treegraft.lookup) and are left alone.

The labels cost nothing: after a step the target's next token is known below the root and below
every accepted node (the next accepted token, or the bonus), so every pool node there, verified or
not, is a test of its drafter's score (of the weak drafter's only where it proposed the token).
Counts are shrunk twice: a (depth, bin) cell leans on its bin over all depths, which leans on the
drafter's own probability, so an unseen cell scores what the drafter said and the order within a
bin is kept.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

from .tree import ROOT, DraftTree

EDGES = (-4.0, -3.0, -2.0, -1.4, -0.9, -0.5, -0.25, -0.1)  # log-probability bin edges
DEPTHS = 4       # depths 4 and deeper share a cell
PRIOR = 4.0      # pseudo-tests at the shrinkage target
FLOOR = 1e-4     # no score below log(FLOOR): a drafter's proposal is never impossible


class Calibration:
    """Counts of (hits, tests) per (role, depth cell, bin); depth cell 0 pools all depths."""

    def __init__(self, skip: tuple[str, ...] = ()):
        self.skip = set(skip)  # roles whose scores are measured rates already (prompt lookup)
        self.counts: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def reset(self) -> None:
        self.counts.clear()

    def score(self, role: str, logp: float, depth: int) -> float:
        """log of the estimated chance that the target takes this token, given its parent taken."""
        if role in self.skip:
            return logp
        p, b = math.exp(min(0.0, logp)), bisect.bisect_right(EDGES, logp)
        h, t = self.counts.get((role, 0, b), (0.0, 0.0))
        pooled = (h + PRIOR * p) / (t + PRIOR)
        h, t = self.counts.get((role, min(depth, DEPTHS), b), (0.0, 0.0))
        return math.log(max(FLOOR, (h + PRIOR * pooled) / (t + PRIOR)))

    def update(self, tree: DraftTree, path: list[int], bonus: int) -> int:
        """Count every node whose parent the target took (the root, or an accepted node) as a hit
        if it is the token the target took there. Returns the number of tests."""
        parents = [ROOT] + list(path)
        taken = {p: tree.nodes[c].token for p, c in zip(parents, path)}
        taken[parents[-1]] = bonus
        tests = 0
        for n in tree.nodes:
            if n.parent not in taken:
                continue
            hit = float(n.token == taken[n.parent])
            for role in ("weak", "strong"):
                lp = getattr(n, f"{role}_logp")
                # A token the strong drafter recovered carries the weak drafter's opinion of it, but
                # was picked for the strong one's: counted for weak, it would teach that the weak
                # drafter's unlikely tokens are often taken.
                if lp is None or role in self.skip or (role == "weak" and n.origin != "weak"):
                    continue
                b = bisect.bisect_right(EDGES, lp)
                for cell in ((role, 0, b), (role, min(n.depth, DEPTHS), b)):
                    self.counts[cell][0] += hit
                    self.counts[cell][1] += 1.0
                tests += 1
        return tests

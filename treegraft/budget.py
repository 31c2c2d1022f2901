"""The hardware-aware tree size (`--budget auto`): per step, the number of nodes N that maximises
expected accepted tokens per second.

A node's path value V is the log of the draft probability of its whole path, EAGLE-2's estimate of
the chance that the target accepts it; so sending the N best nodes buys about 1 + sum exp(V) tokens
(the bonus token always comes). Verifying them costs one target forward over N + 1 tokens (the root
too), read off this machine's measured cost curve (treegraft.costs), on top of what drafting this
step already spent. On a CPU the curve is steep beyond ~16 tokens and a GPU's is flat, so the same
tree gets cut differently on each: that is the point.
"""

from __future__ import annotations

import bisect
import math

from .tree import DraftTree


def forward_ms(curve: dict[int, float], q: int) -> float:
    """Piecewise-linear interpolation of the measured curve; linear extrapolation past its end."""
    qs = sorted(curve)
    if q <= qs[0]:
        return curve[qs[0]]
    j = min(bisect.bisect_left(qs, q), len(qs) - 1)
    a, b = qs[j - 1], qs[j]
    return curve[a] + (curve[b] - curve[a]) * (q - a) / (b - a)


def choose_budget(tree: DraftTree, curve: dict[int, float], spent_s: float, max_budget: int,
                  max_depth: int) -> tuple[int, float]:
    """(N, expected tokens per second at N) over N = 0 .. max_budget nodes best-first by value.
    Values are log-probabilities (<= 0), so best-first by value is ancestor-closed already."""
    values = sorted((n.value for n in tree.nodes if n.depth <= max_depth), reverse=True)[:max_budget]
    best_n, best_rate, gain = 0, 0.0, 1.0
    for n in range(len(values) + 1):
        if n:
            gain += math.exp(min(0.0, values[n - 1]))
        rate = gain / (spent_s + forward_ms(curve, n + 1) / 1e3)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n, best_rate

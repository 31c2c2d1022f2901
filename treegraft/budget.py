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


def another_level_pays(tree: DraftTree, parents: list[int], curve: dict[int, float], spent_s: float,
                       level_s: float, max_budget: int, max_depth: int) -> bool:
    """Hardware-aware depth: is expanding `parents` one more drafter level worth its time?

    The level costs about what the last one did (level_s). It adds, per parent, about the parent's
    path probability times its own conditional one again (a drafter as sure of the next token as it
    was of this one; siblings are disjoint, so the sum stays <= 1). Expand only if that raises the
    expected tokens per second at the best N, verification of the bigger tree included."""
    n, rate = choose_budget(tree, curve, spent_s, max_budget, max_depth)
    if rate <= 0.0 or not parents:
        return bool(parents)
    gain = rate * (spent_s + forward_ms(curve, n + 1) / 1e3)
    extra = sum(math.exp(min(0.0, tree.nodes[i].value + tree.nodes[i].score)) for i in parents)
    grown = min(max_budget, n + len(parents))
    return (gain + extra) / (spent_s + level_s + forward_ms(curve, grown + 1) / 1e3) > rate


class LiveCurve(dict):
    """The profiled curve, rescaled by what this generation's verifications really cost.

    A profile is measured once per machine and models, on a 200-token context, and a machine's load
    moves (on this CPU two cached profiles of the same 1.5B put q=1 at 190 and 401 ms against 265 ms
    in plain decoding), so every rule that reads the curve (the budget, the next drafter level, the
    scheduler's seconds) would size trees for another machine. After each verification it scales the
    whole curve by the median ratio of measured to profiled seconds over the last `window` ones; the
    curve's shape (how q tokens cost against one) stays the profile's. A plain dict of q -> ms, so
    forward_ms reads it like any curve."""

    def __init__(self, base: dict[int, float], window: int = 8):
        super().__init__(base)
        self.base, self.window, self.ratios = dict(base), window, []

    @property
    def scale(self) -> float:
        recent = sorted(self.ratios[-self.window:])
        return recent[len(recent) // 2] if recent else 1.0

    def observe(self, q: int, seconds: float) -> None:
        """A target forward over q new tokens took `seconds`."""
        if q < 1 or seconds <= 0:
            return
        self.ratios.append(seconds * 1e3 / forward_ms(self.base, q))
        s = self.scale
        self.update({k: v * s for k, v in self.base.items()})

    def reset(self) -> None:
        self.ratios.clear()
        self.update(self.base)

"""When to call the strong drafter: cheap features of the weak pool and of recent history, and
the policies that turn them into a decision. No model forward happens here, by design."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .tree import ROOT, DraftTree

POLICIES = ("never", "always", "every-k", "learned", "oracle")


@dataclass
class History:
    accept_lens: list[int] = field(default_factory=list)
    strong_calls: list[bool] = field(default_factory=list)
    position: int = 0


def features(tree: DraftTree, history: History, depth: int) -> dict:
    """Microsecond features: how sure the weak drafter is, and how the last steps went."""
    roots = [n for n in tree.nodes if n.parent == ROOT]
    probs = [math.exp(n.value) for n in roots]
    root_top1 = max(probs) if probs else 0.0
    mass = sum(probs)
    rest = max(1e-9, 1.0 - mass)
    entropy = -sum(p * math.log(p) for p in probs if p > 0) - rest * math.log(rest)
    best = max(tree.nodes, key=lambda n: n.value) if tree.nodes else None
    values = sorted((n.value for n in tree.nodes), reverse=True)
    top16 = sum(math.exp(v) for v in values[:16])
    recent = history.accept_lens[-4:]
    with_strong = [a for a, s in zip(history.accept_lens[-8:], history.strong_calls[-8:]) if s]
    without = [a for a, s in zip(history.accept_lens[-8:], history.strong_calls[-8:]) if not s]
    mean = (lambda xs: sum(xs) / len(xs) if xs else 0.0)
    deepest = max((n.depth for n in tree.nodes if n.value > math.log(0.1)), default=0)
    return {
        "root_top1": root_top1,
        "root_entropy": entropy,
        "pool_mass_top16": top16,
        "best_value": best.value if best else 0.0,
        "confident_depth": deepest / max(1, depth),
        "recent_accept": mean(recent),
        "recent_strong_gain": mean(with_strong) - mean(without),
        "position": math.log1p(history.position),
    }


@dataclass
class Decision:
    call: bool
    policy: str
    reason: str
    score: float | None = None
    threshold: float | None = None
    features: dict = field(default_factory=dict)
    oracle: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class Policy:
    name = "base"

    def decide(self, feats: dict, step: int) -> Decision:
        raise NotImplementedError


class Never(Policy):
    name = "never"

    def decide(self, feats, step):
        return Decision(False, self.name, "policy never calls the strong drafter", features=feats)


class Always(Policy):
    name = "always"

    def decide(self, feats, step):
        return Decision(True, self.name, "policy always calls the strong drafter", features=feats)


class EveryK(Policy):
    name = "every-k"

    def __init__(self, k: int = 2):
        if k < 1:
            raise ValueError("every-k needs k >= 1")
        self.k = k

    def decide(self, feats, step):
        call = step % self.k == 0
        return Decision(call, self.name, f"step {step} {'is' if call else 'is not'} a multiple of k={self.k}",
                        features=feats)


class Oracle(Policy):
    """Marker: the engine runs the step both ways and keeps the better (an upper bound)."""
    name = "oracle"

    def decide(self, feats, step):
        return Decision(True, self.name, "oracle runs both branches and keeps the better", features=feats)


def make_policy(name: str, every_k: int = 2, path: str | None = None) -> Policy:
    if name == "never":
        return Never()
    if name == "always":
        return Always()
    if name == "every-k":
        return EveryK(every_k)
    if name == "oracle":
        return Oracle()
    if name == "learned":
        from .value import LearnedPolicy
        return LearnedPolicy.load(path)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")

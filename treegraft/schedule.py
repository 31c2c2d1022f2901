"""When to call the strong drafter: cheap features of the weak pool and of recent history, and
the policies that turn them into a decision: never / always / every-k / learned / oracle. No model
forward happens here, by design. The learned policy's runtime (load a scheduler file, decide) lives
here with the others; fitting it offline is treegraft.scheduler_train."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .models import ASSETS
from .tree import ROOT, DraftTree

POLICIES = ("never", "always", "every-k", "learned", "oracle")
DEFAULT_SCHEDULER = ASSETS / "scheduler" / "scheduler.json"
# The scheduler's inputs, in the order a scheduler file lists its weights (features() returns them).
FEATURES = ("root_top1", "root_entropy", "pool_mass_top16", "best_value", "confident_depth",
            "recent_accept", "recent_strong_gain", "position")


def scheduler_for(trio: str | None) -> Path:
    """A named trio's own scheduler (assets/scheduler/<trio>/scheduler.json) if one ships, else the
    default one (distilled on the smollm2 trio): a scheduler learns one pair's costs and agreement."""
    own = ASSETS / "scheduler" / str(trio) / "scheduler.json"
    return own if trio and own.exists() else DEFAULT_SCHEDULER


def default_policy() -> str:
    """`learned` once a distilled scheduler ships, `always` until then."""
    return "learned" if DEFAULT_SCHEDULER.exists() else "always"


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


@dataclass
class LearnedPolicy(Policy):
    """Logistic model on standardised features; calls the strong drafter when p > threshold.
    Pure arithmetic on a dict of floats: no model forward, microseconds."""
    features: tuple
    mean: list
    std: list
    weights: list
    bias: float
    threshold: float
    name: str = "learned"
    source: str = ""

    @classmethod
    def load(cls, path: str | Path | None = None) -> "LearnedPolicy":
        p = Path(path) if path else DEFAULT_SCHEDULER
        if not p.exists():
            raise FileNotFoundError(f"no learned scheduler at {p}; train one with "
                                    f"`python -m treegraft scheduler train`")
        d = json.loads(p.read_text())
        return cls(tuple(d["features"]), d["mean"], d["std"], d["weights"], d["bias"], d["threshold"], source=str(p))

    def contributions(self, feats: dict) -> dict:
        return {f: w * (feats[f] - m) / s for f, m, s, w in zip(self.features, self.mean, self.std, self.weights)}

    def prob(self, feats: dict) -> float:
        z = self.bias + sum(self.contributions(feats).values())
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def decide(self, feats: dict, step: int) -> Decision:
        contrib = self.contributions(feats)
        p = self.prob(feats)
        call = p > self.threshold
        top = sorted(contrib.items(), key=lambda kv: -abs(kv[1]))[:2]
        why = ", ".join(f"{f}={feats[f]:.2f} {'for' if c > 0 else 'against'} ({c:+.2f})" for f, c in top)
        reason = f"p(strong pays) = {p:.2f} {'>' if call else '<='} threshold {self.threshold:.2f}; {why}"
        return Decision(call, self.name, reason, score=p, threshold=self.threshold, features=feats)


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
        return LearnedPolicy.load(path)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")

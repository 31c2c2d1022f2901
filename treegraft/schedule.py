"""When to call the strong drafter: cheap features of the weak pool and of recent history, and
the policies that turn them into a decision: never / always / every-k / learned / oracle. No model
forward happens here, by design. The learned policy's runtime (load a scheduler file, decide) lives
here with the others; fitting it offline is treegraft.scheduler_train."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .budget import choose_budget, forward_ms
from .models import ASSETS
from .tree import ROOT, DraftTree

POLICIES = ("never", "always", "every-k", "when-empty", "when-unsure", "when-matched", "strong-first", "learned",
            "oracle")
DEFAULT_SCHEDULER = ASSETS / "scheduler" / "scheduler.json"
# The scheduler's inputs (features() returns them in this order; a scheduler file lists the ones it uses).
# The weak pool's features (the gain scheduler's a0 model reads only these: they do not depend on
# what the policy did before).
POOL_FEATURES = ("root_top1", "root_entropy", "pool_mass_top16", "best_value", "confident_depth", "position",
                 "weak_nodes", "mass_depth1", "mass_depth2", "mass_deep", "weak_expected")
FEATURES = ("root_top1", "root_entropy", "pool_mass_top16", "best_value", "confident_depth",
            "recent_accept", "recent_strong_gain", "position",
            # the weak pool by depth, what it is expected to buy, and what recent strong calls bought
            "weak_nodes", "mass_depth1", "mass_depth2", "mass_deep", "weak_expected",
            "recent_strong_tokens", "steps_since_call",
            # how sure the target itself was at the last step: of the token this tree grows from, and along its path
            "target_top1", "target_sure")
# What this device and this generation say (recorded beside the features, never a model input): the
# weak tree's budget N0, the expected seconds of the step without a strong call (c0_s), a target forward
# over one token (t1_s), the extra seconds recent strong calls cost (strong_s) and the tokens they added
# over the weak tree's expectation (recent_gain; calls_seen of them, capped at 4), tokens/s so far, and
# the tokens this generation may still emit (tokens_left: what a first call's one-time cost is spread over).
# Where the strong drafter is prompt lookup, features() adds strong_match (the n-gram it matches at the root).
COSTS = ("weak_n", "c0_s", "t1_s", "strong_s", "recent_gain", "calls_seen", "rate_so_far", "tokens_left")


def scheduler_for(trio: str | None, pair: str | None = None) -> Path:
    """The scheduler shipped for this pair of drafters on this trio's target
    (assets/scheduler/<trio>/<weak>+<strong>/scheduler.json), else the default one (the smollm2 trio's
    first): a scheduler learns one pair's agreement, so another pair's is a fallback, not a fit."""
    own = ASSETS / "scheduler" / str(trio) / str(pair) / "scheduler.json"
    return own if trio and pair and own.exists() else DEFAULT_SCHEDULER


def default_policy() -> str:
    """`learned` once a distilled scheduler ships, `always` until then."""
    return "learned" if DEFAULT_SCHEDULER.exists() else "always"


@dataclass
class History:
    accept_lens: list[int] = field(default_factory=list)
    strong_calls: list[bool] = field(default_factory=list)
    position: int = 0
    strong_tokens: list[int] = field(default_factory=list)    # per strong call: accepted nodes it made
    strong_extra_s: list[float] = field(default_factory=list)  # per strong call: seconds beyond c0_s
    gains: list[float] = field(default_factory=list)           # per strong call: accepted tokens - expected a0
    target_conf: list[float] = field(default_factory=list)     # the last step's verify.path_confidence
    tokens: int = 0                                            # this generation so far
    seconds: float = 0.0


def features(tree: DraftTree, history: History, depth: int, curve: dict | None = None, spent_s: float = 0.0,
             budget: int = 16, auto: bool = False, tokens_left: int = 0, strong_match: int | None = None) -> dict:
    """Microsecond features: how sure the weak drafter is, how the last steps went, and (given this
    device's cost curve) what the weak tree alone is expected to buy and cost: N0 = `budget` nodes,
    or with `auto` the N0 <= budget --budget auto would send. `strong_match`, where the strong drafter
    knows it without running (prompt lookup: Runner.root_match), is the n-gram it matches at the root."""
    roots = [n for n in tree.nodes if n.parent == ROOT]
    probs = [math.exp(n.value) for n in roots]
    root_top1 = max(probs) if probs else 0.0
    mass = sum(probs)
    rest = max(1e-9, 1.0 - mass)
    entropy = -sum(p * math.log(p) for p in probs if p > 0) - rest * math.log(rest)
    best = max(tree.nodes, key=lambda n: n.value) if tree.nodes else None
    values = sorted((n.value for n in tree.nodes if n.depth <= depth), reverse=True)
    top16 = sum(math.exp(v) for v in values[:16])
    recent = history.accept_lens[-4:]
    with_strong = [a for a, s in zip(history.accept_lens[-8:], history.strong_calls[-8:]) if s]
    without = [a for a, s in zip(history.accept_lens[-8:], history.strong_calls[-8:]) if not s]
    mean = (lambda xs: sum(xs) / len(xs) if xs else 0.0)
    deepest = max((n.depth for n in tree.nodes if n.value > math.log(0.1)), default=0)
    by_depth = [0.0, 0.0, 0.0]
    for n in tree.nodes:
        by_depth[min(n.depth, 3) - 1] += math.exp(n.value)
    if curve:
        n0 = choose_budget(tree, curve, spent_s, budget, depth)[0] if auto else min(budget, len(values))
        c0, t1 = spent_s + forward_ms(curve, n0 + 1) / 1e3, forward_ms(curve, 1) / 1e3
    else:
        n0, c0, t1 = min(budget, len(values)), 0.0, 0.0
    since = next((k for k, s in enumerate(reversed(history.strong_calls)) if s), len(history.strong_calls))
    return {
        "root_top1": root_top1,
        "root_entropy": entropy,
        "pool_mass_top16": top16,
        "best_value": best.value if best else 0.0,
        "confident_depth": deepest / max(1, depth),
        "recent_accept": mean(recent),
        "recent_strong_gain": mean(with_strong) - mean(without),
        "position": math.log1p(history.position),
        "weak_nodes": math.log1p(len(tree.nodes)),
        "mass_depth1": by_depth[0], "mass_depth2": by_depth[1], "mass_deep": by_depth[2],
        "weak_expected": 1.0 + sum(math.exp(v) for v in values[:n0]),
        "recent_strong_tokens": mean(history.strong_tokens[-4:]),
        "steps_since_call": math.log1p(since),
        "target_top1": history.target_conf[-1] if history.target_conf else 0.0,
        "target_sure": mean(history.target_conf),
        "weak_n": n0, "c0_s": c0, "t1_s": t1, "strong_s": mean(history.strong_extra_s[-4:]),
        "recent_gain": mean(history.gains[-4:]), "calls_seen": min(4, len(history.gains)),
        "rate_so_far": history.tokens / history.seconds if history.seconds > 0 else 0.0,
        "tokens_left": tokens_left,
    } | ({} if strong_match is None else {"strong_match": strong_match})


@dataclass
class Decision:
    call: bool
    policy: str
    reason: str
    score: float | None = None
    threshold: float | None = None
    features: dict = field(default_factory=dict)
    oracle: dict | None = None
    expected: float | None = None  # the policy's a0 (tokens without a call), to measure what a call added

    def to_dict(self) -> dict:
        # Its dicts hold numbers only, so one level of copying is asdict's result at a tenth of its time.
        return self.__dict__ | {"features": dict(self.features), "oracle": None if self.oracle is None else dict(self.oracle)}


class Policy:
    name = "base"
    first = False  # True: the strong drafter drafts first, and alone() says whether it plays the step alone

    def alone(self, feats: dict, step: int) -> Decision | None:
        """Given the strong drafter's tree (its features), a Decision to verify it alone (a tree-strong
        step: no weak pool), or None to draft the weak pool and decide() the call on it."""
        return None

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


class WhenEmpty(Policy):
    """Call only where the weak tree would send the target nothing (weak_n = 0: prompt lookup found no
    match, or no node is worth its verification). There a call cannot displace a weak token: in the
    qwen-coder ngram+0.5B oracle steps a call raised the step's tokens/s on 75% of such steps against 30%
    of the others. Elsewhere the weak drafter runs alone."""
    name = "when-empty"

    def decide(self, feats, step):
        n0 = feats.get("weak_n", 0)
        call = n0 == 0
        return Decision(call, self.name, f"the weak tree would send {n0} node{'s' if n0 != 1 else ''}: "
                        + ("call the strong drafter" if call else "no call"), features=feats)


class WhenUnsure(Policy):
    """Call where the weak tree expects fewer than `below` tokens (weak_expected: 1 + the path
    probabilities of the N0 nodes it would send, the bonus token included); below = 2: where the weak
    tree expects less than one accepted draft token. It widens when-empty (an empty weak tree expects
    exactly 1): on the qwen-coder ngram+0.5B training oracle steps with a non-empty weak tree, a call
    paid on 65% of those that expected under 2 tokens and on 11% of the others. (Those rows came from
    the oracle before its strong branch was fixed; on the clock it did not beat when-empty there.)"""
    name = "when-unsure"

    def __init__(self, below: float = 2.0):
        if not 1.0 <= below <= 64.0:
            raise ValueError(f"when-unsure needs a threshold in [1, 64] tokens, got {below}")
        self.below = below

    def decide(self, feats, step):
        expected = feats.get("weak_expected", 1.0)
        call = expected < self.below
        return Decision(call, self.name, f"the weak tree expects {expected:.2f} tokens "
                        f"{'<' if call else '>='} {self.below:g}: " + ("call the strong drafter" if call else "no call"),
                        features=feats)


class WhenMatched(Policy):
    """For prompt lookup in the strong role: call only where it matches an n-gram at the root
    (strong_match >= 1, read without running it). Without a match there it has no proposal at the
    root, and what it adds deeper rarely pays for the bigger tree: on 419 SmolLM2 weak+ngram training
    oracle steps (AVX-512, docs/bench/matched/) it matched nothing on 58% of them, where a call added
    0.04 tokens for 8% more time; replayed, calling only on a match ran 1.114x `never` against
    `always` 1.100x and when-unsure 1.102x (hindsight's best calls 1.185x). On the clock the arms
    lie within 2% of each other (README, "A free look before calling prompt lookup"). A model strong
    drafter cannot be read without running, so this policy calls it every step."""
    name = "when-matched"

    def decide(self, feats, step):
        n = feats.get("strong_match")
        if n is None:
            return Decision(True, self.name, "the strong drafter is a model (no free look at the root): call",
                            features=feats)
        call = n >= 1
        what = f"matches a {n}-gram" if call else "matches nothing"
        return Decision(call, self.name, f"prompt lookup {what} at the root: "
                        + ("call the strong drafter" if call else "no call"), features=feats)


class StrongFirst(Policy):
    """For a strong drafter cheaper than the weak one (prompt lookup in the strong role): it drafts
    first, and where its tree expects at least `sure` tokens (the bonus token included) that tree is
    verified alone, with no weak pool; elsewhere the weak pool is drafted and when-unsure decides the
    call on it. In SmolLM2 weak+ngram, `tree-strong` ran as fast as `always` at 15% less tau: on a
    step where a long lookup match continues, the weak pool costs time and adds little, and on one
    without a match the weak pool is the step's tokens. (Held out there it tied `always`: only ~9% of
    steps were that sure, and the weak drafter is ~6% of a step; README, docs/bench/live17-weak-ngram.)"""
    name = "strong-first"
    first = True

    def __init__(self, sure: float = 3.0, unsure: float = 2.0):
        if not 1.0 <= sure <= 64.0:
            raise ValueError(f"strong-first needs a threshold in [1, 64] tokens, got {sure}")
        self.sure, self.rest = sure, WhenUnsure(unsure)

    def alone(self, feats, step):
        expected = feats.get("weak_expected", 1.0)  # features() of the strong tree: what it expects
        if expected < self.sure:
            return None
        return Decision(False, self.name, f"the strong tree expects {expected:.2f} tokens >= {self.sure:g}: "
                        "it drafts the step alone", features=feats)

    def decide(self, feats, step):
        d = self.rest.decide(feats, step)
        d.policy, d.reason = self.name, f"the strong tree expects < {self.sure:g} tokens; {d.reason}"
        return d


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
    def from_dict(cls, d: dict, source: str = "") -> "LearnedPolicy":
        return cls(tuple(d["features"]), d["mean"], d["std"], d["weights"], d["bias"], d["threshold"], source=source)

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


@dataclass
class Trees:
    """A boosted ensemble of small regression trees (scikit-learn's GradientBoostingRegressor, exported
    as plain lists): prediction = base + rate * sum of the leaf each tree's splits lead to."""
    base: float
    rate: float
    trees: list  # each: {"left", "right", "feature", "threshold", "value"}, sklearn's tree_ arrays

    def predict(self, x: list[float]) -> float:
        total = 0.0
        for t in self.trees:
            i = 0
            while t["left"][i] != -1:
                i = t["left"][i] if x[t["feature"][i]] <= t["threshold"][i] else t["right"][i]
            total += t["value"][i]
        return self.base + self.rate * total


@dataclass
class GainPolicy(Policy):
    """The gain scheduler. Calling pays when what it adds beats what its time would buy at the
    generation's own pace: (tokens a call adds) > kappa * (tokens/s so far) * (a call's extra seconds).
      - tokens it adds: measured online, the mean over the last calls of (accepted tokens - a0), where
        a0, what the weak tree alone would have given, is predicted from the pool's features by small
        boosted trees learned from oracle steps (before any call: the training mean);
      - tokens/s so far and the extra seconds of a call: this generation's, on this device (before any
        call, strong_units target one-token forwards from the measured cost curve).
    So it keeps calling where the strong drafter has been paying (math, chat without copies) and stops
    where prompt lookup already covers the text, and the same file calls less on a device where the
    strong drafter is dear. Every `explore` steps without a call it calls once to look again. kappa and
    explore are tuned offline by replaying oracle steps (both branches measured) for tokens/s."""
    features: tuple       # the a0 model's inputs (the weak pool's; history-free)
    a0: Trees
    kappa: float
    explore: int
    prior_gain: float     # tokens a call adds, before this generation has made one
    strong_units: float   # a call's extra seconds before one is measured, in target one-token forwards
    first_units: float = 0.0  # a generation's first call's one-time extra (the strong prefill), same unit
    name: str = "learned"
    source: str = ""

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "GainPolicy":
        return cls(tuple(d["features"]), Trees(**d["a0"]), d["kappa"], d["explore"], d["prior_gain"],
                   d["strong_units"], d.get("first_units", 0.0), source=source)

    def expected(self, feats: dict) -> float:
        """a0: tokens the weak tree alone is expected to give this step (the bonus included)."""
        return max(1.0, self.a0.predict([float(feats[f]) for f in self.features]))

    def terms(self, feats: dict) -> tuple[float, float, float, float]:
        """(a0, tokens a call adds, tokens/s so far, extra seconds of a call); without a cost curve,
        seconds are target forwards."""
        a0 = self.expected(feats)
        gain = feats.get("recent_gain", 0.0) if feats.get("calls_seen") else self.prior_gain
        c0, c1 = step_seconds(feats, self.strong_units)
        rate = (feats.get("rate_so_far") or a0 / c0) if timed(feats) else a0 / c0  # untimed: per target forward
        return a0, gain, rate, c1 - c0 + self.one_time(feats, a0, gain)

    def one_time(self, feats: dict, a0: float, gain: float) -> float:
        """The share of the strong drafter's prompt prefill a first call carries: the prefill spread
        over the calls the tokens left would take at a0 + gain tokens a call (none once one was made)."""
        if feats.get("calls_seen") or self.first_units <= 0:
            return 0.0
        unit = feats["t1_s"] if timed(feats) else 1.0
        return prefill_share(self.first_units * unit, feats.get("tokens_left") or 0, a0 + gain)

    def prob(self, feats: dict) -> float:
        """The score: tokens a call adds over the tokens its time would buy (calls above kappa)."""
        return gain_score(*self.terms(feats)[1:])

    def decide(self, feats: dict, step: int) -> Decision:
        a0, gain, rate, extra = self.terms(feats)
        score = gain_score(gain, rate, extra)
        due = feats.get("steps_since_call", 0.0) >= math.log1p(self.explore)
        call = score > self.kappa or due
        per, unit = ("s", "s") if timed(feats) else ("target forward", "target forwards")
        seen = "recent calls added" if feats.get("calls_seen") else "a call adds (training mean)"
        share = self.one_time(feats, a0, gain)
        reason = (f"{seen} {gain:+.2f} tokens to the weak tree's expected {a0:.2f}; at {rate:.2f} tokens per {per} "
                  f"the call's {extra:.3f} {unit}"
                  + (f" ({share:.3f} of them its share of the strong drafter's prefill)" if share else "")
                  + f" would buy {rate * extra:.2f}: ratio {score:.2f} "
                  f"{'>' if score > self.kappa else '<='} kappa {self.kappa:.2f}"
                  + (f"; {self.explore} steps without a call: look again" if due and score <= self.kappa else ""))
        return Decision(call, self.name, reason, score=score, threshold=self.kappa, features=feats, expected=a0)


ARMS = {"tree-strong": "solo", "treegraft:never": "never", "treegraft:always": "always",
        "treegraft:when-empty": "when-empty", "treegraft:when-unsure": "when-unsure",
        "treegraft:when-matched": "when-matched",
        "treegraft:strong-first": "strong-first", "treegraft:learned": "gain"}


@dataclass
class ArmChoice(Policy):
    """The learned scheduler's first decision, made once per pair: which way of using the two drafters
    was fastest in tokens/s, measured on validation prompts on this kind of device (`scheduler
    choose`): the gain rule per step, or a fixed arm (never call, always call, call where the weak tree
    is empty or unsure, or where prompt lookup in the strong role matches at the root; or the strong
    drafter alone, where it drafts cheaply enough that a weak pool only costs time, or alone only where
    its tree is sure: strong-first). Per step it plays that arm."""
    arm: str            # one of ARMS' values
    rates: dict         # the arms' measured tokens/s on the validation prompts
    gain: GainPolicy
    name: str = "learned"
    source: str = ""
    unsure: float = 2.0  # the when-unsure arm's threshold (tokens the weak tree expects)
    sure: float = 3.0    # the strong-first arm's threshold (tokens the strong tree expects)
    pooled: dict | None = None  # with earlier validation runs: each arm's speed relative to its run's fixed arms
    certainty: float | None = None  # how often this arm ranked first over redraws of the validation prompts
    int8: str = "none"  # which drafters ran in int8 when it was chosen (its own arm: their costs differ)
    hardware: str = ""  # the machine class it was chosen on, where that class has its own arm

    def __post_init__(self):
        if self.arm not in ARMS.values():
            raise ValueError(f"unknown arm {self.arm!r}; choose one of {', '.join(ARMS.values())}")
        self.first = self.arm in ("solo", "strong-first")
        self.rule = {"gain": self.gain, "when-empty": WhenEmpty(), "when-unsure": WhenUnsure(self.unsure),
                     "when-matched": WhenMatched(),
                     "strong-first": StrongFirst(self.sure, self.unsure)}.get(self.arm)

    def why(self) -> str:
        sure = "" if self.certainty is None else f"; first in {self.certainty:.0%} of redraws of those prompts"
        sure += "" if self.int8 == "none" else f"; chosen with the {self.int8} drafter{'s' * (self.int8 == 'both')} in int8"
        sure += f"; chosen on {self.hardware} machines" if self.hardware else ""
        if self.pooled:
            rel = ", ".join(f"{a} {r:.3f}" for a, r in sorted(self.pooled.items(), key=lambda kv: -kv[1]))
            return (f"arm '{self.arm}': the fastest for this pair on validation prompts, over several runs "
                    f"(speed relative to each run's fixed arms: {rel}{sure})")
        rates = ", ".join(f"{a} {r:.2f}" for a, r in sorted(self.rates.items(), key=lambda kv: -kv[1]))
        return f"arm '{self.arm}': the fastest for this pair on validation prompts (tokens/s: {rates}{sure})"

    def alone(self, feats: dict, step: int) -> Decision | None:
        if self.arm == "solo":
            return Decision(False, self.name, f"the strong drafter drafts alone; {self.why()}", features=feats)
        return self.mine(self.rule.alone(feats, step)) if self.rule else None

    def decide(self, feats: dict, step: int) -> Decision:
        if self.rule:
            return self.mine(self.rule.decide(feats, step))
        what = {"never": "no strong call", "always": "strong call every step"}[self.arm]
        return Decision(self.arm == "always", self.name, f"{what}; {self.why()}", features=feats)

    def mine(self, d: Decision | None) -> Decision | None:
        if d is not None:
            d.policy, d.reason = self.name, f"{d.reason} [{self.why()}]"
        return d


def gain_score(gain: float, rate: float, extra: float) -> float:
    """Tokens a call adds over the tokens its extra time would buy at `rate` (GainPolicy calls above kappa)."""
    return gain / max(1e-9, rate * extra)


def prefill_share(prefill: float, tokens_left: float, per_call: float) -> float:
    """A one-time cost spread over the calls the tokens left would take at per_call tokens a call."""
    return prefill / max(1.0, tokens_left / max(1.0, per_call))


def timed(feats: dict) -> bool:
    """Whether the features carry this device's seconds (the engine had a cost curve)."""
    return (feats.get("c0_s") or 0.0) > 0 and (feats.get("t1_s") or 0.0) > 0


def step_seconds(feats: dict, strong_units: float) -> tuple[float, float]:
    """A step's expected seconds without and with a strong call on this device: c0_s, and c0_s plus
    the recent calls' measured extra (or, before any, strong_units target one-token forwards). With no
    cost curve (no t1_s), in target forwards instead."""
    if not timed(feats):
        return 1.0, 1.0 + strong_units
    return feats["c0_s"], feats["c0_s"] + (feats.get("strong_s") or strong_units * feats["t1_s"])


def load_learned(path: str | Path | None = None, int8: str = "none", hardware: str = "") -> Policy:
    """A scheduler file: the gain scheduler ("kind": "gain") or the earlier logistic one. Its arm is the
    one chosen for these drafters' precision: `arm_int8[int8]` where int8 drafters had their own
    validation run; else the one chosen on this class of machine (`arm_hardware[hardware]`, e.g.
    "cpu-avx512") where it had its own; else `arm`."""
    p = Path(path) if path else DEFAULT_SCHEDULER
    if not p.exists():
        raise FileNotFoundError(f"no learned scheduler at {p}; train one with `python -m treegraft scheduler train`")
    d = json.loads(p.read_text())
    policy = (GainPolicy if d.get("kind") == "gain" else LearnedPolicy).from_dict(d, source=str(p))
    own = (d.get("arm_int8") or {}).get(int8) if int8 != "none" else None
    here = None if own else (d.get("arm_hardware") or {}).get(hardware)
    if own or here or "arm" in d:
        a = own or here or d["arm"]
        score = a.get("pooled") or a["rates"]
        return ArmChoice(a["arm"], a["rates"], policy, source=str(p), unsure=a.get("unsure", 2.0),
                         sure=a.get("sure", 3.0), pooled=a.get("pooled"),
                         certainty=(a.get("first") or {}).get(max(score, key=score.get)),
                         int8=int8 if own else "none", hardware=hardware if here else "")
    return policy


def make_policy(name: str, every_k: int = 2, path: str | None = None, unsure: float = 2.0,
                sure: float = 3.0, int8: str = "none", hardware: str = "") -> Policy:
    if name == "never":
        return Never()
    if name == "always":
        return Always()
    if name == "every-k":
        return EveryK(every_k)
    if name == "when-empty":
        return WhenEmpty()
    if name == "when-unsure":
        return WhenUnsure(unsure)
    if name == "when-matched":
        return WhenMatched()
    if name == "strong-first":
        return StrongFirst(sure, unsure)
    if name == "oracle":
        return Oracle()
    if name == "learned":
        return load_learned(path, int8, hardware)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")

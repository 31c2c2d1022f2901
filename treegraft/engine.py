"""The decoding loop: draft -> schedule -> graft -> select -> verify -> commit, one StepRecord per
target forward. Methods: ar, tree-weak, tree-strong, treegraft."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from .budget import LiveCurve, another_level_pays, choose_budget
from .calibrate import Calibration
from .costs import target_curve
from .draft import draft_tree
from .fastpath import hardware_class
from .graft import GraftConfig, recover, reselect, rescore, graft
from .kv import make_runner
from .models import Trio, sync
from .record import StepRecord
from .schedule import Decision, History, Policy, default_policy, features, make_policy, scheduler_for
from .tree import DraftTree, select
from .vocab import admit
from .verify import accept_greedy, accept_sample, path_confidence

METHODS = ("ar", "tree-weak", "tree-strong", "treegraft")
LIMITS = {"budget": (1, 512), "depth": (1, 32), "topk": (1, 64), "max_new_tokens": (1, 100_000)}


class ConfigError(ValueError):
    """A generation setting or prompt is out of range; the message names it and the range."""


AUTO_CAP = 64  # the most nodes `--budget auto` may send


@dataclass
class GenConfig:
    """One generation's settings. The field defaults are a plain fixed tree (N = 32, `always`) that
    the tests pin down; `GenConfig.defaults()` is what the CLI, the bench and `treegraft.generate` run."""
    method: str = "treegraft"
    max_new_tokens: int = 128
    budget: int = 32                  # N; with auto_budget the most N may be
    auto_budget: bool = False         # choose N per step from the measured cost curve (treegraft.budget)
    depth: int = 6
    topk: int = 4
    width: int | None = None          # frontier nodes expanded per level (default: topk)
    temperature: float = 0.0          # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    policy: str = "always"
    every_k: int = 2
    unsure: float = 2.0               # when-unsure: call where the weak tree expects fewer tokens than this
    sure: float = 3.0                 # strong-first: the strong tree alone where it expects at least this
    scheduler_path: str | None = None
    graft: GraftConfig = field(default_factory=GraftConfig)
    calibrate: bool = False           # score nodes by measured acceptance rates (treegraft.calibrate)
    temper: bool = False              # under sampling, neural drafters score at the target's temperature
    record_stages: bool = True        # keep per-stage snapshots of the tree (the app replays them)

    @classmethod
    def defaults(cls, **settings) -> GenConfig:
        """The settings `python -m treegraft generate` runs with no options: `--budget auto` (at most
        AUTO_CAP nodes, chosen per step from this machine's cost curve) and the shipped scheduler's
        policy. A fixed tree of 32 runs slower than plain decoding on a 2-core CPU, where the tree
        that pays holds 3-6 nodes. A `budget` given without `auto_budget` is a fixed one, as on the CLI."""
        base = dict(budget=AUTO_CAP, auto_budget="budget" not in settings, policy=default_policy())
        return cls(**(base | settings))

    def check(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        for name, (lo, hi) in LIMITS.items():
            v = getattr(self, name)
            if not isinstance(v, int) or not lo <= v <= hi:
                raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
        if self.width is not None and not 1 <= self.width <= 64:
            raise ConfigError(f"width must be in [1, 64], got {self.width}")
        if not (self.temperature >= 0 and self.temperature <= 100):
            raise ConfigError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 1 <= self.unsure <= 64:
            raise ConfigError(f"unsure must be in [1, 64] tokens, got {self.unsure}")
        if not 1 <= self.sure <= 64:
            raise ConfigError(f"sure must be in [1, 64] tokens, got {self.sure}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.method == "treegraft" and self.policy == "oracle" and self.temperature > 0:
            # It samples both branches from one random stream and keeps the one that accepted more: the
            # branch kept depends on the draw, so what it emits is not a draw from the target.
            raise ConfigError("policy 'oracle' is greedy only (temperature 0): it keeps whichever of two sampled "
                              "branches accepted more, which skews the sample; choose another policy to sample")
        try:
            self.graft.check()
        except ValueError as e:
            raise ConfigError(str(e)) from None


class Clock:
    """Phase timer; synchronises the device so each phase is charged its own kernels."""

    def __init__(self, device):
        self.device, self.times, self.hidden = device, {}, 0.0
        sync(device)
        self.t = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds the step has spent so far (all phases plus the running one), less hidden ones."""
        sync(self.device)
        return sum(self.times.values()) + (time.perf_counter() - self.t) - self.hidden

    def hide(self, seconds: float) -> None:
        """Keep `seconds` out of elapsed() (a branch the step will not keep), not out of the phases."""
        self.hidden += seconds

    def lap(self, phase: str) -> float:
        sync(self.device)
        now = time.perf_counter()
        dt = now - self.t
        self.times[phase] = self.times.get(phase, 0.0) + dt
        self.t = now
        return dt


class Engine:
    def __init__(self, trio: Trio, cfg: GenConfig, policy: Policy | None = None):
        cfg.check()
        self.trio, self.cfg = trio, cfg
        self.target = make_runner(trio.target, "target")
        self.weak = make_runner(trio.weak, "weak", features_from=self.target)
        self.strong = make_runner(trio.strong, "strong", features_from=self.target)
        try:
            self.strong.limit_context(cfg.graft.strong_context)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        scheduler = cfg.scheduler_path or scheduler_for(trio.trio, trio.pair)
        self.policy = policy or (make_policy(cfg.policy, cfg.every_k, scheduler, cfg.unsure, cfg.sure, trio.int8,
                                             hardware_class(trio.device)) if cfg.method == "treegraft" else None)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.curve = LiveCurve(target_curve(trio)) if cfg.auto_budget and cfg.method != "ar" else None
        # The scheduler weighs seconds on this device: it reads the same measured curve, fixed budget or not.
        weighs = cfg.method == "treegraft" and cfg.policy in ("learned", "oracle")
        self.cost_curve = LiveCurve(target_curve(trio)) if self.curve is None and weighs else self.curve
        # Sampling at T accepts a path with the product of p_T along it, which q_T estimates; a measured
        # hit rate (prompt lookup) is already on the acceptance scale.
        for r in (self.weak, self.strong):
            tempered = cfg.temper and cfg.temperature > 0 and not getattr(r.model, "calibrated", False)
            r.score_temperature = cfg.temperature if tempered else 1.0
        self.calibration = Calibration(skip=tuple(r.name for r in (self.weak, self.strong)
                                                  if getattr(r.model, "calibrated", False)))
        self.seq: list[int] = []
        self.prompt_len = 0
        self.records: list[StepRecord] = []

    # ---------------------------------------------------------------- lifecycle
    def start(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if len(prompt_ids) >= self.trio.context_len:
            raise ConfigError(f"the prompt has {len(prompt_ids)} tokens but the target's context window is "
                              f"{self.trio.context_len}; shorten it")
        for r in (self.target, self.weak, self.strong):
            r.reset()
        for r in (self.weak, self.strong):
            admit(r.model, prompt_ids)  # a cut head's rows for this prompt's tokens (treegraft.vocab)
        self.seq, self.prompt_len, self.records = list(prompt_ids), len(prompt_ids), []
        self.history = History()
        self.calibration.reset()
        if self.cost_curve is not None:  # the budget's curve too, where there is one: the same object
            self.cost_curve.reset()
        self.generator.manual_seed(self.cfg.seed)

    @property
    def new_tokens(self) -> list[int]:
        return self.seq[self.prompt_len:]

    @property
    def done(self) -> bool:
        new = self.new_tokens
        return (len(new) >= self.cfg.max_new_tokens or (new and new[-1] in self.trio.eos_ids)
                or len(self.seq) >= self.trio.context_len)

    def generate(self, prompt_ids: list[int]):
        self.start(prompt_ids)
        while not self.done:
            yield self.step()

    # ---------------------------------------------------------------- one step
    def step(self) -> StepRecord:
        cfg, seq, clock = self.cfg, self.seq, Clock(self.trio.device)
        fw0 = {r.name: r.forwards for r in (self.target, self.weak, self.strong)}
        # Accepted tokens + bonus must fit the context window.
        depth = min(cfg.depth, self.trio.context_len - len(seq) - 1)
        rec = StepRecord(len(self.records), cfg.method, seq[-1], len(seq) - 1)
        decision = None  # the scheduler's Decision (treegraft only); the record keeps it as a dict
        if self.target.keep_features and self.target.n < len(seq) - 1 and cfg.method != "ar":
            self.target.catch_up(seq[:-1])  # a feature drafter reads the prompt's target features
            clock.lap("prefill")
        if cfg.method == "ar" or depth < 1:
            tree, selected = DraftTree(), []
        else:
            tree, decision = self.pool(rec, depth, clock)
            if decision is not None and decision.call:
                if cfg.policy == "oracle":
                    return self.oracle_step(rec, decision, tree, depth, clock, fw0)
                self.refine(tree, depth, rec, clock)
            rec.budget = self.budget(tree, depth, clock)
            selected = select(tree, rec.budget, depth)
            self.snap(rec, "selected", tree)
        logits, _ = self.verify(tree, selected, clock)
        path, bonus = self.accept(tree, selected, logits)
        return self.finish(rec, decision, tree, selected, path, bonus, clock, fw0,
                           self.confidence(logits, selected, path))

    def pool(self, rec: StepRecord, depth: int, clock: Clock) -> tuple[DraftTree, Decision | None]:
        """The step's first tree and the scheduler's decision on it: the weak pool, or the strong
        drafter's tree played alone (tree-strong; with a policy that drafts strong first, where
        alone() says so; otherwise that tree is dropped and the weak pool drafted)."""
        cfg = self.cfg
        if cfg.method != "treegraft":
            return self.draft(self.strong if cfg.method == "tree-strong" else self.weak, rec, depth, clock), None
        if self.policy.first:
            mark = self.strong.mark()
            tree = self.draft(self.strong, rec, depth, clock)
            decision = self.policy.alone(self.pool_features(tree, depth, clock), len(self.records))
            clock.lap("schedule")
            if decision is not None:
                rec.strong_called = True
                return tree, decision
            self.strong.commit([])
            self.strong.restore(mark)  # the root too: the strong pass reads it again with the weak nodes
            rec.stages = []
        tree = self.draft(self.weak, rec, depth, clock)
        return tree, self.decide(tree, depth, clock)

    def draft(self, drafter, rec: StepRecord, depth: int, clock: Clock) -> DraftTree:
        cfg = self.cfg
        tree, _ = draft_tree(drafter, self.seq, depth, cfg.topk, cfg.width, role=drafter.name,
                             more=self.more(depth, clock), scale=self.calibration.score if cfg.calibrate else None)
        clock.lap(f"draft_{drafter.name}")
        self.snap(rec, "weak pool" if drafter is self.weak else "strong pool", tree)
        return tree

    def budget(self, tree: DraftTree, depth: int, clock: Clock) -> int:
        """N: fixed, or (auto) the most expected tokens per second on this machine's cost curve."""
        if self.curve is None:
            return self.cfg.budget
        return choose_budget(tree, self.curve, clock.elapsed(), self.cfg.budget, depth)[0]

    def verify(self, tree: DraftTree, selected: list[int], clock: Clock) -> tuple[torch.Tensor, float]:
        """One target forward over the root and the selected nodes: (logits, its seconds). The seconds
        rescale the cost curve, except a prompt's prefill (step 0, or a catch-up of more than the root)."""
        pending = len(self.seq) - self.target.n
        logits = self.target.catch_up(self.seq, selected, tree)
        seconds = clock.lap("verify")
        if self.cost_curve is not None and self.records and pending == 1:
            self.cost_curve.observe(1 + len(selected), seconds)
        return logits, seconds

    def more(self, depth: int, clock: Clock, first_level_s: float | None = None):
        """With --budget auto, a drafter level is run only if it pays (treegraft.budget); each level
        is assumed to cost what the previous forward of the same drafter did (`first_level_s` for
        the first, else the time since this call)."""
        if self.curve is None:
            return None
        last = [clock.elapsed() - (first_level_s or 0.0)]

        def pays(tree: DraftTree, parents: list[int]) -> bool:
            now = clock.elapsed()
            level_s, last[0] = now - last[0], now
            return another_level_pays(tree, parents, self.curve, now, level_s, self.cfg.budget, depth)
        return pays

    def pool_features(self, tree: DraftTree, depth: int, clock: Clock) -> dict:
        return features(tree, self.history, depth, self.cost_curve, clock.elapsed(), self.cfg.budget,
                        self.cfg.auto_budget, self.cfg.max_new_tokens - len(self.new_tokens),
                        self.strong.root_match(self.seq))

    def decide(self, tree: DraftTree, depth: int, clock: Clock) -> Decision:
        decision = self.policy.decide(self.pool_features(tree, depth, clock), len(self.records))
        clock.lap("schedule")
        return decision

    def refine(self, tree: DraftTree, depth: int, rec: StepRecord, clock: Clock) -> None:
        """The strong drafter's pass: rescore -> recover -> reselect -> graft (non-destructive)."""
        g, root_pos = self.cfg.graft, len(self.seq) - 1
        tree.weak_calibrated = bool(getattr(self.weak.model, "calibrated", False))
        rows = rescore(self.strong, tree, self.seq, g)
        rec.stage_times["rescore"] = clock.lap("draft_strong")
        self.snap(rec, "rescored", tree)
        recover(tree, rows, g, tree.rows["weak"])
        rec.stage_times["recover"] = clock.lap("draft_strong")
        self.snap(rec, "recovered", tree)
        points = reselect(tree, rows, g, depth)
        graft(self.strong, tree, points, root_pos, g, depth,
              more=self.more(depth, clock, first_level_s=rec.stage_times["rescore"]))
        rec.stage_times["graft"] = clock.lap("draft_strong")
        self.snap(rec, "grafted", tree)
        rec.strong_called = True

    def accept(self, tree, selected, logits):
        if self.cfg.temperature == 0:
            return accept_greedy(tree, selected, logits)
        return accept_sample(tree, selected, logits, self.generator, self.cfg.temperature, self.cfg.top_p)

    def confidence(self, logits: torch.Tensor, selected: list[int], path: list[int]) -> list[float]:
        """The target's sureness along the accepted path, for the scheduler's next decision (so only
        treegraft pays for it)."""
        return path_confidence(logits, selected, path) if self.cfg.method == "treegraft" else []

    def finish(self, rec, decision, tree, selected, path, bonus, clock, fw0, confidence) -> StepRecord:
        spent = clock.elapsed()
        for r in (self.target, self.weak, self.strong):
            r.commit(path)
        for i in path:
            tree.nodes[i].accepted = True
        if self.cfg.calibrate:
            self.calibration.update(tree, path, bonus)
        new = [tree.nodes[i].token for i in path] + [bonus]
        new = self.cut(new)
        self.seq += new
        clock.lap("overhead")
        rec.nodes, rec.selected, rec.accepted, rec.bonus, rec.new_tokens = tree.snapshot(), selected, path, bonus, new
        self.snap(rec, "verified", tree)
        rec.times = clock.times
        rec.forwards = {r.name: r.forwards - fw0[r.name] for r in (self.target, self.weak, self.strong)}
        if self.trio.tokenizer is not None:
            rec.text = self.trio.tokenizer.decode(new)
        rec.decision = decision.to_dict() if decision is not None else None
        self.history.accept_lens.append(rec.accept_len)
        self.history.strong_calls.append(rec.strong_called)
        self.history.position = len(self.new_tokens)
        self.history.target_conf = confidence
        self.remember(rec, decision, tree, path, spent)
        self.records.append(rec)
        return rec

    def remember(self, rec: StepRecord, decision: Decision | None, tree: DraftTree, path: list[int],
                 spent: float) -> None:
        """What a strong call bought and cost, for the scheduler's next decisions: accepted nodes it
        made, tokens over the weak tree's expectation, and seconds beyond the step without it (c0_s;
        both measured directly by the oracle)."""
        h = self.history
        o = decision.oracle if decision is not None else None
        # One-time costs are not a call's price: the first step holds the target's prompt prefill,
        # a generation's first strong call the strong drafter's.
        first_call = not any(h.strong_calls[:-1]) if o is None else rec.step == 0
        if rec.step > 0:
            h.tokens += len(rec.new_tokens)
            h.seconds += (o["c1"] if o["call"] else o["c0"]) if o else spent  # the oracle's kept branch
        if o:
            h.strong_tokens.append(o["strong_made"])
            h.gains.append(o["a1"] - o["a0"])
            if not first_call:
                h.strong_extra_s.append(max(0.0, o["c1"] - o["c0"]))
        elif rec.strong_called and decision is not None and decision.call:  # not a solo step
            h.strong_tokens.append(made_by_strong(tree, path))
            expected = decision.expected if decision.expected is not None else decision.features["weak_expected"]
            h.gains.append(len(path) + 1 - expected)
            c0 = decision.features.get("c0_s") or 0.0
            if c0 > 0 and not first_call:
                h.strong_extra_s.append(max(0.0, spent - c0))

    def cut(self, new: list[int]) -> list[int]:
        """Stop at the first eos and at max_new_tokens: output equals what the target would emit."""
        room = min(self.cfg.max_new_tokens - len(self.new_tokens), self.trio.context_len - len(self.seq))
        new = new[:max(0, room)]
        for j, t in enumerate(new):
            if t in self.trio.eos_ids:
                return new[:j + 1]
        return new

    def snap(self, rec: StepRecord, name: str, tree: DraftTree) -> None:
        if self.cfg.record_stages:
            rec.stages.append({"name": name, "nodes": tree.snapshot()})

    # ---------------------------------------------------------------- the oracle (upper bound)
    def oracle_step(self, rec, decision, tree, depth, clock, fw0) -> StepRecord:
        """The exact answer for this state: run the step without and with the strong
        drafter from the same state (same weak pool, same caches, same random stream) and keep the
        branch with more tokens per second. What only the oracle paid (the branch it did not keep, the
        rewinds, and the clock reading that chose the kept branch) is reported in
        decision['oracle']['extra_s'] so the upper bound can be quoted net of it; what every policy pays (the weak pool, the schedule, a feature drafter's prompt prefill,
        the commit) stays charged."""
        mark, before, weak_s = self.target.mark(), self.generator.get_state(), clock.times.get("draft_weak", 0.0)
        plain = self.run_branch(copy.deepcopy(tree), depth, clock)
        self.rewind(mark, before)
        rewind_s = clock.lap("verify")
        # The strong branch must be the step `always` would play: sized and grafted on the seconds
        # this step spent before the branches split, not on those plus the plain branch's verification.
        clock.hide(plain.verify_s + rewind_s)
        strong_fw = self.strong.forwards
        self.refine(tree, depth, rec, clock)
        refine_s = sum(rec.stage_times.values())
        strong_fw = self.strong.forwards - strong_fw
        strong = self.run_branch(tree, depth, clock, rec)
        a0, a1 = len(plain.path) + 1, len(strong.path) + 1
        c0, c1 = weak_s + plain.verify_s, weak_s + refine_s + strong.verify_s
        use_strong = a1 / c1 > a0 / c0
        decision.call = use_strong
        decision.oracle = {"a0": a0, "c0": c0, "a1": a1, "c1": c1, "delta": a1 / c1 - a0 / c0,
                           "strong_made": made_by_strong(strong.tree, strong.path),
                           "call": use_strong, "n0": len(plain.selected), "n1": len(strong.selected),
                           "weak_s": weak_s, "verify0_s": plain.verify_s, "verify1_s": strong.verify_s,
                           "refine_s": refine_s, "strong_forwards": strong_fw,
                           "prefill_s": clock.times.get("prefill", 0.0)}
        decision.reason = (f"oracle: with strong {a1} tokens / {c1 * 1e3:.1f} ms vs without {a0} / "
                           f"{c0 * 1e3:.1f} ms -> {'call' if use_strong else 'skip'}")
        kept = strong if use_strong else plain
        # The choice read each branch's verification off the clock once, and kept the one that read
        # faster: charging that reading would credit the oracle with the luck of the draw (on steps
        # where both branches send the same tree, it would pay the faster of two timings of one
        # forward). So the kept branch's forward runs again and that second reading is what is
        # charged; the reading that chose goes with the unkept branch into extra_s.
        extra = rewind_s + plain.verify_s + strong.verify_s + (0.0 if use_strong else refine_s)
        self.rewind(mark, kept.rng_after)
        if not use_strong:
            self.strong.commit([])
            rec.strong_called = False
            rec.stages = [s for s in rec.stages if s["name"] == "weak pool"]
            self.snap(rec, "selected", plain.tree)
        extra += clock.lap("verify")
        self.target.catch_up(self.seq, kept.selected, kept.tree)
        charged = clock.lap("verify")
        decision.oracle["extra_s"] = extra
        decision.oracle["kept_verify_s"] = charged
        decision.oracle["kept_s"] = (c1 - strong.verify_s if use_strong else c0 - plain.verify_s) + charged
        return self.finish(rec, decision, kept.tree, kept.selected, kept.path, kept.bonus, clock, fw0,
                           kept.confidence)

    def run_branch(self, tree: DraftTree, depth: int, clock: Clock, rec: StepRecord | None = None) -> "Branch":
        """Select, verify and accept on `tree` from the current state (the oracle plays two)."""
        selected = select(tree, self.budget(tree, depth, clock), depth)
        if rec is not None:
            self.snap(rec, "selected", tree)
        logits, verify_s = self.verify(tree, selected, clock)
        path, bonus = self.accept(tree, selected, logits)
        return Branch(tree, selected, path, bonus, verify_s, self.generator.get_state(),
                      self.confidence(logits, selected, path))

    def rewind(self, mark, rng_state) -> None:
        """Back to a state before verification: the target's cache and the random stream."""
        self.target.restore(mark)
        self.generator.set_state(rng_state)


def made_by_strong(tree: DraftTree, path: list[int]) -> int:
    """Accepted nodes that only the strong drafter proposed (recovered or grafted)."""
    return sum(tree.nodes[i].origin in ("graft", "recovered") for i in path)


@dataclass
class Branch:
    """One way of playing a step, verified but not committed."""
    tree: DraftTree
    selected: list[int]
    path: list[int]
    bonus: int
    verify_s: float
    rng_after: torch.Tensor  # the random stream after its acceptance
    confidence: list[float]  # path_confidence of its verification

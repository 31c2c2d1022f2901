"""The offline value system and the lightweight scheduler distilled from it.

  collect  run TreeGraft with the oracle policy: every step is played without and with the strong
           drafter from the same state; each row holds the cheap features, both accepted lengths,
           both measured costs and the timings a cost model is fitted from.
  train    fit a cost model (measured forward times -> seconds), label each step by the value of
           calling, delta = a1/c1 - a0/c0 (tokens per second gained), fit a logistic model on the
           features, tune its threshold on held-out prompts for simulated throughput, and write
           assets/scheduler/scheduler.json + REPORT.md.
  compare  side by side on held-out prompts: never / always / learned / oracle / tree-weak / tree-strong.

Collection, threshold tuning and comparison use disjoint prompts (offsets into the benchmark sets,
past the first prompts the benchmark suite uses)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .models import ASSETS, save_json
from .schedule import Decision

DEFAULT_SCHEDULER = ASSETS / "scheduler" / "scheduler.json"
FEATURES = ("root_top1", "root_entropy", "pool_mass_top16", "best_value", "confident_depth",
            "recent_accept", "recent_strong_gain", "position")


def default_policy() -> str:
    """`learned` once a distilled scheduler ships, `always` until then."""
    return "learned" if DEFAULT_SCHEDULER.exists() else "always"


# ---------------------------------------------------------------- the learned policy (online)

@dataclass
class LearnedPolicy:
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


# ---------------------------------------------------------------- value system (offline)

def fit_cost_model(rows: list[dict]) -> dict:
    """Seconds as a function of work, least squares over the measured oracle steps:
    verify = a + b * nodes; strong = c * strong forwards; weak draft = mean."""
    n = np.array([r["n0"] for r in rows] + [r["n1"] for r in rows], float)
    v = np.array([r["verify0_s"] for r in rows] + [r["verify1_s"] for r in rows], float)
    A = np.stack([np.ones_like(n), n], 1)
    (a, b), *_ = np.linalg.lstsq(A, v, rcond=None)
    f = np.array([r["strong_forwards"] for r in rows], float)
    s = np.array([r["refine_s"] for r in rows], float)
    c = float((f @ s) / max(1e-9, f @ f))
    return {"verify_base_s": float(a), "verify_per_node_s": float(b), "strong_per_forward_s": c,
            "weak_draft_s": float(np.median([r["weak_s"] for r in rows]))}


def model_costs(r: dict, cm: dict) -> tuple[float, float]:
    c0 = cm["weak_draft_s"] + cm["verify_base_s"] + cm["verify_per_node_s"] * r["n0"]
    c1 = c0 + cm["strong_per_forward_s"] * r["strong_forwards"] + cm["verify_per_node_s"] * (r["n1"] - r["n0"])
    return c0, c1


def label(rows: list[dict], cm: dict) -> np.ndarray:
    """delta = a1/c1 - a0/c0 under the cost model (measured costs are too noisy per step)."""
    out = []
    for r in rows:
        c0, c1 = model_costs(r, cm)
        out.append(r["a1"] / c1 - r["a0"] / c0)
    return np.array(out)


def fit_logistic(X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray, l2=1e-2, steps=3000, lr=0.5):
    """Plain gradient descent: a dozen features, a few thousand rows; no extra dependency."""
    w, b = np.zeros(X.shape[1]), 0.0
    sw = sample_weight / sample_weight.sum()
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(X @ w + b)))
        g = p - y
        w -= lr * (X.T @ (sw * g) + l2 * w)
        b -= lr * float(sw @ g)
    return w, b


def throughput(rows: list[dict], calls: np.ndarray, cm: dict) -> float:
    """Tokens per second if each step took the chosen branch (counterfactual: both are known)."""
    tokens = cost = 0.0
    for r, call in zip(rows, calls):
        c0, c1 = model_costs(r, cm)
        tokens += r["a1"] if call else r["a0"]
        cost += c1 if call else c0
    return tokens / cost


def train(rows: list[dict], holdout: float = 0.3, seed: int = 0) -> tuple[dict, str]:
    prompts = sorted({r["prompt_id"] for r in rows})
    rng = np.random.default_rng(seed)
    held = set(rng.choice(prompts, max(1, int(len(prompts) * holdout)), replace=False).tolist())
    tr = [r for r in rows if r["prompt_id"] not in held]
    te = [r for r in rows if r["prompt_id"] in held]
    cm = fit_cost_model(tr)
    d_tr, d_te = label(tr, cm), label(te, cm)
    X_tr = np.array([[r["features"][f] for f in FEATURES] for r in tr])
    X_te = np.array([[r["features"][f] for f in FEATURES] for r in te])
    mean, std = X_tr.mean(0), X_tr.std(0) + 1e-6
    # Weight each step by how much the decision matters (|delta|): a wrong call on a near-tie costs little.
    w, b = fit_logistic((X_tr - mean) / std, (d_tr > 0).astype(float), np.abs(d_tr) + 1e-3)
    p_te = 1 / (1 + np.exp(-(((X_te - mean) / std) @ w + b)))
    grid = np.unique(np.concatenate([[0.0, 1.0], np.quantile(p_te, np.linspace(0, 1, 41))]))
    scores = [(throughput(te, p_te > t, cm), -abs(t - 0.5), t) for t in grid]
    best_tp, _, threshold = max(scores)
    calls, truth = p_te > threshold, d_te > 0
    tp = int((calls & truth).sum())
    report = {
        "rows_train": len(tr), "rows_heldout": len(te), "prompts_train": len(prompts) - len(held),
        "prompts_heldout": len(held), "oracle_call_rate_train": float((d_tr > 0).mean()),
        "agreement_heldout": float((calls == truth).mean()),
        "precision_heldout": tp / max(1, int(calls.sum())), "recall_heldout": tp / max(1, int(truth.sum())),
        "call_rate_heldout": float(calls.mean()),
        "sim_tokens_per_s_heldout": {"never": throughput(te, np.zeros(len(te), bool), cm),
                                     "always": throughput(te, np.ones(len(te), bool), cm),
                                     "learned": best_tp, "oracle": throughput(te, truth, cm)},
        "cost_model": cm,
    }
    art = {"features": list(FEATURES), "mean": mean.tolist(), "std": std.tolist(), "weights": w.tolist(),
           "bias": float(b), "threshold": float(threshold), "report": report}
    policy = LearnedPolicy(tuple(FEATURES), art["mean"], art["std"], art["weights"], art["bias"], art["threshold"])
    # Recorded predictions: the shipped file must reproduce them exactly when loaded (tested).
    art["test_vectors"] = [{"features": r["features"], "prob": policy.prob(r["features"])} for r in te[:8]]
    return art, render_report(art)


def render_report(art: dict) -> str:
    r = art["report"]
    lines = ["# Learned scheduler: training report", "",
             f"Rows (steps): {r['rows_train']} train / {r['rows_heldout']} held out "
             f"({r['prompts_train']} / {r['prompts_heldout']} prompts). Oracle says 'call' on "
             f"{r['oracle_call_rate_train']:.0%} of training steps.", "",
             "| held-out metric | value |", "|---|---|",
             f"| agreement with the oracle | {r['agreement_heldout']:.1%} |",
             f"| precision (call) | {r['precision_heldout']:.1%} |",
             f"| recall (call) | {r['recall_heldout']:.1%} |",
             f"| call rate | {r['call_rate_heldout']:.1%} |",
             f"| threshold | {art['threshold']:.3f} |", "",
             "Simulated throughput on held-out steps under the fitted cost model (tokens/s; each step",
             "takes the branch the policy picks; both branches were measured by the oracle):", "",
             "| policy | tokens/s |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in r["sim_tokens_per_s_heldout"].items()]
    lines += ["", "Feature weights (standardised features; positive pushes toward calling):", "",
              "| feature | weight | mean | std |", "|---|---|---|---|"]
    lines += [f"| {f} | {w:+.3f} | {m:.3f} | {s:.3f} |"
              for f, w, m, s in zip(art["features"], art["weights"], art["mean"], art["std"])]
    lines += ["", f"Bias {art['bias']:+.3f}. Cost model (seconds): "
              + ", ".join(f"{k} {v:.4f}" for k, v in r["cost_model"].items())]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- commands

def held_prompts(per_suite: int, offset: int, suites: str):
    from .bench.prompts import SUITES, load_suite
    names = SUITES if suites == "all" else suites.split(",")
    out = []
    for name in names:
        out += load_suite(name, offset + per_suite)[offset:]
    return out


def cmd_collect(a) -> int:
    from .cli import encode_prompt, gen_config
    from .engine import Engine
    from .models import load_trio
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():  # resume: a prompt's rows are written together, so a prompt is done or absent
        done = {json.loads(line)["prompt_id"] for line in out.read_text().splitlines() if line.strip()}
    trio = load_trio(a.target, a.weak, a.strong, a.device, None if a.dtype == "auto" else a.dtype)
    a.policy = "oracle"
    cfg = gen_config(a, "treegraft")
    cfg.record_stages = False
    prompts = held_prompts(a.per_suite, a.offset, a.suites)
    for i, p in enumerate(prompts):
        if p.id in done:
            continue
        engine = Engine(trio, cfg)
        rows = []
        for rec in engine.generate(encode_prompt(trio.tokenizer, p.text, False)):
            o = rec.decision["oracle"]
            rows.append({"prompt_id": p.id, "category": p.category, "step": rec.step,
                         "features": rec.decision["features"], **{k: v for k, v in o.items() if k != "call"}})
        with out.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        print(f"[{i + 1}/{len(prompts)}] {p.id}: {len(rows)} steps, oracle calls "
              f"{sum(r['delta'] > 0 for r in rows)}", file=sys.stderr)
    return 0


def cmd_train(a) -> int:
    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]
    if len(rows) < 20:
        raise ValueError(f"{a.data} holds {len(rows)} steps; collect more before training")
    art, report = train(rows, a.holdout, a.seed)
    art["command"] = " ".join(["python -m treegraft scheduler train"] + sys.argv[3:]) if a.cmdline is None else a.cmdline
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    save_json(out / "scheduler.json", art)
    (out / "REPORT.md").write_text(report + f"\nReproduce: `{art['command']}`\n")
    print(report)
    return 0


def split_methods(text: str) -> list[str]:
    """Split on commas outside [...]: 'a,b[x=1,y=2],c' -> ['a', 'b[x=1,y=2]', 'c']."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [m for m in out + [cur] if m]


def method_config(a, spec: str, gen_config):
    """`treegraft:always[graft_g=0,blend=0]`: method, policy, and GraftConfig overrides (ablations)."""
    spec, _, knobs = spec.partition("[")
    method, _, policy = spec.partition(":")
    a.policy = policy or None
    cfg = gen_config(a, method)
    cfg.record_stages = False
    for kv in filter(None, knobs.rstrip("]").split(",")):
        key, _, val = kv.partition("=")
        if not hasattr(cfg.graft, key):
            raise ValueError(f"unknown TreeGraft knob {key!r} in {spec}[{knobs}")
        setattr(cfg.graft, key, type(getattr(cfg.graft, key))(val))
    cfg.check()
    return cfg


def cmd_compare(a) -> int:
    from .cli import encode_prompt, gen_config
    from .engine import Engine
    from .models import load_trio
    from .record import summarize
    trio = load_trio(a.target, a.weak, a.strong, a.device, None if a.dtype == "auto" else a.dtype)
    methods = split_methods(a.methods)
    prompts = held_prompts(a.per_suite, a.offset, a.suites)
    totals = {m: {"tokens": 0, "forwards": 0, "wall": 0.0, "extra": 0.0, "calls": 0} for m in methods}
    for p in prompts:
        ids = encode_prompt(trio.tokenizer, p.text, False)
        for m in methods:  # interleaved: machine drift hits every method alike
            cfg = method_config(a, m, gen_config)
            engine = Engine(trio, cfg)
            t = time.perf_counter()
            recs = list(engine.generate(ids))
            wall = time.perf_counter() - t
            s = summarize(recs, wall)
            tot = totals[m]
            tot["tokens"] += s["new_tokens"]
            tot["forwards"] += s["target_forwards"]
            tot["wall"] += wall
            tot["calls"] += s["strong_calls"]
            tot["extra"] += sum(((r.decision or {}).get("oracle") or {}).get("extra_s", 0.0) for r in recs)
        print(f"{p.id} done", file=sys.stderr)
    print(f"| method | tau | tokens/s | tokens/s net of oracle extra | strong calls / step |")
    print("|---|---|---|---|---|")
    for m, t in totals.items():
        net = t["tokens"] / max(1e-9, t["wall"] - t["extra"])
        print(f"| {m} | {t['tokens'] / t['forwards']:.3f} | {t['tokens'] / t['wall']:.2f} | {net:.2f} | "
              f"{t['calls'] / t['forwards']:.2f} |")
    return 0


def main(argv=None) -> int:
    from .cli import add_model_args, add_tree_args
    ap = argparse.ArgumentParser(prog="python -m treegraft scheduler")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (("collect", cmd_collect), ("compare", cmd_compare)):
        s = sub.add_parser(name)
        s.add_argument("--suites", default="all")
        s.add_argument("--per-suite", type=int, default=4)
        s.add_argument("--offset", type=int, default=40 if name == "collect" else 70,
                       help="skip this many prompts per suite (the benchmark uses the first ones)")
        s.add_argument("--max-new-tokens", type=int, default=64)
        s.add_argument("--temperature", type=float, default=0.0)
        s.add_argument("--top-p", type=float, default=1.0)
        s.add_argument("--seed", type=int, default=0)
        add_model_args(s)
        add_tree_args(s)
        s.set_defaults(func=fn)
        if name == "collect":
            s.add_argument("--out", default="runs/scheduler/collect.jsonl")
        else:
            s.add_argument("--methods", default="treegraft:never,treegraft:always,treegraft:learned,"
                                                "treegraft:oracle,tree-weak,tree-strong")
    t = sub.add_parser("train")
    t.add_argument("--data", default="runs/scheduler/collect.jsonl")
    t.add_argument("--out", default=str(DEFAULT_SCHEDULER.parent))
    t.add_argument("--holdout", type=float, default=0.3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--cmdline", default=None, help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_train)
    a = ap.parse_args(argv)
    try:
        return a.func(a)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

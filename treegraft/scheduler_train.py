"""`python -m treegraft scheduler collect|train|compare`: training the learned scheduler offline.

The question it learns: what is the *benefit of a strong call* at this step? (Not to be confused
with a node's path value V in treegraft.tree.)

  collect  run TreeGraft with the oracle policy: every step is played without and with the strong
           drafter from the same state; each row holds the cheap features, both accepted lengths,
           both measured costs and the timings a cost model is fitted from.
  train    (--kind gain, the default) fit how many tokens a step accepts without (a0) and with (a1)
           a strong call from the cheap features (boosted small trees, sizes by cross-validation over
           prompts); the runtime weighs them with this device's measured seconds, calling when
           a1 / (c0 + s) > kappa * a0 / c0, kappa tuned for simulated tokens/s on out-of-fold
           predictions; held-out prompts only report. (--kind logistic: the first design, a call/skip
           classifier on labels delta = a1/c1 - a0/c0 under a fitted cost model.) Writes
           scheduler.json + REPORT.md (one directory per pair: assets/scheduler/<trio>/<weak>+<strong>/).
  compare  side by side on held-out prompts, through the benchmark runner (treegraft.bench):
           never / always / learned / oracle / tree-weak / tree-strong, or any bench method spec.

Collection, threshold tuning and comparison use disjoint prompts (offsets into the benchmark sets,
past the first prompts the benchmark suite uses). The learned policy's runtime (loading the file,
deciding) is treegraft.schedule (GainPolicy, LearnedPolicy)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.model_selection import GridSearchCV, GroupKFold, StratifiedKFold, cross_val_predict

from .bench.methods import parse_method, parse_methods
from .bench.prompts import SUITES, load_suite
from .bench.run import load_results, run_bench
from .bench.store import CONFIG
from .engine import Engine
from .models import save_json
from .record import first_call_excess
from .options import add_model_args, add_tree_args, encode_prompt, gen_config, trio_from_args
from .schedule import (ARMS, DEFAULT_SCHEDULER, FEATURES, POOL_FEATURES, GainPolicy, LearnedPolicy, gain_score,
                       prefill_share)


# ---------------------------------------------------------------- cost model, labels, logistic fit

def fit_cost_model(rows: list[dict]) -> dict:
    """Seconds as a function of work over the measured oracle steps: verification as a monotone
    (isotonic) function of the nodes sent, fitted to the median per node count, since a CPU's curve
    jumps from 0 to 2 nodes and then flattens, which a straight line misreads (on qwen-coder a
    least-squares line put the cost of sending nothing at 1.18 s against 0.47 s measured); strong = c * strong forwards (least squares
    through 0); weak draft = median. Stored as a table verify_s_by_nodes[n] for n = 0 .. max seen."""
    # A first step holds one-time work: the target's prompt prefill in its verification, the strong
    # drafter's in its pass (one_time_costs charges that apart). Both prices are fitted on later steps;
    # a rare node count whose few steps were first steps would otherwise lift the whole monotone curve.
    later = [r for r in rows if r.get("step", 0) > 0] or rows
    n = np.array([r["n0"] for r in later] + [r["n1"] for r in later], float)
    v = np.array([r["verify0_s"] for r in later] + [r["verify1_s"] for r in later], float)
    # Medians per node count: a step's verification may still include a long catch-up.
    ks = np.unique(n)
    med = np.array([np.median(v[n == k]) for k in ks])
    counts = [(n == k).sum() for k in ks]
    iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(ks, med, sample_weight=counts)
    f = np.array([r["strong_forwards"] for r in later], float)
    s = np.array([r["refine_s"] for r in later], float)
    c = float((f @ s) / max(1e-9, f @ f))
    seen = max(max(r["n0"], r["n1"]) for r in rows)  # the table covers every count, first steps' too
    table = iso.predict(np.arange(int(seen) + 1, dtype=float))
    return {"verify_s_by_nodes": [float(x) for x in table], "strong_per_forward_s": c,
            "weak_draft_s": float(np.median([r["weak_s"] for r in rows]))}


def verify_cost(cm: dict, nodes: int) -> float:
    table = cm["verify_s_by_nodes"]
    return table[min(max(0, int(nodes)), len(table) - 1)]


def model_costs(r: dict, cm: dict) -> tuple[float, float]:
    c0 = cm["weak_draft_s"] + verify_cost(cm, r["n0"])
    c1 = cm["weak_draft_s"] + cm["strong_per_forward_s"] * r["strong_forwards"] + verify_cost(cm, r["n1"])
    return c0, c1


def benefit(rows: list[dict], cm: dict) -> np.ndarray:
    """The benefit of a strong call at each step, delta = a1/c1 - a0/c0 (tokens per second gained)
    under the cost model (measured costs are too noisy per step)."""
    out = []
    for r in rows:
        c0, c1 = model_costs(r, cm)
        out.append(r["a1"] / c1 - r["a0"] / c0)
    return np.array(out)


def fit_logistic(X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray, groups: np.ndarray):
    """scikit-learn logistic regression, its L2 strength chosen by cross-validation over prompts
    (GroupKFold: a prompt's steps never straddle folds), then Platt-calibrated on out-of-fold scores
    so p is a frequency; the calibration is a 1-D logistic, so it folds into (w, b) and the shipped
    model stays one dot product. Returns (w, b) on the standardised features."""
    if len(set(y.tolist())) < 2:  # the oracle always (or never) calls: nothing to separate
        p = float(np.clip(y.mean(), 1e-3, 1 - 1e-3))
        return np.zeros(X.shape[1]), float(np.log(p / (1 - p)))
    folds = min(5, len(set(groups.tolist())))
    splits = list(GroupKFold(folds).split(X, y, groups)) if folds >= 2 else []
    if not splits or any(len(set(y[tr].tolist())) < 2 for tr, _ in splits):
        splits = list(StratifiedKFold(min(5, int(min(y.sum(), len(y) - y.sum()))) or 2).split(X, y))
    cv = LogisticRegressionCV(Cs=10, l1_ratios=(0.0,), cv=splits, scoring="neg_log_loss", max_iter=5000,
                              use_legacy_attributes=False)
    cv.fit(X, y, sample_weight=sample_weight)
    base = LogisticRegression(C=float(np.ravel(cv.C_)[0]), max_iter=5000)
    oof = cross_val_predict(base, X, y, cv=splits, method="decision_function",
                            params={"sample_weight": sample_weight})
    platt = LogisticRegression(C=1e4, max_iter=5000).fit(oof[:, None], y)
    a, b0 = float(platt.coef_[0, 0]), float(platt.intercept_[0])
    return np.ravel(cv.coef_) * a, float(np.ravel(cv.intercept_)[0]) * a + b0


def target_prefill(rows: list[dict], cm: dict) -> dict[str, float]:
    """Per prompt, the target's prompt prefill, which every policy pays once: what step 0's plain
    verification cost beyond the modelled verification of its nodes (fit_cost_model prices later steps
    only), plus the prefill phase a feature drafter's target runs apart (`prefill_s`; steps collected
    before it was recorded hold 0 there). Leaving it out makes every call look dearer than the clock
    says, since a generation's seconds are then only its steps'."""
    return {r["prompt_id"]: max(0.0, r["verify0_s"] - verify_cost(cm, r["n0"])) + r.get("prefill_s", 0.0)
            for r in rows if r.get("step", 0) == 0}


class Branches:
    """Recorded oracle steps as arrays: each step's tokens (a0, a1) and modelled seconds (c[:, 0],
    c[:, 1]) without and with the strong drafter, its prompt, and the target prefill every policy
    pays (`base`, target_prefill); `rate` is the tokens/s of a set of calls, the one formula every
    replay, hindsight and script here shares."""

    def __init__(self, rows: list[dict], cm: dict):
        self.a0 = np.array([r["a0"] for r in rows], float)
        self.a1 = np.array([r["a1"] for r in rows], float)
        self.c = np.array([model_costs(r, cm) for r in rows], float).reshape(len(rows), 2)
        self.prompt = np.array([r["prompt_id"] for r in rows])
        self.base = sum(target_prefill(rows, cm).values())

    def rate(self, calls: np.ndarray, pre: dict | None = None) -> float:
        """Tokens per second if each step took the chosen branch (counterfactual: both are known), the
        target's prefill included; with `pre` (one_time_costs), a prompt with any call also pays the
        strong drafter's prefill once."""
        calls = np.asarray(calls, bool)
        cost = self.base + np.where(calls, self.c[:, 1], self.c[:, 0]).sum()
        if pre:
            cost += sum(pre.get(p, 0.0) for p in set(self.prompt[calls].tolist()))
        return float(np.where(calls, self.a1, self.a0).sum() / cost)


def throughput(rows: list[dict], calls: np.ndarray, cm: dict, pre: dict | None = None) -> float:
    """Branches.rate of `calls` on recorded steps."""
    return Branches(rows, cm).rate(calls, pre)


def one_time_costs(rows: list[dict]) -> dict[str, float]:
    """Per prompt, the strong drafter's prompt prefill (record.first_call_excess): a replayed
    generation pays it at its first call, wherever that comes."""
    by: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        by.setdefault(r["prompt_id"], []).append((r.get("step", 0), r["c1"] - r["c0"]))
    return {p: first_call_excess(xs) for p, xs in by.items() if any(s == 0 for s, _ in xs) and any(s > 0 for s, _ in xs)}


def tokens_left(r: dict, max_new: int) -> float:
    """The tokens a recorded step's generation could still emit (steps collected before the feature
    existed: from the position and the collection's max_new_tokens)."""
    left = r["features"].get("tokens_left")
    return float(left) if left is not None else max(0.0, max_new - round(np.expm1(r["features"]["position"])))


LOGISTIC_FEATURES = FEATURES[:8]  # the first scheduler's inputs


def train(rows: list[dict], holdout: float = 0.3, seed: int = 0, kind: str = "gain",
          max_new: int = 32) -> tuple[dict, str]:
    """Fit a scheduler on oracle steps: `gain` (the default, treegraft.schedule.GainPolicy) or the
    first design, `logistic` (a call/skip classifier, LearnedPolicy)."""
    if kind == "gain":
        return train_gain(rows, holdout, seed, max_new)
    if kind != "logistic":
        raise ValueError(f"unknown scheduler kind {kind!r}; choose gain or logistic")
    tr, te = split_prompts(rows, holdout, seed)
    held = {r["prompt_id"] for r in te}
    prompts = {r["prompt_id"] for r in rows}
    cm = fit_cost_model(tr)
    d_tr, d_te = benefit(tr, cm), benefit(te, cm)
    X_tr = np.array([[r["features"][f] for f in LOGISTIC_FEATURES] for r in tr])
    X_te = np.array([[r["features"][f] for f in LOGISTIC_FEATURES] for r in te])
    mean, std = X_tr.mean(0), X_tr.std(0) + 1e-6
    # Weight each step by how much the decision matters (|delta|): a wrong call on a near-tie costs little.
    w, b = fit_logistic((X_tr - mean) / std, (d_tr > 0).astype(int), np.abs(d_tr) + 1e-3,
                        np.array([r["prompt_id"] for r in tr]))
    p_te = 1 / (1 + np.exp(-(((X_te - mean) / std) @ w + b)))
    grid = np.unique(np.concatenate([[0.0, 1.0], np.quantile(p_te, np.linspace(0, 1, 41))]))
    branches = Branches(te, cm)  # one set-up for the whole threshold grid
    scores = [(branches.rate(p_te > t), -abs(t - 0.5), t) for t in grid]
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
    art = {"features": list(LOGISTIC_FEATURES), "mean": mean.tolist(), "std": std.tolist(), "weights": w.tolist(),
           "bias": float(b), "threshold": float(threshold), "report": report}
    policy = LearnedPolicy(tuple(LOGISTIC_FEATURES), art["mean"], art["std"], art["weights"], art["bias"], art["threshold"])
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
    cm = r["cost_model"]
    lines += ["", f"Bias {art['bias']:+.3f}. Cost model (seconds, isotonic in the nodes sent): verify with "
              + ", ".join(f"{n} nodes {v:.3f}" for n, v in enumerate(cm["verify_s_by_nodes"]))
              + f"; strong per forward {cm['strong_per_forward_s']:.4f}; weak draft {cm['weak_draft_s']:.4f}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the gain scheduler

GAIN_GRID = {"max_depth": [1, 2, 3], "n_estimators": [25, 75], "learning_rate": [0.1]}
# Up to 1000: "call only to look again" (a pair where calls do not pay on this device must be able to say so).
KAPPAS = np.concatenate([np.round(np.arange(0.3, 2.001, 0.1), 2), [2.5, 3.0, 4.0, 6.0, 1000.0]])
EXPLORE = (2, 3, 4, 6, 8, 1000)


def export_trees(est) -> dict:
    """A fitted GradientBoostingRegressor as plain lists (schedule.Trees); no pickle."""
    trees = []
    for t in est.estimators_[:, 0]:
        tr = t.tree_
        trees.append({"left": tr.children_left.tolist(), "right": tr.children_right.tolist(),
                      "feature": tr.feature.tolist(), "threshold": tr.threshold.tolist(),
                      "value": tr.value[:, 0, 0].tolist()})
    return {"base": float(np.ravel(est.init_.constant_)[0]), "rate": float(est.learning_rate), "trees": trees}


def fit_tokens(X: np.ndarray, y: np.ndarray, groups: np.ndarray):
    """Boosted small trees for accepted tokens, their size chosen by cross-validation over prompts
    (GroupKFold: a prompt's steps never straddle folds). Returns (fitted model, out-of-fold predictions)."""
    folds = min(5, len(set(groups.tolist())))
    cv = list(GroupKFold(folds).split(X, y, groups))
    search = GridSearchCV(GradientBoostingRegressor(random_state=0, min_samples_leaf=5), GAIN_GRID, cv=cv,
                          scoring="neg_mean_absolute_error").fit(X, y)
    oof = cross_val_predict(GradientBoostingRegressor(random_state=0, min_samples_leaf=5, **search.best_params_),
                            X, y, cv=cv)
    return search.best_estimator_, oof


def replay(rows: list[dict], a0: np.ndarray, cm: dict, kappa: float, explore: int, prior_gain: float,
           strong_units: float, first_units: float = 0.0, pre: dict | None = None,
           max_new: int = 32) -> tuple[float, np.ndarray]:
    """Play GainPolicy over recorded oracle steps, prompt by prompt in step order: both branches were
    measured, so each step takes the one the policy picks and the policy's running state (what its
    calls added and cost, tokens/s so far) follows its own choices. Seconds from the cost model; a
    prompt's first call also pays its measured strong prefill (`pre`, one_time_costs).
    Returns (tokens/s, calls per step); the seconds hold each prompt's target prefill (target_prefill)."""
    calls = np.zeros(len(rows), bool)
    t1 = verify_cost(cm, 0)
    tokens, seconds = 0.0, sum(target_prefill(rows, cm).values())
    by_prompt: dict[str, list[int]] = {}
    for k, r in enumerate(rows):
        by_prompt.setdefault(r["prompt_id"], []).append(k)
    for pid, ks in by_prompt.items():
        gains, extras, got, spent, since, called = [], [], 0.0, 0.0, 0, False
        for j, k in enumerate(sorted(ks, key=lambda k: rows[k].get("step", 0))):  # stable: file order otherwise
            r, e = rows[k], max(1.0, float(a0[k]))
            c0, c1 = model_costs(r, cm)
            gain = np.mean(gains[-4:]) if gains else prior_gain
            extra = np.mean(extras[-4:]) if extras else strong_units * t1
            if not called:  # as GainPolicy.one_time
                extra += prefill_share(first_units * t1, tokens_left(r, max_new), e + gain)
            rate = got / spent if spent > 0 else e / c0  # the pace after the first step, as the engine's
            call = gain_score(gain, rate, extra) > kappa or since >= explore
            a, c = (r["a1"], c1) if call else (r["a0"], c0)
            if call:
                gains.append(r["a1"] - e)
                if called:  # as the engine: a first call's seconds hold a prefill, not its price
                    extras.append(c1 - c0)
                else:
                    c += (pre or {}).get(pid, 0.0)
                called, since = True, 0
            else:
                since += 1
            if j > 0:
                got, spent = got + a, spent + c
            tokens, seconds = tokens + a, seconds + c
            calls[k] = call
    return tokens / seconds, calls


def hindsight(rows: list[dict], cm: dict, pre: dict | None = None) -> np.ndarray:
    """The best set of calls in hindsight for pooled tokens/s (Dinkelbach): call where the tokens a call
    adds beat what its extra seconds buy at the best achievable rate R (a per-step comparison of rates
    is not the pooled optimum); with `pre`, a prompt calls at all only if its calls together also pay
    for its strong prefill at R (exact for each R, so the iteration still reaches the optimum)."""
    b = Branches(rows, cm)
    calls = np.zeros(len(rows), bool)
    for _ in range(100):
        rate = b.rate(calls, pre)
        net = (b.a1 - b.a0) - rate * (b.c[:, 1] - b.c[:, 0])
        new = net > 0
        for p in set(b.prompt.tolist()) if pre else ():
            mine = b.prompt == p
            if net[mine & new].sum() <= rate * pre.get(p, 0.0):
                new[mine] = False
        if (new == calls).all():
            break
        calls = new
    return calls


def hindsight_per_prompt(rows: list[dict], cm: dict, pre: dict | None = None) -> np.ndarray:
    """The best calls in hindsight if each prompt may only call at every step or at none (Dinkelbach
    over prompts, exact): what knowing each prompt's better fixed policy in advance would buy,
    between the fixed policies and hindsight's per-step optimum (scripts/hindsight_gap.py)."""
    pre, b = pre or {}, Branches(rows, cm)
    calls = np.zeros(len(rows), bool)
    for _ in range(100):
        rate = b.rate(calls, pre)
        new = np.zeros(len(rows), bool)
        for p in set(b.prompt.tolist()):
            mine = b.prompt == p
            net = (b.a1[mine] - b.a0[mine]).sum() - rate * ((b.c[mine, 1] - b.c[mine, 0]).sum() + pre.get(p, 0.0))
            new[mine] = net > 0
        if (new == calls).all():
            break
        calls = new
    return calls


def train_gain(rows: list[dict], holdout: float = 0.3, seed: int = 0, max_new: int = 32) -> tuple[dict, str]:
    missing = [f for f in POOL_FEATURES + ("c0_s", "t1_s") if f not in rows[0]["features"]]
    if missing:
        raise ValueError(f"these steps were collected before the gain scheduler's features existed (no "
                         f"{', '.join(missing)}); collect them again with `scheduler collect`")
    tr, te = split_prompts(rows, holdout, seed)
    cm = fit_cost_model(tr)
    X_tr = np.array([[r["features"][f] for f in POOL_FEATURES] for r in tr])
    X_te = np.array([[r["features"][f] for f in POOL_FEATURES] for r in te])
    y_tr = np.array([r["a0"] for r in tr], float)
    m0, oof = fit_tokens(X_tr, y_tr, np.array([r["prompt_id"] for r in tr]))
    prior_gain = float(np.mean([r["a1"] - r["a0"] for r in tr]))
    # A call's extra seconds in target one-token forwards, as the oracle measured it (the runtime prior),
    # and a generation's first call's one-time extra (the strong drafter's prompt prefill), same unit.
    t1 = [r["features"]["t1_s"] or verify_cost(cm, 0) for r in tr]
    strong_units = float(np.median([max(0.0, r["c1"] - r["c0"]) / t for r, t in zip(tr, t1)]))
    pre_tr, pre_te = one_time_costs(tr), one_time_costs(te)
    first_units = float(np.median(list(pre_tr.values()) or [0.0]) / np.median(t1))
    # kappa and explore: the most replayed tokens/s on the training prompts, with out-of-fold a0
    # (ties: the fewest forced looks, kappa nearest 1).
    grid = [(k, x) for k in KAPPAS for x in EXPLORE]
    kappa, explore = max(grid, key=lambda g: (replay(tr, oof, cm, g[0], g[1], prior_gain, strong_units, first_units,
                                                     pre_tr, max_new)[0], g[1], -abs(g[0] - 1)))
    p0 = m0.predict(X_te)
    learned_tps, calls = replay(te, p0, cm, kappa, explore, prior_gain, strong_units, first_units, pre_te, max_new)
    best = hindsight(te, cm, pre_te)
    a0_te = np.array([r["a0"] for r in te], float)
    report = {
        "kind": "gain", "rows_train": len(tr), "rows_heldout": len(te),
        "prompts_train": len({r["prompt_id"] for r in tr}), "prompts_heldout": len({r["prompt_id"] for r in te}),
        "hindsight_call_rate_train": float(hindsight(tr, cm, pre_tr).mean()),
        "agreement_heldout": float((calls == best).mean()),
        "call_rate_heldout": float(calls.mean()), "hindsight_call_rate_heldout": float(best.mean()),
        "mae_a0_heldout": float(np.abs(p0 - a0_te).mean()),
        "mae_a0_heldout_constant": float(np.abs(y_tr.mean() - a0_te).mean()),
        "sim_tokens_per_s_heldout": {"never": throughput(te, np.zeros(len(te), bool), cm, pre_te),
                                     "always": throughput(te, np.ones(len(te), bool), cm, pre_te),
                                     "learned": learned_tps, "hindsight": throughput(te, best, cm, pre_te)},
        "a0_params": {k: getattr(m0, k) for k in GAIN_GRID},
        "importance": dict(zip(POOL_FEATURES, m0.feature_importances_.round(4).tolist())),
        "cost_model": cm,
    }
    art = {"kind": "gain", "features": list(POOL_FEATURES), "a0": export_trees(m0), "kappa": float(kappa),
           "explore": int(explore), "prior_gain": prior_gain, "strong_units": strong_units, "first_units": first_units,
           "threshold": float(kappa), "report": report}
    policy = GainPolicy.from_dict(art)
    # Recorded predictions: the shipped file must reproduce them exactly when loaded (tested), and
    # a0 equals scikit-learn's own.
    art["test_vectors"] = [{"features": r["features"], "prob": policy.prob(r["features"]), "a0": float(p0[k])}
                           for k, r in enumerate(te[:8])]
    return art, render_gain_report(art)


def split_prompts(rows: list[dict], holdout: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Held-out prompts (not steps): a prompt's steps are correlated."""
    prompts = sorted({r["prompt_id"] for r in rows})
    held = set(np.random.default_rng(seed).choice(prompts, max(1, int(len(prompts) * holdout)), replace=False).tolist())
    return [r for r in rows if r["prompt_id"] not in held], [r for r in rows if r["prompt_id"] in held]


def render_gain_report(art: dict) -> str:
    r = art["report"]
    sim = r["sim_tokens_per_s_heldout"]
    lines = ["# Learned scheduler (gain): training report", "",
             "Calls the strong drafter when the tokens recent calls added beat what a call's extra seconds",
             "would buy at this generation's pace (treegraft.schedule.GainPolicy). Learned here: a0, the",
             "tokens the weak tree alone gives, from the pool's features (boosted small regression trees,",
             "scikit-learn, size by cross-validation over prompts), and kappa / explore, tuned by replaying",
             "the training prompts' oracle steps (both branches measured) for tokens/s.", "",
             f"Rows (steps): {r['rows_train']} train / {r['rows_heldout']} held out "
             f"({r['prompts_train']} / {r['prompts_heldout']} prompts). In hindsight, calling pays on "
             f"{r['hindsight_call_rate_train']:.0%} of training steps.", "",
             "| held-out metric | value |", "|---|---|",
             f"| mean abs. error of a0 (tokens) | {r['mae_a0_heldout']:.2f} (a constant: "
             f"{r['mae_a0_heldout_constant']:.2f}) |",
             f"| call rate (hindsight's) | {r['call_rate_heldout']:.1%} ({r['hindsight_call_rate_heldout']:.1%}) |",
             f"| agreement with hindsight | {r['agreement_heldout']:.1%} |",
             f"| kappa, explore (tuned on the training prompts) | {art['kappa']:.2f}, "
             f"{art['explore'] if art['explore'] < 1000 else 'never'} |",
             f"| a call adds before any is seen (training mean, tokens) | {art['prior_gain']:.2f} |",
             f"| a call's extra cost before any is measured (target one-token forwards) | {art['strong_units']:.2f} |",
             f"| a generation's first call's one-time extra, the strong prefill (same unit) | "
             f"{art.get('first_units', 0.0):.2f} |", "",
             "Replayed throughput on the held-out prompts' oracle steps under the fitted cost model",
             "(tokens/s; each step takes the branch the policy picks, a prompt with any call pays its",
             "measured strong prefill once; hindsight: the best calls for pooled tokens/s, knowing both",
             "outcomes):", "",
             "| policy | tokens/s |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in sim.items()]
    lines += ["", f"a0 model: {r['a0_params']}. Feature importance (share of squared-error reduction):", "",
              "| feature | importance |", "|---|---|"]
    lines += [f"| {f} | {v:.3f} |" for f, v in r["importance"].items()]
    cm = r["cost_model"]
    lines += ["", "Cost model (seconds, isotonic in the nodes sent): verify with "
              + ", ".join(f"{n} nodes {v:.3f}" for n, v in enumerate(cm["verify_s_by_nodes"]))
              + f"; strong per forward {cm['strong_per_forward_s']:.4f}; weak draft {cm['weak_draft_s']:.4f}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- commands

def held_prompts(per_suite: int, offset: int, suites: str):
    names = SUITES if suites == "all" else suites.split(",")
    out = []
    for name in names:
        out += load_suite(name, offset + per_suite)[offset:]
    return out


def cmd_collect(a) -> int:
    a.policy = "oracle"
    cfg = gen_config(a, "treegraft")  # refused settings (the oracle is greedy only) fail before any load
    cfg.record_stages = False
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():  # resume: a prompt's rows are written together, so a prompt is done or absent
        done = {json.loads(line)["prompt_id"] for line in out.read_text().splitlines() if line.strip()}
    trio = trio_from_args(a)
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
    art, report = train(rows, a.holdout, a.seed, a.kind, a.max_new_tokens)
    art["command"] = " ".join(["python -m treegraft scheduler train"] + sys.argv[3:]) if a.cmdline is None else a.cmdline
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    save_json(out / "scheduler.json", art)
    (out / "REPORT.md").write_text(report + f"\nReproduce: `{art['command']}`\n")
    print(report)
    return 0


def cmd_compare(a) -> int:
    """The benchmark runner on held-out prompts (resumable in --out), then one table over all prompts."""
    cfg = gen_config(a, "treegraft")
    parse_methods(a.methods, cfg.policy)  # a bad method spec fails before any model loads
    prompts = held_prompts(a.per_suite, a.offset, a.suites)
    trio = trio_from_args(a)
    meta = {"source": f"scheduler compare: {a.suites}, {a.per_suite} per suite from offset {a.offset}"}
    out = Path(a.out) if a.out else default_out(a)
    df = run_bench(trio, prompts, a.methods, cfg, out, meta=meta, bar=True, repeats=a.repeats)
    print(compare_table(df))
    print(f"rows, summary and report.html: {out}", file=sys.stderr)
    return 0


def arm_of(method: str) -> tuple[str, dict] | None:
    """A validation run's method as an arm: schedule.ARMS' labels, and when-unsure or strong-first at
    other thresholds (`treegraft:when-unsure[unsure=1.5]` -> ("when-unsure", {"unsure": 1.5}),
    `treegraft:strong-first[sure=2.5]` -> ("strong-first", {"sure": 2.5})); else None."""
    if method in ARMS:
        return ARMS[method], {}
    m = parse_method(method, "learned")
    knobs = {"when-unsure": {"unsure"}, "strong-first": {"sure", "unsure"}}.get(m.policy, set())
    if m.tree and set(m.tree) <= knobs and not m.graft:
        return m.policy, dict(sorted(m.tree.items()))
    return None


def arm_label(arm: str, params: dict) -> str:
    return arm + "".join(f"[{k}={v:g}]" for k, v in params.items())


def arm_rates(df) -> tuple[dict, dict]:
    """Each arm's tokens/s in one validation run (pooled: sum tokens / sum wall seconds), and its
    (arm, knobs), keyed by arm label."""
    rates, params = {}, {}
    for method in df["method"].unique():
        arm = arm_of(method)
        if arm:
            g = df[df["method"] == method]
            label = arm_label(*arm)
            rates[label], params[label] = float(g["new_tokens"].sum() / g["wall_s"].sum()), arm
    return rates, params


def pooled_scores(rates: dict, earlier: list[dict]) -> dict:
    """Each arm's tokens/s relative to its run's reference (the geometric mean of the fixed arms that
    every run measured), averaged over the runs that measured it. The machine's speed drifts between
    runs, so only ratios within one run compare; the gain rule counts from this run alone, since an
    earlier run's `learned` played an earlier rule."""
    runs = [rates] + [{k: v for k, v in r.items() if k != "gain"} for r in earlier]
    common = sorted(set.intersection(*(set(r) - {"gain"} for r in runs)))
    if not common:
        raise ValueError("the pooled runs share no fixed arm to compare their speeds by")
    rel = [{k: v / float(np.exp(np.mean(np.log([r[c] for c in common])))) for k, v in r.items()} for r in runs]
    return {k: float(np.mean([x[k] for x in rel if k in x])) for k in rates}


def arm_certainty(df, earlier: list = (), n: int = 1000, seed: int = 0) -> dict:
    """How often each arm ranks first (as choose_arm ranks) when the validation prompts are redrawn
    with replacement, n times, the same draw in every pooled run: a choice between arms a few percent
    apart is often a coin toss, and the report should say so."""
    prompts = sorted(set(df[df["method"] == "treegraft:learned"]["prompt_id"]))
    idx = np.random.default_rng(seed).integers(0, len(prompts), size=(n, len(prompts)))
    tables = []
    for f in [df, *earlier]:
        t = {}
        for method in f["method"].unique():
            if arm_of(method):
                g = f[f["method"] == method].set_index("prompt_id").reindex(prompts)
                # a prompt a method lacks adds nothing to its sums, as in arm_rates
                t[arm_label(*arm_of(method))] = (np.nan_to_num(g["new_tokens"].to_numpy(float))[idx].sum(1),
                                                 np.nan_to_num(g["wall_s"].to_numpy(float))[idx].sum(1))
        tables.append(t)
    wins = {k: 0 for k in tables[0]}
    for b in range(n):
        rates = [{k: tok[b] / wall[b] for k, (tok, wall) in t.items()} for t in tables]
        score = pooled_scores(rates[0], rates[1:]) if len(earlier) else rates[0]
        wins[max(score, key=score.get)] += 1
    return {k: v / n for k, v in wins.items()}


def choose_arm(df, earlier: list = ()) -> dict:
    """The fastest arm among the methods of a validation run that are arms (arm_of); treegraft:learned
    there must be the gain rule. With earlier runs of the same prompts (`earlier`: their frames), the
    fixed arms are ranked by their pooled relative speed (pooled_scores): more rounds, less noise."""
    rates, params = arm_rates(df)
    if "gain" not in rates or len(rates) < 2:
        raise ValueError("the validation run needs treegraft:learned (the gain rule) and at least one other arm "
                         f"of {', '.join(ARMS)}")
    prompts = set(df[df["method"] == "treegraft:learned"]["prompt_id"])
    for e in earlier:
        if set(e["prompt_id"]) != prompts:
            raise ValueError("a pooled run measured other prompts than the validation run; pool only runs of the "
                             "same prompts")
    score = pooled_scores(rates, [arm_rates(e)[0] for e in earlier]) if len(earlier) else rates
    arm, knobs = params[max(score, key=score.get)]
    chosen = {"arm": arm, **knobs, "rates": rates, "prompts": len(prompts), "first": arm_certainty(df, earlier)}
    return chosen | ({"pooled": score} if len(earlier) else {})


def cmd_choose(a) -> int:
    """Write the validation run's fastest arm into a trained scheduler.json (and its REPORT.md)."""
    out = Path(a.scheduler)
    art = json.loads((out / "scheduler.json").read_text())
    if art.get("kind") != "gain":
        raise ValueError(f"{out / 'scheduler.json'} is not a gain scheduler; train one first")
    frames = []
    for run in [a.compare] + a.pool:
        df, _ = load_results(run)
        if not len(df):
            raise ValueError(f"{run} holds no finished rows")
        frames.append(df)
    df = frames[0]
    configs = [Path(run) / CONFIG for run in [a.compare] + a.pool]  # each compare run's own record
    configs = [json.loads(c.read_text()) if c.exists() else {} for c in configs]
    int8 = run_int8(configs[0])
    if any(run_int8(c) != int8 for c in configs):
        raise ValueError("the pooled runs' drafters ran in other precisions (--int8) than the validation run's; "
                         "pool only runs of the same drafters")
    hardware = a.hardware or ""
    if hardware and int8 != "none":
        raise ValueError("--hardware keeps an arm per machine class for fp32 drafters only; this run's "
                         f"{int8} drafter ran in int8 (its arm is kept per precision)")
    ran_on = {c["hardware"] for c in configs if c.get("hardware")}
    if hardware and ran_on - {hardware}:
        raise ValueError(f"--hardware {hardware}, but these runs were measured on {', '.join(sorted(ran_on))} "
                         "machines; pool only runs of one machine class")
    source, pool = str(a.compare), [str(p) for p in a.pool]
    if a.archive:  # runs/ is never committed: keep a copy the scheduler's record can point at
        source = archive_run(a.compare, Path(a.archive))
        pool = [archive_run(p, Path(a.archive) / f"pool{i + 1}") for i, p in enumerate(a.pool)]
    chosen = choose_arm(df, frames[1:]) | {"source": source, "repeats": configs[0].get("repeats", 1)}
    if pool:
        chosen["pool"] = pool
    if hardware:  # tree verification costs differ by machine class, so another arm may win there
        art.setdefault("arm_hardware", {})[hardware] = chosen
    elif int8 == "none":
        art["arm"] = chosen
    else:  # int8 drafters cost less, so another arm may win: theirs is kept beside the fp32 one
        art.setdefault("arm_int8", {})[int8] = chosen
    save_json(out / "scheduler.json", art)
    report = out / "REPORT.md"
    section = arm_report(chosen, df, int8, hardware)
    report.write_text(replace_section(report.read_text() if report.exists() else "",
                                      arm_heading(int8, hardware), section))
    print(section)
    return 0


ARCHIVED = ("config.json", "results.csv", "summary.csv", "outputs.jsonl", "provenance.md")


def archive_run(run: str, where: Path) -> str:
    """Copy a bench run's record (not its HTML report) to `where`; returns that path."""
    import shutil
    where.mkdir(parents=True, exist_ok=True)
    if Path(run).resolve() == where.resolve():      # choosing again from the archived copy itself
        return str(where)
    for name in ARCHIVED:
        if (Path(run) / name).exists():
            shutil.copyfile(Path(run) / name, where / name)
    return str(where)


ARM_HEADING = "## Arm (chosen on validation prompts)"


def run_int8(config: dict) -> str:
    """Which drafters a bench run ran in int8: its config's record, or for runs made before it was
    recorded, the drafters labelled "(int8)" (treegraft.models.load_trio)."""
    if "int8" in config:
        return config["int8"]
    roles = [r for r in ("weak", "strong") if str(config.get("models", {}).get(r, "")).endswith(" (int8)")]
    return "both" if len(roles) == 2 else roles[0] if roles else "none"


def arm_heading(int8: str = "none", hardware: str = "") -> str:
    if hardware:
        return f"## Arm on {hardware} machines (chosen on validation prompts measured there)"
    return ARM_HEADING if int8 == "none" else f"## Arm with the {int8} drafter in int8 (chosen on validation prompts)"


def replace_section(text: str, heading: str, section: str) -> str:
    """`text` with its `heading` section (up to the next level-2 heading) replaced by `section`, or
    with `section` appended; the other sections stay where they are."""
    head, found, rest = text.partition(heading)
    if not found:
        return text.rstrip() + "\n\n" + section if text.strip() else section
    nxt = rest.find("\n## ")
    tail = rest[nxt + 1:] if nxt >= 0 else ""
    return (head.rstrip() + "\n\n" if head.strip() else "") + section + ("\n" + tail if tail else "")


def arm_report(chosen: dict, df, int8: str = "none", hardware: str = "") -> str:
    per_suite = max(1, chosen["prompts"] // max(1, df["suite"].nunique()))
    arms = {m: arm_of(m) for m in df["method"].unique() if arm_of(m)}
    extra = ",".join(m for m in arms if m not in ARMS)
    extra = f'EXTRA_ARMS="{extra}" ' if extra else ""
    score = chosen.get("pooled", chosen["rates"])
    pooled = "pool" in chosen
    lines = [arm_heading(int8, hardware), "",
             f"On {chosen['prompts']} validation prompts (`{chosen['source']}`, disjoint from the training and the "
             f"benchmark prompts: from offset 70 in each set, 32 new tokens, `--budget auto --depth 10`, the arms "
             f"interleaved, each row its median round), tokens/s pooled per arm; `learned` plays the fastest: "
             f"**{max(score, key=score.get)}**. Reproduce: `{extra}PER_SUITE={per_suite} REPEATS={chosen.get('repeats', 1)} "
             f"{'' if int8 == 'none' else f'INT8={int8} '}{f'HARDWARE={hardware} ' if hardware else ''}"
             f"scripts/choose_arms.sh runs/arms <trio>/<weak>+<strong>`"
             + (f", on a {hardware} machine; machines of other classes play the arms above." if hardware else ".")]
    if pooled:
        runs = " ".join(f"--pool {p}" for p in chosen["pool"])
        lines += ["", f"Ranked by speed relative to each run's fixed arms, averaged with the earlier runs of the same "
                      f"prompts (the gain rule from this run alone): `python -m treegraft scheduler choose --compare "
                      f"{chosen['source']} {runs} --scheduler <dir>`."]
    first = chosen.get("first")
    if first:
        best = max(score, key=score.get)
        lines += ["", f"How sure: with the validation prompts redrawn 1000 times (with replacement, seed 0, the same "
                      f"draw in every pooled run), **{best}** ranks first in {first.get(best, 0.0):.0%} of the draws."]
    lines += ["", "| arm | method | tokens/s | " + ("relative speed, pooled | " if pooled else "")
              + ("first in redraws | " if first else "") + "strong calls / step |",
              "|---|---|---|" + ("---|" if pooled else "") + ("---|" if first else "") + "---|"]
    for method, arm in arms.items():
        g, label = df[df["method"] == method], arm_label(*arm)
        lines.append(f"| {label} | {method} | {chosen['rates'][label]:.2f} | "
                     + (f"{score[label]:.3f} | " if pooled else "")
                     + (f"{first.get(label, 0.0):.0%} | " if first else "")
                     + f"{g['strong_calls'].sum() / g['target_forwards'].sum():.2f} |")
    return "\n".join(lines) + "\n"


def default_out(a) -> Path:
    """One bench directory per distinct comparison: the same command resumes, another never collides."""
    settings = {k: v for k, v in sorted(vars(a).items()) if k not in ("func", "out")}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return Path("runs/scheduler/compare") / digest


def compare_table(df) -> str:
    """Pooled over prompts, per method in run order: tau, tokens/s, tokens/s net of what the oracle
    paid for its second branch, strong calls per step."""
    lines = ["| method | tau | tokens/s | tokens/s net of oracle extra | strong calls / step |", "|---|---|---|---|---|"]
    for m, g in df.groupby("method", sort=False):
        tokens, forwards, wall = g["new_tokens"].sum(), g["target_forwards"].sum(), g["wall_s"].sum()
        net = tokens / max(1e-9, wall - g["oracle_extra_s"].sum())
        lines.append(f"| {m} | {tokens / forwards:.3f} | {tokens / wall:.2f} | {net:.2f} | "
                     f"{g['strong_calls'].sum() / forwards:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
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
                                                "treegraft:oracle,tree-weak,tree-strong",
                           help="bench method specs, e.g. treegraft:always[graft_g=0,blend=0] (an ablation)")
            s.add_argument("--repeats", type=int, default=1,
                           help="rounds per prompt; a row is its method's median-wall round")
            s.add_argument("--out", default=None,
                           help="bench run directory (results.csv, report.html; default: one per distinct "
                                "comparison under runs/scheduler/compare/); the same command resumes")
    t = sub.add_parser("train")
    t.add_argument("--data", default="runs/scheduler/collect.jsonl")
    t.add_argument("--out", default=str(DEFAULT_SCHEDULER.parent))
    t.add_argument("--holdout", type=float, default=0.3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--kind", default="gain", choices=["gain", "logistic"],
                   help="gain: predict tokens with and without a call, weigh them with this device's costs; "
                        "logistic: the first design, a call/skip classifier")
    t.add_argument("--max-new-tokens", type=int, default=32,
                   help="the collection's (what a step recorded without tokens_left had left)")
    t.add_argument("--cmdline", default=None, help=argparse.SUPPRESS)
    t.set_defaults(func=cmd_train)
    c = sub.add_parser("choose", help="write the fastest arm of a validation run (`compare` with tree-strong, "
                                      "treegraft:never, treegraft:always, treegraft:learned) into a scheduler")
    c.add_argument("--compare", required=True, help="the validation run's directory (a bench run)")
    c.add_argument("--scheduler", required=True, help="the directory of the scheduler.json to update")
    c.add_argument("--pool", action="append", default=[],
                   help="an earlier validation run of the same prompts whose fixed arms count too (repeatable)")
    c.add_argument("--hardware", default=None, metavar="CLASS",
                   help="keep the arm for this machine class only (cpu-avx512, cpu-avx2, cuda: what "
                        "treegraft.fastpath.hardware_class says where the run was measured), beside the default arm")
    c.add_argument("--archive", default=None, metavar="DIR",
                   help="copy the validation run (and each --pool run, to DIR/poolN) to DIR, e.g. under docs/bench/, "
                        "and record that path as the arm's source instead of the uncommitted run")
    c.set_defaults(func=cmd_choose)
    a = ap.parse_args(argv)
    try:
        return a.func(a)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

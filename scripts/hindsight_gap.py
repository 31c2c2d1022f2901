"""How much of the oracle's lead over the fixed policies a scheduler could take back, per pair
(issue 12's "learned within 5% of the oracle net"). Reads each pair's oracle steps (both branches
measured at every step, `scheduler collect`) and replays, under the pair's fitted cost model and with
each prompt's strong prefill paid once if it calls (treegraft.scheduler_train):

- never / always: the fixed policies; when-empty and when-unsure (at 2 tokens), the per-step rules
  the clock chose on several pairs (they read only the weak pool, so their replay is exact);
- per prompt, in hindsight: each prompt all-call or no-call, whichever the pooled rate prefers;
- per step, in hindsight: the best set of calls knowing both outcomes (what the oracle approaches);
- features, out of fold: a classifier (scikit-learn boosted trees) on every scheduler feature,
  trained on hindsight's labels weighted by what each step's choice is worth, scored on prompts it
  did not see (GroupKFold over prompts). Its features on oracle steps include what both branches
  did at every earlier step, more than a real run sees: an optimistic estimate of what cheap
  features can tell.

It also counts the steps where a call adds tokens, changes nothing, or loses them.

  .venv/bin/python scripts/hindsight_gap.py assets/scheduler --out docs/bench/hindsight.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.model_selection import GroupKFold

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone
from treegraft.schedule import FEATURES, WhenEmpty, WhenUnsure  # noqa: E402
from treegraft.scheduler_train import (Branches, fit_cost_model, hindsight, hindsight_per_prompt,  # noqa: E402
                                       one_time_costs)


def plays(policy, rows: list[dict]) -> np.ndarray:
    return np.array([policy.decide(r["features"], r["step"]).call for r in rows], bool)


def out_of_fold(rows: list[dict], cm: dict, pre: dict, labels: np.ndarray, drop: tuple[str, ...] = ()) -> np.ndarray:
    b = Branches(rows, cm)
    prompt = b.prompt
    # Steps collected before a feature existed lack it; `drop` leaves features out, to see what they add.
    names = [f for f in FEATURES if f in rows[0]["features"] and f not in drop]
    X = np.array([[r["features"][f] for f in names] for r in rows], float)
    rate = b.rate(labels, pre)
    weight = np.abs((b.a1 - b.a0) - rate * (b.c[:, 1] - b.c[:, 0])) + 1e-6
    calls = np.zeros(len(rows), bool)
    for fit, test in GroupKFold(min(5, len(set(prompt.tolist())))).split(X, labels, prompt):
        if len(set(labels[fit].tolist())) < 2:
            calls[test] = bool(labels[fit][0])
            continue
        clf = GradientBoostingClassifier(random_state=0, max_depth=2, n_estimators=100, min_samples_leaf=5)
        calls[test] = clf.fit(X[fit], labels[fit], sample_weight=weight[fit]).predict(X[test]).astype(bool)
    return calls


def analyse(path: Path) -> dict:
    return analyse_rows([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def analyse_rows(rows: list[dict], drop: tuple[str, ...] = ()) -> dict:
    """The replayed rates; with `drop`, also the classifier without those features (same steps, same labels)."""
    cm, pre = fit_cost_model(rows), one_time_costs(rows)
    b, step = Branches(rows, cm), hindsight(rows, cm, pre)
    tps = {"never": b.rate(np.zeros(len(rows), bool), pre), "always": b.rate(np.ones(len(rows), bool), pre),
           "when-empty": b.rate(plays(WhenEmpty(), rows), pre), "when-unsure": b.rate(plays(WhenUnsure(2.0), rows), pre),
           "per prompt": b.rate(hindsight_per_prompt(rows, cm, pre), pre),
           "features (out of fold)": b.rate(out_of_fold(rows, cm, pre, step), pre),
           "per step": b.rate(step, pre)}
    if drop:
        tps["features without dropped"] = b.rate(out_of_fold(rows, cm, pre, step, drop), pre)
    d = np.array([r["a1"] - r["a0"] for r in rows])
    return {"steps": len(rows), "prompts": len({r["prompt_id"] for r in rows}), "tps": tps,
            "adds": float((d > 0).mean()), "same": float((d == 0).mean()), "loses": float((d < 0).mean()),
            "per_step_calls": float(step.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="a folder holding <trio>/<weak>+<strong>/oracle-steps.jsonl")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    found = sorted(a.root.glob("*/*/oracle-steps.jsonl"))
    if not found:
        raise SystemExit(f"no */*/oracle-steps.jsonl under {a.root}")
    names = ("never", "always", "when-empty", "when-unsure", "per prompt", "features (out of fold)", "per step")
    lines = ["| pair | steps (prompts) | a call adds / changes nothing / loses tokens | "
             + " | ".join(names) + " | best fixed / per step | features / per step |",
             "|---" * (len(names) + 5) + "|"]
    for path in found:
        r = analyse(path)
        t = r["tps"]
        best = max(t["never"], t["always"])  # the fixed policies
        lines.append(f"| {path.parent.parent.name}/{path.parent.name} | {r['steps']} ({r['prompts']}) | "
                     f"{r['adds']:.0%} / {r['same']:.0%} / {r['loses']:.0%} | "
                     + " | ".join(f"{t[n]:.2f}" for n in names)
                     + f" | {best / t['per step']:.2f} | {t['features (out of fold)'] / t['per step']:.2f} |")
    text = ("Replayed tokens/s on each pair's oracle steps (cost model fitted on them, strong prefill paid "
            "once per calling prompt); `per step` is hindsight's best set of calls.\n\n" + "\n".join(lines) + "\n")
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(f"Source: `{a.root}`. Reproduce: `.venv/bin/python scripts/hindsight_gap.py {a.root}`\n\n" + text)


if __name__ == "__main__":
    main()

"""Does more training data let cheap features foresee which steps a strong call pays on? A learning
curve of hindsight_gap.py's out-of-fold classifier (scikit-learn boosted trees on every scheduler
feature, GroupKFold over prompts) on one pair's oracle steps: random subsets of the prompts (3 draws
each, seed 0), each replayed under its own fitted cost model against the best fixed policy (never
or always) and against hindsight's best set of calls per step. `--drop` adds a column for the
classifier without some features (what they add, on the same draws).

  .venv/bin/python scripts/hindsight_curve.py docs/bench/hindsight-curve/smollm2__weak_strong.oracle-steps.jsonl.gz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone
from hindsight_gap import analyse_rows  # noqa: E402
from treegraft.bench.prompts import read_jsonl  # noqa: E402


def scores(rows: list[dict], drop: tuple[str, ...] = ()) -> dict:
    """The classifier (and, with `drop`, the classifier without those features) and per-step hindsight,
    each over the better of never and always; one replay for all three."""
    tps = analyse_rows(rows, drop)["tps"]
    best = max(tps["never"], tps["always"])
    return {"with": tps["features (out of fold)"] / best, "hindsight": tps["per step"] / best,
            "without": tps["features without dropped"] / best if drop else None}


def ratios(rows: list[dict]) -> tuple[float, float]:
    """(features out of fold, per-step hindsight), each over the better of never and always."""
    s = scores(rows)
    return s["with"], s["hindsight"]


def keep_rows(rows: list[dict], prompts: set) -> list[dict]:
    return [r for r in rows if r["prompt_id"] in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", type=Path, help="oracle-steps.jsonl(.gz) from `scheduler collect`")
    ap.add_argument("--sizes", default="18,30,45", help="prompt counts to subsample (all prompts are added)")
    ap.add_argument("--drop", default="", help="comma-separated features: a column for the classifier without them")
    a = ap.parse_args()
    drop = tuple(f for f in a.drop.split(",") if f)
    rows = read_jsonl(a.steps)
    prompts = list(dict.fromkeys(r["prompt_id"] for r in rows))
    sizes = sorted({int(n) for n in a.sizes.split(",") if 0 < int(n) < len(prompts)}) + [len(prompts)]
    rng = np.random.default_rng(0)
    again = (f" --sizes {a.sizes}" if a.sizes != ap.get_default("sizes") else "") + (f" --drop {a.drop}" if drop else "")
    print(f"Source: `{a.steps}`. Reproduce: `.venv/bin/python scripts/hindsight_curve.py {a.steps}{again}`\n")
    without = f" without {', '.join(drop)}, mean |" if drop else ""
    print(f"| prompts (steps) | features out of fold / best fixed, per draw | mean |{without} "
          "per-step hindsight / best fixed |")
    print("|---|---|---|" + ("---|" if drop else "") + "---|")
    for n in sizes:
        draws = [set(prompts)] if n == len(prompts) else [set(rng.choice(prompts, n, replace=False).tolist())
                                                          for _ in range(3)]
        got = [scores(keep_rows(rows, keep), drop) for keep in draws]
        steps = round(np.mean([sum(r["prompt_id"] in keep for r in rows) for keep in draws]))
        feats = [g["with"] for g in got]
        less = f" {np.mean([g['without'] for g in got]):.3f} |" if drop else ""
        print(f"| {n} ({steps}) | {', '.join(f'{f:.3f}' for f in feats)} | {np.mean(feats):.3f} |{less} "
              f"{np.mean([g['hindsight'] for g in got]):.3f} |")
    if drop:
        print()
        print(by_quartile(rows, drop))


def by_quartile(rows: list[dict], names: tuple[str, ...]) -> str:
    """What a strong call adds (a1 - a0 tokens) by quartile of each feature, past step 0 (where the
    history-based features are still empty): does the feature separate steps at all?"""
    later = [r for r in rows if r["step"] > 0]
    adds = np.array([r["a1"] - r["a0"] for r in later], float)
    out = ["| feature | corr. with a1 - a0 | mean a1 - a0 (tokens) by quartile, lowest first | share of steps a call adds tokens, by quartile |",
           "|---|---|---|---|"]
    for name in names:
        x = np.array([r["features"][name] for r in later], float)
        q = np.digitize(x, np.quantile(x, [0.25, 0.5, 0.75]))
        mean = ", ".join(f"{adds[q == k].mean():+.2f}" for k in range(4))
        share = ", ".join(f"{(adds[q == k] > 0).mean():.2f}" for k in range(4))
        out.append(f"| {name} | {np.corrcoef(x, adds)[0, 1]:+.3f} | {mean} | {share} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()

"""Does more training data let cheap features foresee which steps a strong call pays on? A learning
curve of hindsight_gap.py's out-of-fold classifier (scikit-learn boosted trees on every scheduler
feature, GroupKFold over prompts) on one pair's oracle steps: random subsets of the prompts (3 draws
each, seed 0), each replayed under its own fitted cost model against the best fixed policy (never
or always) and against hindsight's best set of calls per step.

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


def ratios(rows: list[dict]) -> tuple[float, float]:
    """(features out of fold, per-step hindsight), each over the better of never and always."""
    tps = analyse_rows(rows)["tps"]
    best = max(tps["never"], tps["always"])
    return tps["features (out of fold)"] / best, tps["per step"] / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", type=Path, help="oracle-steps.jsonl(.gz) from `scheduler collect`")
    ap.add_argument("--sizes", default="18,30,45", help="prompt counts to subsample (all prompts are added)")
    a = ap.parse_args()
    rows = read_jsonl(a.steps)
    prompts = list(dict.fromkeys(r["prompt_id"] for r in rows))
    sizes = sorted({int(n) for n in a.sizes.split(",") if 0 < int(n) < len(prompts)}) + [len(prompts)]
    rng = np.random.default_rng(0)
    print(f"Source: `{a.steps}`. Reproduce: `.venv/bin/python scripts/hindsight_curve.py {a.steps}`\n")
    print("| prompts (steps) | features out of fold / best fixed, per draw | mean | per-step hindsight / best fixed |")
    print("|---|---|---|---|")
    for n in sizes:
        draws = [set(prompts)] if n == len(prompts) else [set(rng.choice(prompts, n, replace=False).tolist())
                                                          for _ in range(3)]
        got = [ratios([r for r in rows if r["prompt_id"] in keep]) for keep in draws]
        steps = round(np.mean([sum(r["prompt_id"] in keep for r in rows) for keep in draws]))
        feats = [g[0] for g in got]
        print(f"| {n} ({steps}) | {', '.join(f'{f:.3f}' for f in feats)} | {np.mean(feats):.3f} | "
              f"{np.mean([g[1] for g in got]):.3f} |")


if __name__ == "__main__":
    main()

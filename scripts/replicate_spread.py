"""How far two held-out runs of the same prompts and protocol disagree on the same method: per pair
and method, tokens/s over `ar` (pooled, as in scripts/ablation_table.py) in each run and their ratio,
then per method the median and largest disagreement over the pairs. A method that played the same
thing in both runs shows the spread the machine alone puts between measurements; a gap smaller than
that spread is not evidence of anything. Where the two runs hold different prompts of a pair (one
ran more per set), only the prompts both ran are compared.

  .venv/bin/python scripts/replicate_spread.py docs/bench/live14 docs/bench/live15 [--differ treegraft:learned]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

from ablation_table import pooled


def load(root: Path) -> dict[str, pd.DataFrame]:
    """Per pair (run directory name): its results.csv."""
    return {csv.parent.name: pd.read_csv(csv) for csv in sorted(root.glob("*/results.csv"))}


def shared_prompts(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> dict[str, set]:
    """Per pair both runs hold: the prompt ids both ran."""
    return {pair: set(a[pair].prompt_id) & set(b[pair].prompt_id) for pair in set(a) & set(b)}


def speeds(runs: dict[str, pd.DataFrame], prompts: dict[str, set] | None = None) -> dict[str, pd.Series]:
    """Per pair: tokens/s over `ar` per method, over `prompts[pair]` if given."""
    out = {}
    for pair, df in runs.items():
        if prompts is not None:
            df = df[df.prompt_id.isin(prompts.get(pair, set()))]
        g = pooled(df)
        if "ar" in g.index:
            out[pair] = (g.tps / g.loc["ar", "tps"]).drop("ar")
    return out


def spread(a: dict[str, pd.Series], b: dict[str, pd.Series]) -> dict[str, dict[str, float]]:
    """method -> pair -> (b's speed over ar) / (a's), over the pairs and methods both runs hold."""
    ratios: dict[str, dict[str, float]] = {}
    for pair in sorted(set(a) & set(b)):
        for m in a[pair].index.intersection(b[pair].index):
            ratios.setdefault(m, {})[pair] = float(b[pair][m] / a[pair][m])
    return ratios


def table(a: dict, b: dict, names: tuple[str, str], differ: set[str]) -> str:
    ratios = spread(a, b)
    pairs = sorted(set(a) & set(b))
    head = "| method | " + " | ".join(pairs) + " | median gap (%) | largest gap (%) |"
    lines = [f"## Speed over `ar`: {names[1]} / {names[0]}, per pair (1.00 = the same)", "",
             head, "|---" * (head.count("|") - 1) + "|"]
    same = []
    for m, per in ratios.items():
        dev = [max(r, 1 / r) - 1 for r in per.values()]  # symmetric: 1.10 and 1/1.10 are both a 10% gap
        note = " (played something else in one run)" if m in differ else ""
        lines.append(f"| {m}{note} | " + " | ".join(f"{per[p]:.2f}" if p in per else "" for p in pairs)
                     + f" | {100 * statistics.median(dev):.1f} | {100 * max(dev):.1f} |")
        if m not in differ:
            same += dev
    if same:
        lines += ["", f"Over every method that played the same thing in both runs ({len(same)} pair-method cells): "
                      f"median disagreement {100 * statistics.median(same):.1f}%, largest {100 * max(same):.1f}%."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first", help="a directory of bench runs, one per pair")
    ap.add_argument("second", help="another, of the same prompts and protocol")
    ap.add_argument("--differ", action="append", default=[],
                    help="a method that played something else in one run (kept out of the summary; repeatable)")
    a = ap.parse_args(argv)
    runs = load(Path(a.first)), load(Path(a.second))
    common = shared_prompts(*runs)
    first, second = (speeds(r, common) for r in runs)
    if not set(first) & set(second):
        print(f"error: {a.first} and {a.second} share no pair with an `ar` row", file=sys.stderr)
        return 2
    print(table(first, second, (Path(a.first).name, Path(a.second).name), set(a.differ)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

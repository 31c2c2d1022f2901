"""Greedy against sampled decoding, per pair, from finished `bench` runs that differ only in
--temperature (one directory per temperature, each holding one directory per pair, as
`TEMPERATURE=T scripts/bench_pairs.sh OUT` writes them): each method's tau pooled over the pair's
prompts (tokens / target forwards) and its tokens/s over `ar`'s in the same run (pooled: a sample may
stop at another length, so the ratio is of rates, not of wall times), and the share of steps on
which `learned` called the strong drafter.

  .venv/bin/python scripts/sampling_table.py runs/samp-t0 runs/samp-t07 runs/samp-t10 > docs/bench/sampling/table.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def pooled(run: Path) -> pd.DataFrame:
    df = pd.read_csv(run / "results.csv")
    g = df.groupby("method", sort=False)[["new_tokens", "target_forwards", "wall_s", "strong_calls"]].sum()
    g["tau"] = g.new_tokens / g.target_forwards
    g["x_ar"] = (g.new_tokens / g.wall_s) / (g.loc["ar", "new_tokens"] / g.loc["ar", "wall_s"])
    g["calls"] = g.strong_calls / g.target_forwards
    g["prompts"] = df.groupby("method", sort=False).size()
    return g


def temperature(run: Path) -> float:
    return float(json.loads((run / "config.json").read_text())["gen"]["temperature"])


def pair_table(pair: str, runs: list[Path]) -> str:
    runs = sorted(runs, key=temperature)
    tables = [pooled(r) for r in runs]
    methods = [m for m in tables[0].index if all(m in t.index for t in tables)]
    head = "| method | " + " | ".join(f"T = {temperature(r):g}: tau / x ar" for r in runs) + " |"
    lines = [f"### {pair}", "", head, "|---" * (len(runs) + 1) + "|"]
    for m in methods:
        cells = [f"{t.loc[m, 'tau']:.2f} / {t.loc[m, 'x_ar']:.2f}x" for t in tables]
        label = m
        if m == "treegraft:learned":
            label += " (strong calls: " + ", ".join(f"{t.loc[m, 'calls']:.0%}" for t in tables) + ")"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    ar = [t.loc["ar"] for t in tables]
    lines += ["", "`ar` tokens/s: " + ", ".join(f"{a.new_tokens / a.wall_s:.2f} (T = {temperature(r):g}, "
                                               f"{a.new_tokens / a.prompts:.1f} tokens a prompt)"
                                               for a, r in zip(ar, runs)), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("roots", nargs="+", type=Path, help="one bench output root per temperature")
    a = p.parse_args(argv)
    pairs = sorted({d.name for root in a.roots for d in root.iterdir() if (d / "results.csv").is_file()})
    out = ["# Greedy and sampled decoding side by side (tau pooled over prompts / tokens/s over `ar`, pooled)", ""]
    for pair in pairs:
        runs = [root / pair for root in a.roots if (root / pair / "results.csv").is_file()]
        if len(runs) > 1:
            out.append(pair_table(pair, runs))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

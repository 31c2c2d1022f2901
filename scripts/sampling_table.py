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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone
from treegraft.bench import load_results  # noqa: E402


def overall(run: Path) -> tuple[float, pd.DataFrame]:
    """(temperature, the bench's own summary over all prompts, one row per method)."""
    t = float(json.loads((run / "config.json").read_text())["gen"]["temperature"])
    results, summary = load_results(run)
    g = summary[summary["level"] == "all"].set_index("method").loc[results["method"].unique()]  # the run's order
    g["x_ar"] = g.tokens_per_s_pooled / g.loc["ar", "tokens_per_s_pooled"]  # pooled rates: lengths may differ
    g["calls"] = g.strong_calls / g.target_forwards  # both are means over the same prompts
    return t, g


def pair_table(pair: str, runs: list[Path]) -> str:
    temps, tables = zip(*sorted((overall(r) for r in runs), key=lambda x: x[0]))
    methods = [m for m in tables[0].index if all(m in t.index for t in tables)]
    head = "| method | " + " | ".join(f"T = {t:g}: tau / x ar" for t in temps) + " |"
    lines = [f"### {pair}", "", head, "|---" * (len(runs) + 1) + "|"]
    for m in methods:
        cells = [f"{t.loc[m, 'tau_pooled']:.2f} / {t.loc[m, 'x_ar']:.2f}x" for t in tables]
        label = m
        if m == "treegraft:learned":
            label += " (strong calls: " + ", ".join(f"{t.loc[m, 'calls']:.0%}" for t in tables) + ")"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "`ar` tokens/s: " + ", ".join(f"{t.loc['ar', 'tokens_per_s_pooled']:.2f} (T = {temp:g}, "
                                               f"{t.loc['ar', 'new_tokens']:.1f} tokens a prompt)"
                                               for temp, t in zip(temps, tables)), ""]
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

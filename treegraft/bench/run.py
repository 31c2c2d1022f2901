"""run_bench: every method on every prompt, interleaved prompt by prompt (machine drift hits all
methods alike), rows appended as they finish, resumable."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Callable, NamedTuple

import pandas as pd
import torch
from tqdm import tqdm

from ..engine import ConfigError, GenConfig
from ..fastpath import hardware_class
from ..models import Trio
from ..options import encode_prompt
from .methods import Method, make_runner, parse_methods
from .prompts import Prompt
from .report import provenance_markdown, write_report
from .store import (CONFIG, PHASE_COLUMNS, append_output, append_row, check_config, load_outputs, read_rows,
                    results_frame, summarize, write_summary)

Progress = Callable[[int, int, dict], None]  # (rows done, rows in the run, the row just written)


def run_bench(trio: Trio, prompts: list[Prompt], methods: list[str] | str, cfg: GenConfig, out_dir,
              progress: Progress | None = None, meta: dict | None = None, bar: bool = False,
              warmup: bool = True, repeats: int = 1) -> pd.DataFrame:
    """Run (or resume) a benchmark into out_dir and return its results as a DataFrame.

    methods: labels such as ["ar", "assisted", "treegraft:never"]; a bare "treegraft" uses cfg.policy.
    repeats: each prompt's methods run this many rounds (round-robin, so drift hits them alike) and
    a row is the round with the median wall time (its tau and phases with it): one run per method
    moves by ~10% on a shared CPU, as much as the gaps a scheduler is judged on.
    Rows already in out_dir/results.csv are skipped; a different configuration there is refused."""
    if not isinstance(repeats, int) or not 1 <= repeats <= 20:
        raise ConfigError(f"repeats must be an integer in [1, 20], got {repeats!r}")
    out = Path(out_dir)
    spec = methods if isinstance(methods, str) else ",".join(methods)
    plan = parse_methods(spec, cfg.policy)
    ids = {p.id: prompt_ids(trio, p) for p in prompts}
    if len(ids) != len(prompts):
        raise ConfigError("prompt ids must be unique")
    torch.manual_seed(cfg.seed)
    # Building every method's runner checks its settings before config.json is written: a refused
    # method must leave nothing that would make the corrected command's resume refuse this directory.
    runners = {m.label: make_runner(trio, cfg, m) for m in plan}
    check_config(out, run_config(trio, prompts, ids, plan, cfg, (meta or {}) | ({"repeats": repeats} if repeats > 1 else {})))
    rows = read_rows(out)
    done = {(r["prompt_id"], r["method"]) for r in rows}
    ar = {r["prompt_id"]: ArRow(float(r["wall_s"]), int(r["new_tokens"]), r["output_sha1"])
          for r in rows if r["method"] == "ar"}
    todo = {p.id: [m for m in plan if (p.id, m.label) not in done] for p in prompts}
    total = len(prompts) * len(plan)
    if any(todo.values()) and warmup:
        warm_up(trio, cfg, plan, min(ids.values(), key=len))
    finished = total - sum(map(len, todo.values()))
    with tqdm(total=total, initial=finished, disable=not bar, unit="run", dynamic_ncols=True) as pbar:
        for p in prompts:
            runs = {m.label: [] for m in todo[p.id]}
            for round_ in range(repeats):
                for m in rotated(todo[p.id], round_):
                    runs[m.label].append(runners[m.label].run(ids[p.id]))
                    if round_ < repeats - 1:
                        continue
                    stats = median_run(runs[m.label])
                    row = make_row(p, m, stats, len(ids[p.id]), ar.get(p.id), sampled=cfg.temperature > 0)
                    if m.label == "ar":
                        ar[p.id] = ArRow(row["wall_s"], row["new_tokens"], row["output_sha1"])
                    append_output(out, {"prompt_id": p.id, "method": m.label, "token_ids": stats["token_ids"],
                                        "text": decode(trio, stats["token_ids"]),
                                        "provenance": stats.get("provenance"),
                                        "walls_s": [r["wall_s"] for r in runs[m.label]]})
                    append_row(out, row)  # synced before anyone hears it finished
                    pbar.set_postfix_str(f"{p.id} {m.label} {row['tokens_per_s']:.1f} tok/s", refresh=False)
                    pbar.update(1)
                    finished += 1  # counted here: a disabled tqdm does not count
                    if progress is not None:
                        progress(finished, total, row)
    return finish(out)


def rotated(plan: list, round_: int) -> list:
    """A round's order: `ar` first (every row's speedup needs its time), the others shifted by one
    place a round, so each takes every place in turn, right after `ar` included: an effect of the
    place (a cache, a clock state) becomes spread that the median round absorbs, not a bias between
    two methods."""
    first = [m for m in plan if m.label == "ar"]
    rest = [m for m in plan if m.label != "ar"]
    k = round_ % len(rest) if rest else 0
    return first + rest[k:] + rest[:k]


def median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (the lower middle of an even count): one real run, so its
    tau, tree sizes and phases are the ones that took that time."""
    return sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2]


def finish(out: Path) -> pd.DataFrame:
    """summary.csv, report.html and provenance.md from whatever rows results.csv holds."""
    df = results_frame(out)
    if len(df):
        summary = write_summary(out)
        write_report(out, df, summary, json.loads((out / CONFIG).read_text()))
        (out / "provenance.md").write_text(provenance_markdown(load_outputs(out)))
    return df


def load_results(out_dir) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(results, summary) of a run directory; the summary is recomputed from results.csv."""
    df = results_frame(Path(out_dir))
    return df, summarize(df) if len(df) else pd.DataFrame()


# ---------------------------------------------------------------- pieces

def prompt_ids(trio: Trio, p: Prompt) -> list[int]:
    if p.ids is not None:
        return list(p.ids)
    if trio.tokenizer is None:
        raise ConfigError(f"prompt {p.id!r} is text but the models came without a tokenizer; pass token ids")
    return encode_prompt(trio.tokenizer, p.text, raw=False)


def decode(trio: Trio, ids: list[int]) -> str:
    return trio.tokenizer.decode(ids, skip_special_tokens=True) if trio.tokenizer is not None else ""


def warm_up(trio: Trio, cfg: GenConfig, plan: list[Method], ids: list[int]) -> None:
    """One short untimed generation per method first: one-time costs (allocator growth, lazy
    initialisation inside HF generate) must not land on whichever method happens to run first."""
    short = dataclasses.replace(cfg, max_new_tokens=min(4, cfg.max_new_tokens))
    for m in plan:
        make_runner(trio, short, m).run(ids)


class ArRow(NamedTuple):
    """What every other row of a prompt is measured against."""
    wall_s: float
    new_tokens: int
    output_sha1: str


def make_row(p: Prompt, m: Method, s: dict, prompt_len: int, ar: ArRow | None, sampled: bool = False) -> dict:
    """One result row. The speedup is per token (ar's seconds per token over the method's), so a
    sampled generation that stops at another length is still compared fairly; greedy outputs are
    identical, so there it is ar's wall over the method's. Under sampling matches_ar stays empty:
    each method draws its own sample, and what must match is the distribution (tests/test_sampling.py)."""
    new, wall, forwards = len(s["token_ids"]), s["wall_s"], s["target_forwards"]
    sha = hashlib.sha1(" ".join(map(str, s["token_ids"])).encode()).hexdigest()[:16]
    if m.label == "ar":
        ar = ArRow(wall, new, sha)  # ar's own row: speedup 1; greedy, it matches itself
    rate = new / wall if wall > 0 else 0.0
    ar_rate = ar.new_tokens / ar.wall_s if ar and ar.wall_s > 0 else 0.0
    row = {"prompt_id": p.id, "suite": p.suite, "category": p.category, "method": m.label,
           "prompt_tokens": prompt_len, "new_tokens": new, "target_forwards": forwards,
           "tau": new / forwards if forwards else 0.0, "wall_s": wall, "tokens_per_s": rate,
           "speedup_vs_ar": rate / ar_rate if ar_rate > 0 and wall > 0 else float("nan"),
           "matches_ar": None if sampled or not ar else int(sha == ar.output_sha1), "output_sha1": sha,
           "accept_hist": " ".join(f"{k}:{v}" for k, v in sorted(Counter(s["accept_lens"]).items()))}
    for k in ("strong_calls", "mean_tree_size", "target_calls", "weak_forwards", "strong_forwards", "oracle_extra_s"):
        row[k] = s[k]
    row |= phase_columns(s["phases"], wall)
    return row


def phase_columns(phases: dict, wall: float) -> dict:
    cols = {c: 0.0 for c in PHASE_COLUMNS}
    for k, v in phases.items():
        cols[f"{k}_s" if f"{k}_s" in cols else "overhead_s"] += v
    cols["other_s"] = max(0.0, wall - sum(phases.values()))  # outside the phases: the loop itself
    return cols


def run_config(trio: Trio, prompts: list[Prompt], ids: dict, plan: list[Method], cfg: GenConfig, meta: dict) -> dict:
    """Everything that changes the numbers; a resume must match it exactly."""
    gen = dataclasses.asdict(cfg)
    for k in ("method", "record_stages"):
        gen.pop(k)
    digest = hashlib.sha1(json.dumps([[p.id, p.category, ids[p.id]] for p in prompts]).encode()).hexdigest()
    return {"methods": [m.label for m in plan], "prompts": len(prompts), "prompts_sha1": digest,
            "gen": gen, "models": dict(trio.names), "weights": {r: fingerprint(getattr(trio, r))
                                                                for r in ("target", "weak", "strong")},
            "device": str(trio.device), "dtype": str(trio.dtype).replace("torch.", ""), "kernels": trio.kernels,
            "torch": torch.__version__, "hardware": hardware_class(trio.device)} \
        | ({"int8": trio.int8} if trio.int8 != "none" else {}) \
        | ({"draft_vocab": trio.draft_vocab, "draft_vocab_prompt": trio.draft_vocab_prompt} if trio.draft_vocab else {}) \
        | meta


def fingerprint(model: torch.nn.Module) -> str:
    """Cheap weight identity: drafters re-exported under the same name must not resume old rows."""
    with torch.no_grad():
        total = sum(float(p.detach().sum(dtype=torch.float64)) for p in model.parameters())
    return f"{sum(p.numel() for p in model.parameters())}:{total:.9e}"

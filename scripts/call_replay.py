"""Replay call rules on recorded oracle steps: each step was played both ways from one state (`scheduler
collect`), so a rule's tokens/s is sum(tokens of the branch it picks) / sum(seconds of that branch),
paired across rules (the same timing readings), with a bootstrap over prompts. The oracle row picks
with hindsight; no rule that decides before verifying can have it.

  .venv/bin/python -m treegraft scheduler collect --trio smollm2 --weak asset:weak --strong ngram \
      --dtype float32 --per-suite 4 --max-new-tokens 32 --budget auto --depth 10 --out runs/matched/collect.jsonl
  cp runs/matched/collect.jsonl docs/bench/matched/
  .venv/bin/python scripts/call_replay.py docs/bench/matched/collect.jsonl > docs/bench/matched/replay.md

The rows' features carry strong_match (the n-gram prompt lookup matches at the root) only where the
strong drafter is prompt lookup; rules that read it are left out otherwise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


NEEDED = ("prompt_id", "a0", "a1", "c0", "c1", "features")


def load(path: Path) -> dict[str, np.ndarray]:
    """The steps' columns; SystemExit with the reason for a missing, empty or foreign file."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (write one with `python -m treegraft scheduler collect`)")
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not JSON lines ({e})") from None
    if not rows:
        raise SystemExit(f"{path} holds no steps")
    lacking = [k for k in NEEDED if k not in rows[0]]
    if lacking or "weak_expected" not in rows[0]["features"]:
        raise SystemExit(f"{path}: not `scheduler collect` steps (lacks {', '.join(lacking) or 'weak_expected'})")
    out = {k: np.array([r[k] for r in rows]) for k in ("a0", "a1", "c0", "c1")}
    out["prompt"] = np.array([r["prompt_id"] for r in rows])
    out["expected"] = np.array([r["features"]["weak_expected"] for r in rows])
    if all("strong_match" in r["features"] for r in rows):
        out["match"] = np.array([r["features"]["strong_match"] for r in rows])
    return out


def rules(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n, e = len(d["a0"]), d["expected"]
    out = {"never": np.zeros(n, bool), "always": np.ones(n, bool)}
    out |= {f"when-unsure[unsure={u:g}]": e < u for u in (1.5, 2.0, 2.5)}
    if "match" in d:
        out["when-matched"] = d["match"] >= 1
        out["when-matched, unsure < 2"] = (d["match"] >= 1) & (e < 2.0)
        out["when-matched or unsure < 1.5"] = (d["match"] >= 1) | (e < 1.5)
    out["oracle (hindsight)"] = d["a1"] / d["c1"] > d["a0"] / d["c0"]
    return out


def rate(d: dict[str, np.ndarray], call: np.ndarray, idx) -> float:
    return float(np.where(call, d["a1"], d["a0"])[idx].sum() / np.where(call, d["c1"], d["c0"])[idx].sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", type=Path, help="a `scheduler collect` jsonl")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not 1 <= a.resamples <= 100_000:
        raise SystemExit(f"--resamples must be in [1, 100000], got {a.resamples}")
    d = load(a.rows)
    rs = rules(d)
    prompts = np.unique(d["prompt"])
    rows_of = {p: np.flatnonzero(d["prompt"] == p) for p in prompts}
    rng = np.random.default_rng(a.seed)
    draws = {k: [] for k in rs}
    best_causal = [k for k in rs if k != "oracle (hindsight)"]
    for _ in range(a.resamples):
        idx = np.concatenate([rows_of[p] for p in rng.choice(prompts, len(prompts))])
        base = rate(d, rs["never"], idx)
        for k, call in rs.items():
            draws[k].append(rate(d, call, idx) / base)
    whole = slice(None)
    base = rate(d, rs["never"], whole)
    top = max(best_causal, key=lambda k: rate(d, rs[k], whole))
    print(f"{len(d['a0'])} oracle steps on {len(prompts)} prompts ({a.rows}); tokens/s relative to `never`, "
          f"95% interval over {a.resamples} resamples of the prompts (seed {a.seed}); the last column: how often "
          f"a rule beats `{top}`, the best rule that decides before verifying, in the same resamples.\n")
    print("| rule | calls | tokens/s / never | 95% interval | resamples above " + top + " |")
    print("|---|---|---|---|---|")
    for k, call in rs.items():
        v = np.array(draws[k])
        above = "" if k == top else f"{np.mean(v > np.array(draws[top])):.0%}"
        print(f"| {k} | {call.mean():.0%} | {rate(d, call, whole) / base:.3f} | "
              f"{np.percentile(v, 2.5):.3f}-{np.percentile(v, 97.5):.3f} | {above} |")
    if "match" in d:
        print("\nBy the n-gram prompt lookup matches at the root: share of steps, tokens a call adds "
              "(a1 - a0), a call's time over the step's without (c1 / c0), share the oracle calls.\n")
        print("| root match n | steps | tokens added | time c1 / c0 | oracle calls |")
        print("|---|---|---|---|---|")
        hind = rs["oracle (hindsight)"]
        for n in np.unique(d["match"]):
            m = d["match"] == n
            print(f"| {n} | {m.mean():.0%} | {(d['a1'] - d['a0'])[m].mean():+.2f} | "
                  f"{(d['c1'] / d['c0'])[m].mean():.2f} | {hind[m].mean():.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

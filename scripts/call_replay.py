"""Replay call rules on recorded oracle steps: each step was played both ways from one state (`scheduler
collect`), so a rule's tokens/s is what its calls would have bought, priced the way every replay here
is (treegraft.scheduler_train: Branches.rate on the fitted cost model, the target's prefill and the
strong drafter's one-time prefill included), with a bootstrap over prompts. The rules are the
policies themselves (schedule.*.decide on each step's features); the last row is hindsight's best set
of calls, which no rule that decides before verifying can have.

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
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.schedule import Always, Never, WhenMatched, WhenUnsure
from treegraft.scheduler_train import Branches, fit_cost_model, hindsight, one_time_costs

NEEDED = ("prompt_id", "step", "a0", "a1", "c0", "c1", "n0", "n1", "weak_s", "refine_s", "strong_forwards",
          "verify0_s", "verify1_s", "features")
HINDSIGHT = "hindsight (the oracle's best calls)"


def load(path: Path) -> list[dict]:
    """The recorded steps; SystemExit with the reason for a missing, empty or foreign file."""
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
    return rows


def plays(policy, rows: list[dict]) -> np.ndarray:
    return np.array([policy.decide(r["features"], r["step"]).call for r in rows], bool)


def rules(rows: list[dict], cm: dict, pre: dict) -> dict[str, np.ndarray]:
    """Each rule's call per step."""
    out = {"never": plays(Never(), rows), "always": plays(Always(), rows)}
    unsure = {u: plays(WhenUnsure(u), rows) for u in (1.5, 2.0, 2.5)}
    out |= {f"when-unsure[unsure={u:g}]": calls for u, calls in unsure.items()}
    if all("strong_match" in r["features"] for r in rows):
        matched = plays(WhenMatched(), rows)
        out |= {"when-matched": matched, "when-matched, unsure < 2": matched & unsure[2.0],
                "when-matched or unsure < 1.5": matched | unsure[1.5]}
    return out | {HINDSIGHT: hindsight(rows, cm, pre)}


def resample(rows: list[dict], calls: dict[str, np.ndarray], pre: dict, rng) -> tuple[list[dict], dict, dict]:
    """(steps, calls, one-time costs) of a draw of prompts with replacement; a prompt drawn twice
    counts twice (renamed), its prefills too."""
    prompts = sorted({r["prompt_id"] for r in rows})
    idx, out, paid = [], [], {}
    for j, p in enumerate(rng.choice(prompts, len(prompts))):
        mine = [i for i, r in enumerate(rows) if r["prompt_id"] == p]
        idx += mine
        out += [rows[i] | {"prompt_id": f"{p}#{j}"} for i in mine]
        if p in pre:
            paid[f"{p}#{j}"] = pre[p]
    return out, {k: c[idx] for k, c in calls.items()}, paid


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", type=Path, help="a `scheduler collect` jsonl")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not 1 <= a.resamples <= 100_000:
        raise SystemExit(f"--resamples must be in [1, 100000], got {a.resamples}")
    rows = load(a.rows)
    cm, pre = fit_cost_model(rows), one_time_costs(rows)
    rs = rules(rows, cm, pre)
    b = Branches(rows, cm)
    rate = {k: b.rate(calls, pre) / b.rate(rs["never"], pre) for k, calls in rs.items()}
    top = max((k for k in rs if k != HINDSIGHT), key=rate.get)
    rng = np.random.default_rng(a.seed)
    draws = {k: [] for k in rs}
    for _ in range(a.resamples):
        drawn, calls, paid = resample(rows, rs, pre, rng)
        bd = Branches(drawn, cm)
        base = bd.rate(calls["never"], paid)
        for k, c in calls.items():
            draws[k].append(bd.rate(c, paid) / base)
    print(f"{len(rows)} oracle steps on {len({r['prompt_id'] for r in rows})} prompts ({a.rows}); tokens/s relative to `never` on the "
          f"fitted cost model (treegraft.scheduler_train.Branches), 95% interval over {a.resamples} resamples of the "
          f"prompts (seed {a.seed}); the last column: how often a rule beats `{top}`, the best rule that decides "
          "before verifying, in the same resamples.\n")
    print("| rule | calls | tokens/s / never | 95% interval | resamples above " + top + " |")
    print("|---|---|---|---|---|")
    for k, call in rs.items():
        v = np.array(draws[k])
        above = "" if k == top else f"{np.mean(v > np.array(draws[top])):.0%}"
        print(f"| {k} | {call.mean():.0%} | {rate[k]:.3f} | {np.percentile(v, 2.5):.3f}-{np.percentile(v, 97.5):.3f} "
              f"| {above} |")
    if "when-matched" in rs:
        match = np.array([r["features"]["strong_match"] for r in rows])
        added = np.array([r["a1"] - r["a0"] for r in rows])
        measured = np.array([r["c1"] / r["c0"] for r in rows])
        print("\nBy the n-gram prompt lookup matches at the root: share of steps, tokens a call adds "
              "(a1 - a0), a call's measured time over the step's without (c1 / c0), share hindsight calls.\n")
        print("| root match n | steps | tokens added | time c1 / c0 | hindsight calls |")
        print("|---|---|---|---|---|")
        for n in np.unique(match):
            m = match == n
            print(f"| {n} | {m.mean():.0%} | {added[m].mean():+.2f} | {measured[m].mean():.2f} | "
                  f"{rs[HINDSIGHT][m].mean():.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

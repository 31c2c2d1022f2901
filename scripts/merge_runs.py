"""One bench run from several of the same configuration on different prompts (e.g. live16's 12
held-out prompts of a pair and the next 12): rows, outputs, then summary.csv, report.html and
provenance.md rebuilt from them, as `bench` writes them.

  .venv/bin/python scripts/merge_runs.py OUT RUN RUN [RUN ...]

Refused, with nothing written: a run without results.csv or config.json; runs whose models,
weights, methods, device, dtype or generation settings differ (only the prompt set, its source and
the thread setting may; a setting that one run's version did not record yet is reported and
allowed); a (prompt, method) that two runs both hold; an OUT that exists.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, without an install

from treegraft.bench.run import finish
from treegraft.bench.store import CONFIG, OUTPUTS, RESULTS, append_row, read_rows
from treegraft.models import save_json

FREE = {"prompts", "prompts_sha1", "source", "limit", "threads", "offset"}  # what may differ between parts


class MergeError(ValueError):
    pass


def config_of(run: Path) -> dict:
    for name in (RESULTS, CONFIG):
        if not (run / name).is_file():
            raise MergeError(f"{run} has no {name}: not a finished bench run")
    return json.loads((run / CONFIG).read_text())


def compare(a: dict, b: dict, prefix: str = "") -> tuple[list[str], list[str]]:
    """(settings both record differently, settings only one records), FREE keys aside."""
    clash, lone = [], []
    for k in sorted(set(a) | set(b)):
        if not prefix and k in FREE:
            continue
        if (k in a) != (k in b):
            lone.append(f"{prefix}{k}")
        elif isinstance(a[k], dict) and isinstance(b[k], dict):
            c, l = compare(a[k], b[k], f"{prefix}{k}.")
            clash, lone = clash + c, lone + l
        elif a[k] != b[k]:
            clash.append(f"{prefix}{k}: {a[k]!r} vs {b[k]!r}")
    return clash, lone


def check_same(runs: list[Path], configs: list[dict]) -> list[str]:
    """Raise on a setting two parts disagree on; return the settings only one part recorded."""
    notes = []
    for run, cfg in zip(runs[1:], configs[1:]):
        clash, lone = compare(configs[0], cfg)
        if clash:
            raise MergeError(f"{runs[0]} and {run} differ in {'; '.join(clash)}: not one configuration")
        notes += [f"{k} is recorded by one of {runs[0]} and {run} only (a setting newer than the other run)"
                  for k in lone]
    return notes


def merge(out: Path, runs: list[Path]) -> list[str]:
    if out.exists():
        raise MergeError(f"{out} exists; choose a new output directory")
    configs = [config_of(r) for r in runs]
    notes = check_same(runs, configs)
    rows, seen = [], {}
    for run in runs:
        for r in read_rows(run):
            key = (r["prompt_id"], r["method"])
            if key in seen:
                raise MergeError(f"{key[0]} / {key[1]} is in both {seen[key]} and {run}: the parts must hold "
                                 "different prompts")
            seen[key] = run
            rows.append(r)
    merged = dict(configs[0])
    merged["prompts"] = sum(int(c.get("prompts", 0)) for c in configs)
    merged["prompts_sha1"] = None  # no single prompt list: the parts' lists follow
    merged["source"] = "merged: " + "; ".join(str(c.get("source", "?")) for c in configs)
    merged["parts"] = [{"run": str(r), "prompts": c.get("prompts"), "prompts_sha1": c.get("prompts_sha1"),
                        "source": c.get("source")} for r, c in zip(runs, configs)]
    tmp = out.with_name(out.name + ".merging")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_json(tmp / CONFIG, merged)
        for r in rows:
            append_row(tmp, r)
        with open(tmp / OUTPUTS, "w", encoding="utf-8") as f:
            for run in runs:
                if (run / OUTPUTS).is_file():
                    f.write((run / OUTPUTS).read_text(encoding="utf-8"))
        finish(tmp)
        tmp.rename(out)  # whole or not at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="new directory for the merged run")
    ap.add_argument("runs", type=Path, nargs="+", help="finished bench runs of one configuration")
    a = ap.parse_args(argv)
    if len(a.runs) < 2:
        print("error: name at least two runs to merge", file=sys.stderr)
        return 2
    try:
        notes = merge(a.out, a.runs)
    except MergeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"note: {n}")
    print(f"{a.out}: {sum(1 for _ in read_rows(a.out))} rows from {len(a.runs)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

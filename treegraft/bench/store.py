"""The run directory: results.csv (one row per prompt x method, appended and fsynced as each
finishes), config.json (refuses a resume under another configuration), summary.csv.

A kill can only tear the last line (rows are written whole and synced one by one); opening the
file again drops that torn line, so resuming never loses or duplicates a finished row."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from ..models import save_json

COLUMNS = ["prompt_id", "suite", "category", "method", "prompt_tokens", "new_tokens", "target_forwards", "tau",
           "wall_s", "tokens_per_s", "speedup_vs_ar", "matches_ar", "strong_calls", "mean_tree_size",
           "target_calls", "weak_forwards", "strong_forwards", "oracle_extra_s",
           "draft_weak_s", "draft_strong_s", "schedule_s", "verify_s", "overhead_s", "other_s",
           "accept_hist", "output_sha1"]
PHASE_COLUMNS = ["draft_weak_s", "draft_strong_s", "schedule_s", "verify_s", "overhead_s", "other_s"]
RESULTS, CONFIG, SUMMARY, OUTPUTS = "results.csv", "config.json", "summary.csv", "outputs.jsonl"


class ResumeError(ValueError):
    """The output directory holds a different run; the message says how to proceed."""


# ---------------------------------------------------------------- config.json

def check_config(out: Path, config: dict) -> None:
    """Save the config of a new run; refuse to mix rows of two different configurations."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / CONFIG
    if path.exists():
        old = json.loads(path.read_text())
        diff = differences(old, json.loads(json.dumps(config)))  # through JSON: tuples compare as lists
        if diff:
            raise ResumeError(f"{out} holds a run with a different configuration ({'; '.join(diff)}); "
                              f"resume with the same arguments, or choose a new --out")
        return
    if (out / RESULTS).exists():
        raise ResumeError(f"{out / RESULTS} exists without {CONFIG}; choose a new --out")
    save_json(path, config)


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} then, {b!r} now")
    return out


# ---------------------------------------------------------------- results.csv

def repair(path: Path) -> int:
    """Drop a torn last line (no trailing newline) left by a kill; returns the bytes dropped."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep == len(data):
        return 0
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return len(data) - keep


def read_rows(out: Path) -> list[dict]:
    """Finished rows as dicts of strings (after dropping a torn last line)."""
    path = Path(out) / RESULTS
    repair(path)
    if not path.exists() or path.stat().st_size == 0:
        return []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS:
            raise ResumeError(f"{path} has other columns than this version writes; choose a new --out")
        rows, seen = [], set()
        for r in reader:
            key = (r["prompt_id"], r["method"])
            if None in r or None in r.values() or key in seen:  # short row or duplicate: never count it twice
                continue
            seen.add(key)
            rows.append(r)
    return rows


def append_row(out: Path, row: dict) -> None:
    """Write one whole row and sync it before anyone is told it finished."""
    path = Path(out) / RESULTS
    new = not path.exists() or path.stat().st_size == 0
    buf = io.StringIO()
    w = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    if new:
        w.writeheader()
    w.writerow({k: fmt(row.get(k)) for k in COLUMNS})
    with open(path, "a", encoding="utf-8", newline="") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def append_output(out: Path, obj: dict) -> None:
    """Token ids and text of one generation, beside the row (the last copy of a key wins)."""
    with open(Path(out) / OUTPUTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()


def load_outputs(out: Path) -> dict[tuple[str, str], dict]:
    path = Path(out) / OUTPUTS
    res = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:  # a torn last line
                continue
            res[(d["prompt_id"], d["method"])] = d
    return res


# ---------------------------------------------------------------- summary.csv

def results_frame(out: Path) -> pd.DataFrame:
    rows = read_rows(Path(out))
    df = pd.DataFrame(rows, columns=COLUMNS)
    text = ["prompt_id", "suite", "category", "method", "accept_hist", "output_sha1"]
    for c in COLUMNS:
        if c not in text:
            df[c] = pd.to_numeric(df[c].replace("", np.nan), errors="coerce").astype(float)
    for c in text:
        df[c] = df[c].fillna("").astype(str)
    return df


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per category, per suite (where it has several categories) and overall, for each method:
    means over prompts and pooled tau = sum new_tokens / sum target_forwards."""
    parts = [group_stats(df, "category", "category")]
    multi = df.groupby("suite")["category"].nunique()
    multi = multi[multi > 1].index
    if len(multi):
        parts.append(group_stats(df[df["suite"].isin(multi)], "suite", "suite"))
    parts.append(group_stats(df.assign(all="all"), "all", "all"))
    return pd.concat(parts, ignore_index=True)


def group_stats(df: pd.DataFrame, key: str, level: str) -> pd.DataFrame:
    rows = []
    for (group, method), g in df.groupby([key, "method"], sort=True):
        rows.append({"level": level, "group": group, "method": method, "n": len(g),
                     "new_tokens": g["new_tokens"].mean(), "target_forwards": g["target_forwards"].mean(),
                     "tau_pooled": g["new_tokens"].sum() / g["target_forwards"].sum(),
                     "tau_mean": g["tau"].mean(), "wall_s": g["wall_s"].mean(),
                     "tokens_per_s_pooled": g["new_tokens"].sum() / g["wall_s"].sum(),
                     "tokens_per_s_mean": g["tokens_per_s"].mean(), "speedup_vs_ar_mean": g["speedup_vs_ar"].mean(),
                     "matches_ar": g["matches_ar"].mean(), "strong_calls": g["strong_calls"].mean(),
                     "mean_tree_size": g["mean_tree_size"].mean()})
    return pd.DataFrame(rows)


def write_summary(out: Path) -> pd.DataFrame:
    summary = summarize(results_frame(out))
    tmp = Path(out) / (SUMMARY + ".tmp")
    summary.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(Path(out) / SUMMARY)
    return summary

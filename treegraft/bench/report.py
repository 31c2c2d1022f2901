"""report.html: plotly charts of a run, with plotly.js inlined so it opens without any network."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from ..record import provenance_rows
from .store import PHASE_COLUMNS

REPORT = "report.html"


def parse_hist(s: str) -> Counter:
    """"1:20 2:5" -> Counter({1: 20, 2: 5})."""
    out = Counter()
    for part in str(s).split():
        k, _, v = part.partition(":")
        out[int(k)] += int(v)
    return out


def bars(summary: pd.DataFrame, value: str, title: str, unit: str) -> go.Figure:
    fig = go.Figure()
    for method, g in summary.groupby("method", sort=False):
        fig.add_bar(name=method, x=g["group"], y=g[value])
    fig.update_layout(title=title, barmode="group", yaxis_title=unit, legend_title="method")
    return fig


def accept_hist_figure(df: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for method, g in df.groupby("method", sort=False):
        h = Counter()
        for s in g["accept_hist"]:
            h += parse_hist(s)
        total = sum(h.values())
        if total:
            xs = sorted(h)
            fig.add_bar(name=method, x=xs, y=[h[x] / total for x in xs])
    fig.update_layout(title="Tokens per target forward (accepted drafts + bonus), all prompts", barmode="group",
                      xaxis_title="tokens per target forward", yaxis_title="fraction of target forwards")
    return fig


def phase_figure(df: pd.DataFrame) -> go.Figure:
    per_token = df.groupby("method", sort=False)[PHASE_COLUMNS + ["new_tokens"]].sum()
    fig = go.Figure()
    for col in PHASE_COLUMNS:
        ms = 1e3 * per_token[col] / per_token["new_tokens"].where(per_token["new_tokens"] > 0)
        fig.add_bar(name=col.removesuffix("_s"), x=per_token.index, y=ms)
    fig.update_layout(title="Where the time goes: ms per generated token, by phase", barmode="stack",
                      yaxis_title="ms per generated token")
    return fig


def write_report(out: Path, df: pd.DataFrame, summary: pd.DataFrame, config: dict) -> Path:
    by_cat = summary[summary["level"] != "suite"]
    figs = [bars(by_cat, "speedup_vs_ar_mean", "Speedup vs ar (same prompt, same run), mean over prompts", "x ar"),
            bars(by_cat, "tau_pooled", "tau: tokens per target forward (pooled)", "tokens / target forward"),
            bars(by_cat, "tokens_per_s_pooled", "Throughput (pooled)", "tokens/s"),
            accept_hist_figure(df), phase_figure(df)]
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figs)]
    overall = summary[summary["level"] == "all"].drop(columns=["level", "group"])
    head = (f"<h1>TreeGraft benchmark</h1><p>models: {html.escape(str(config.get('models')))}; "
            f"device {html.escape(str(config.get('device')))}, {html.escape(str(config.get('dtype')))}; "
            f"{len(df)} rows. tau = new tokens / target forwards; speedup = the method's tokens/s over "
            f"ar's on the same prompt (greedy outputs are identical, so: ar's wall time over the method's).</p>")
    table = overall.to_html(index=False, float_format=lambda v: f"{v:.3g}")
    body = head + table + "".join(parts)
    path = Path(out) / REPORT
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>TreeGraft benchmark</title>"
                   f"</head><body style='font-family:sans-serif'>{body}</body></html>", encoding="utf-8")
    tmp.replace(path)
    return path


def provenance_markdown(outputs: dict) -> str:
    """Acceptance of drafted nodes by provenance and depth, pooled over prompts, per engine method:
    each cell 'accepted / sent (rate)'. `outputs`: load_outputs' {(prompt, method): object}."""
    pooled: dict = {}
    for (_, method), obj in outputs.items():
        for kind, depths in (obj.get("provenance") or {}).items():
            for d, (sent, acc) in depths.items():
                cell = pooled.setdefault(method, {}).setdefault(kind, {}).setdefault(int(d), [0, 0])
                cell[0] += sent
                cell[1] += acc
    lines = ["# Where accepted tokens came from", "",
             "Nodes sent to the target by provenance (weak = the weak drafter's, rescored = weak but rescored",
             "by the strong drafter, graft / recovered = proposed by the strong drafter inside TreeGraft,",
             "strong = tree-strong's) and depth; each cell: accepted / sent (acceptance rate).", ""]
    for method in sorted(pooled):
        depths, rows = provenance_rows(pooled[method])
        lines += [f"## {method}", "", "| provenance | " + " | ".join(f"depth {d}" for d in depths) + " | all |",
                  "|---|" + "---|" * (len(depths) + 1)]
        lines += [f"| {kind} | " + " | ".join(row) + f" | {total} |" for kind, row, total in rows]
        lines.append("")
    return "\n".join(lines)

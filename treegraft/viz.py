"""Tree layout (networkx) and plotly figures for the app and reports.

Presentation only: reads StepRecords, never touches models, caches or Streamlit, so it can be
tested alone. Every figure carries `layout.meta = {"kind": ...}` and every trace a `meta` role so
that tests and the browser can find and count points without guessing:

  tree figure, trace meta
    "tree"     the nodes of the tree at this stage, one point per node, split by provenance.
               For the "selected" and "verified" stages these are exactly the nodes sent to the
               target (len(record.selected)); before selection, the whole candidate pool.
    "pruned"   pool candidates that were not sent to the target (faded; optional)
    "overlay"  markers drawn on top: accepted path, first rejected node, bonus token
    "root"     the last accepted token the tree hangs from
    "edges"    lines only
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Callable, Iterable

import networkx as nx
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import colors
from .record import StepRecord, provenance_by_depth, provenance_rows, provenance_summary

ROOT = -1
POOL_STAGES = ("weak pool", "strong pool", "rescored", "recovered", "grafted")
FINAL_STAGES = ("selected", "verified")

# Provenance -> (legend label, colour, marker symbol): defined once in treegraft.colors.
PROVENANCE = colors.PROVENANCE
STAGE_HELP = {
    "weak pool": "The weak drafter grows an EAGLE-2 style tree: at each depth it expands the most "
                 "promising frontier nodes in one batched forward and keeps every candidate.",
    "strong pool": "The strong drafter alone grows the tree (the tree-strong endpoint).",
    "rescored": "The strong drafter scores the best pool nodes (in one forward; a drafter that reads the "
                "target's hidden states needs one per tree level); their scores (and the path values "
                "below them) now use its log-probabilities.",
    "recovered": "Tokens the strong drafter ranks high under a scored parent, but the weak drafter never "
                 "proposed, are added back as recovered children.",
    "grafted": "With the refined values, the best positions are re-chosen and the strong drafter grows "
               "small subtrees below them. Nothing the weak drafter proposed is deleted.",
    "selected": "The top nodes by path value, ancestor-closed, within the budget, become the tree the "
                "target verifies; the rest are pruned.",
    "verified": "One target forward checks the whole tree. The longest path the target agrees with is "
                "accepted, plus one token of its own (the bonus). Greedy, it agrees with a node whose token is "
                "its own top token there; sampling (temperature > 0), it tries a node's children in order and "
                "accepts each with its own probability of that token, renormalised after every rejection, "
                "which is exactly a sample of the target.",
}
Decode = Callable[[int], str]


# ---------------------------------------------------------------- reading a record

def stage_names(rec: StepRecord) -> list[str]:
    names = [s["name"] for s in rec.stages]
    return names or ["verified"]


def stage_nodes(rec: StepRecord, stage: str | None = None) -> list[dict]:
    """The node snapshot of one stage; the final pool (with accepted flags) by default."""
    if stage in (None, "verified"):
        return rec.nodes
    for s in rec.stages:
        if s["name"] == stage:
            return s["nodes"]
    raise KeyError(f"step {rec.step} has no stage {stage!r}; it has {stage_names(rec)}")


def provenance(node: dict) -> str:
    if node["origin"] in ("graft", "recovered", "strong"):
        return node["origin"]
    return "rescored" if node.get("rescored") else "weak"


def kept(nodes: list[dict], stage: str) -> list[dict]:
    """Nodes drawn as the tree: after selection only the selected ones, before it the whole pool."""
    if stage in FINAL_STAGES:
        return [n for n in nodes if n.get("selected")]
    return list(nodes)


def ranks(nodes: list[dict]) -> dict[int, int]:
    """Rank by path value V (1 = most likely path), as the final selection sees it."""
    order = sorted(nodes, key=lambda n: (-n["value"], n["depth"], n["id"]))
    return {n["id"]: i + 1 for i, n in enumerate(order)}


def token_label(decode: Decode | None, token: int) -> str:
    if decode is None:
        return f"#{token}"
    text = decode(token)
    # Whitespace tokens are invisible otherwise; show them escaped.
    return repr(text)[1:-1] if text.strip() == "" or "\n" in text else text


def first_rejected(rec: StepRecord) -> int | None:
    """The best-valued selected child of the last accepted node: where the target disagreed first."""
    parent = rec.accepted[-1] if rec.accepted else ROOT
    kids = [n for n in rec.nodes if n["parent"] == parent and n.get("selected") and not n.get("accepted")]
    if not kids:
        return None
    return max(kids, key=lambda n: n["value"])["id"]


def bonus_shown(rec: StepRecord) -> bool:
    """The bonus is dropped when eos or the token limit cut the step short."""
    return rec.bonus >= 0 and len(rec.new_tokens) == len(rec.accepted) + 1


# ---------------------------------------------------------------- layout

def tree_graph(nodes: list[dict], decode: Decode | None = None) -> nx.DiGraph:
    """Directed tree rooted at "root"; node attributes are the record's fields plus text."""
    g = nx.DiGraph()
    g.add_node("root")
    ids = {n["id"] for n in nodes}
    for n in nodes:
        # GraphML has no null: a missing log-prob is NaN (keeps the column numeric), others "".
        attrs = {k: (float("nan") if k.endswith("logp") else "") if v is None else v
                 for k, v in n.items() if k != "id"}
        g.add_node(n["id"], **attrs, text=token_label(decode, n["token"]), provenance=provenance(n))
    for n in nodes:
        parent = n["parent"] if n["parent"] in ids else "root"
        g.add_edge(parent, n["id"])
    return g


def tidy_layout(g: nx.DiGraph) -> dict:
    """Left-to-right tidy tree: x = depth, leaves on consecutive rows in DFS order, each parent
    centred on its children. Row 0 is the top. Children go accepted first, then by path value, so
    the accepted path runs along the top and the most likely candidates follow, as the axis says.
    A node may carry `first=True` (the bonus token): it goes before its siblings."""
    def order(children):
        return sorted(children, key=lambda c: (not g.nodes[c].get("first", False),
                                               not g.nodes[c].get("accepted", False),
                                               -float(g.nodes[c].get("value", 0.0)), str(c)))

    pos, next_row = {}, 0
    stack = [("root", False)]
    while stack:  # iterative post-order: deep trees never hit the recursion limit
        v, done = stack.pop()
        kids = list(g.successors(v))
        if not done:
            stack.append((v, True))
            stack.extend((c, False) for c in reversed(order(kids)))
            continue
        if kids:
            ys = [pos[c][1] for c in kids]
            y = (min(ys) + max(ys)) / 2
        else:
            y, next_row = next_row, next_row + 1
        pos[v] = (0 if v == "root" else g.nodes[v]["depth"], y)
    return pos


# ---------------------------------------------------------------- the tree figure

LABELS_PER_COLUMN = 6   # token text on at most this many nodes per depth; every node has hover text
LABEL_CHARS = 12


def _hover(n: dict, rank: int, decode: Decode | None, hidden: int = 0) -> str:
    def lp(x):
        return "-" if x is None else f"{x:.3f}"
    more = f"<br><i>+{hidden} pruned candidate{'s' if hidden != 1 else ''} below, collapsed</i>" if hidden else ""
    return (f"<b>{html.escape(token_label(decode, n['token']))}</b> (id {n['token']})<br>"
            f"node {n['id']}, depth {n['depth']}, rank {rank} by path value<br>"
            f"provenance: {PROVENANCE[provenance(n)][0]}<br>"
            f"log q_weak: {lp(n.get('weak_logp'))} nats, log q_strong: {lp(n.get('strong_logp'))} nats<br>"
            f"score s: {n['score']:.3f}, path value V: {n['value']:.3f} nats (p = {math.exp(n['value']):.2e})<br>"
            f"graft point: {'yes' if n.get('graft_point') else 'no'}, expanded by: {n.get('expanded_by') or '-'}<br>"
            f"selected: {'yes' if n.get('selected') else 'no'}, accepted: {'yes' if n.get('accepted') else 'no'}"
            + more)


def _edges(g, pos, node_ids, name, color, width, meta="edges", dash=None) -> go.Scatter:
    xs, ys = [], []
    for v in node_ids:
        for u in g.predecessors(v):
            xs += [pos[u][0], pos[v][0], None]
            ys += [pos[u][1], pos[v][1], None]
    return go.Scatter(x=xs, y=ys, mode="lines", name=name, meta=meta, hoverinfo="skip", showlegend=False,
                      line=dict(color=color, width=width, dash=dash))


def collapse_pruned(nodes: list[dict], tree_ids: set) -> tuple[list[dict], dict[int, int]]:
    """Pruned candidates drawn as the top of each pruned subtree only (its parent is in the tree or
    is the root); returns those nodes and, per node, how many pruned descendants it stands for."""
    by_id = {n["id"]: n for n in nodes}
    top, hidden = [], {}
    for n in nodes:
        if n["id"] in tree_ids:
            continue
        if n["parent"] == ROOT or n["parent"] in tree_ids:
            top.append(n)
            hidden[n["id"]] = 0
            continue
        # Climb to the pruned subtree's top (parents precede children, so it is known by now).
        u = by_id[n["parent"]]
        while u["parent"] != ROOT and u["parent"] not in tree_ids:
            u = by_id[u["parent"]]
        hidden[u["id"]] = hidden.get(u["id"], 0) + 1
    return top, hidden


def label_nodes(tree: list[dict], pos: dict, rank: dict, min_gap: float,
                per_column: int = LABELS_PER_COLUMN) -> set:
    """Nodes whose token text is printed: per depth, the accepted node and then the best-ranked
    ones, at most `per_column`, never two closer than `min_gap` rows (so labels never overlap)."""
    out = set()
    by_depth: dict[int, list[dict]] = {}
    for n in tree:
        by_depth.setdefault(n["depth"], []).append(n)
    for column in by_depth.values():
        taken: list[float] = []
        for n in sorted(column, key=lambda n: (not n.get("accepted"), rank[n["id"]])):
            if len(taken) >= per_column:
                break
            y = pos[n["id"]][1]
            if all(abs(y - t) >= min_gap for t in taken):
                taken.append(y)
                out.add(n["id"])
    return out


def _short(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "\u2026"


def tree_figure(rec: StepRecord, stage: str | None = None, decode: Decode | None = None,
                show_pruned: bool = True, title: str | None = None) -> go.Figure:
    stage = stage or stage_names(rec)[-1]
    nodes = stage_nodes(rec, stage)
    tree = kept(nodes, stage)
    tree_ids = {n["id"] for n in tree}
    pruned, hidden = collapse_pruned(nodes, tree_ids) if show_pruned else ([], {})
    shown = tree + pruned
    g = tree_graph(shown, decode)
    bonus = stage == "verified" and bonus_shown(rec)
    acc = [i for i in rec.accepted if i in g] if stage == "verified" else []
    if bonus:  # the bonus gets a row of its own, above its siblings: it never covers a label
        parent = acc[-1] if acc else "root"
        depth = g.nodes[parent]["depth"] + 1 if acc else 1
        g.add_node("bonus", depth=depth, first=True, value=0.0)
        g.add_edge(parent, "bonus")
    pos = tidy_layout(g)
    rank = ranks(nodes)
    rows = max(1, len([v for v in g if g.out_degree(v) == 0]))
    height = int(min(1400, max(440, 190 + 13 * rows)))
    top, bottom = 50, 150  # the bottom holds the legend, which wraps in narrow columns
    row_px = (height - top - bottom) / rows
    size = max(4.0, min(12.0, 0.9 * row_px))  # markers shrink when rows get dense (budget 512)
    labelled = label_nodes(tree, pos, rank, min_gap=max(1.0, 15 / row_px))

    fig = go.Figure()
    fig.add_trace(_edges(g, pos, [n["id"] for n in pruned], "pruned edges", "rgba(160,160,160,0.35)", 1))
    fig.add_trace(_edges(g, pos, sorted(tree_ids), "tree edges", "#888", 1.5))
    if pruned:
        fig.add_trace(go.Scatter(
            x=[pos[n["id"]][0] for n in pruned], y=[pos[n["id"]][1] for n in pruned], mode="markers",
            name="pruned: not sent to the target (subtrees collapsed)", meta="pruned", opacity=0.35,
            marker=dict(color=colors.PRUNED, size=[min(size + 2 * math.log1p(hidden[n["id"]]), 16) for n in pruned],
                        symbol=[PROVENANCE[provenance(n)][2] for n in pruned]),
            hovertext=[_hover(n, rank[n["id"]], decode, hidden[n["id"]]) for n in pruned], hoverinfo="text"))
    for key, (label, color, symbol) in PROVENANCE.items():
        group = [n for n in tree if provenance(n) == key]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[pos[n["id"]][0] for n in group], y=[pos[n["id"]][1] for n in group],
            mode="markers+text", name=label, meta="tree",
            text=[_short(token_label(decode, n["token"])) if n["id"] in labelled else "" for n in group],
            # A halo in the background colour keeps a label readable where edges cross it.
            textposition="middle right", textfont=dict(size=11, color="#222", shadow="1px 1px 2px white"),
            marker=dict(color=color, size=size, symbol=symbol,
                        line=dict(color="black", width=[2.5 if n.get("graft_point") else 0.5 for n in group])),
            hovertext=[_hover(n, rank[n["id"]], decode) for n in group], hoverinfo="text"))
    if stage == "verified":
        _add_verdict(fig, rec, pos, decode, acc, bonus)
    fig.add_trace(go.Scatter(
        x=[0], y=[pos["root"][1]], mode="markers+text", name="root: last accepted token", meta="root",
        text=[_short(token_label(decode, rec.root_token))], textposition="middle left",
        marker=dict(color="black", size=14, symbol="square"),
        hovertext=[f"root: last accepted token {html.escape(token_label(decode, rec.root_token))} "
                   f"at position {rec.root_pos}"], hoverinfo="text"))
    deepest = max([x for x, _ in pos.values()] + [1])
    n_hidden = sum(hidden.values())
    fig.update_layout(
        title=title or f"Step {rec.step} - {stage}: {len(tree)} tree nodes"
                       + (f" ({len(pruned) + n_hidden} pruned, faded" + (f"; {n_hidden} collapsed" if n_hidden else "")
                          + ")" if pruned else ""),
        # Padding on the right keeps the last column's token labels inside the plot.
        xaxis=dict(title="depth below the root (tokens)", dtick=1, zeroline=False, range=[-0.4, deepest + 0.8]),
        yaxis=dict(title="accepted path on top, then the most likely candidates", autorange="reversed",
                   showticklabels=False, zeroline=False, showgrid=False),
        height=height, hovermode="closest",
        # Legend under the axis title (a fixed 60 px gap); above the plot it collides with the title.
        legend=dict(orientation="h", yanchor="top", y=-60 / (height - top - bottom), x=0),
        margin=dict(l=40, r=20, t=top, b=bottom),
        meta={"kind": "tree", "step": rec.step, "stage": stage, "tree_nodes": len(tree),
              "pruned_nodes": len(pruned), "pruned_collapsed": n_hidden, "labelled": len(labelled)})
    return fig


def _add_verdict(fig, rec, pos, decode, acc, bonus) -> None:
    """Accepted path (ringed), the first rejected candidate (x) and the bonus token (star)."""
    if acc:
        path = ["root"] + acc
        fig.add_trace(go.Scatter(x=[pos[v][0] for v in path], y=[pos[v][1] for v in path],
                                 mode="lines", name="accepted path (edges)", meta="edges", showlegend=False,
                                 hoverinfo="skip", line=dict(color=colors.ACCEPTED, width=4)))
        fig.add_trace(go.Scatter(x=[pos[i][0] for i in acc], y=[pos[i][1] for i in acc], mode="markers",
                                 name="accepted by the target", meta="overlay", hoverinfo="skip",
                                 marker=dict(symbol="circle-open", size=22, color=colors.ACCEPTED,
                                             line=dict(width=3))))
    rej = first_rejected(rec)
    if rej is not None and rej in pos:
        fig.add_trace(go.Scatter(x=[pos[rej][0]], y=[pos[rej][1]], mode="markers",
                                 name="first rejected (target disagreed)", meta="overlay", hoverinfo="skip",
                                 marker=dict(symbol="x-thin-open", size=20, color=colors.REJECTED, line=dict(width=3))))
    if bonus:
        parent = acc[-1] if acc else "root"
        x, y = pos["bonus"]
        fig.add_trace(go.Scatter(x=[pos[parent][0], x], y=[pos[parent][1], y], mode="lines", meta="edges",
                                 showlegend=False, hoverinfo="skip",
                                 line=dict(color=colors.ACCEPTED, width=2, dash="dot")))
        fig.add_trace(go.Scatter(
            x=[x], y=[y], mode="markers+text", name="bonus: the target's own next token", meta="overlay",
            text=[_short(token_label(decode, rec.bonus))], textposition="middle right",
            marker=dict(symbol="star", size=18, color=colors.BONUS, line=dict(color="black", width=1)),
            hovertext=[f"bonus token {html.escape(token_label(decode, rec.bonus))} (id {rec.bonus}): "
                       f"the target's own prediction after the accepted path"], hoverinfo="text"))


def count_points(fig_json: dict, meta: str) -> int:
    """Points in the traces of one role (works on fig.to_plotly_json() and on the browser's data)."""
    data = fig_json["data"] if isinstance(fig_json, dict) else fig_json
    return sum(len(t.get("x") or []) for t in data if t.get("meta") == meta)


# ---------------------------------------------------------------- exports and tables

def tree_graphml(rec: StepRecord, stage: str | None = None, decode: Decode | None = None) -> str:
    g = tree_graph(stage_nodes(rec, stage), decode)
    g.nodes["root"].update(token=rec.root_token, text=token_label(decode, rec.root_token), depth=0)
    g.graph.update(step=rec.step, stage=stage or "verified", method=rec.method)
    return "\n".join(nx.generate_graphml(g))


def nodes_table(rec: StepRecord, stage: str | None = None, decode: Decode | None = None) -> pd.DataFrame:
    nodes = stage_nodes(rec, stage)
    rank = ranks(nodes)
    rows = [{"id": n["id"], "token": n["token"], "text": token_label(decode, n["token"]),
             "parent": n["parent"], "depth": n["depth"], "provenance": provenance(n),
             "log q_weak (nats)": n.get("weak_logp"), "log q_strong (nats)": n.get("strong_logp"),
             "score s (nats)": n["score"], "path value V (nats)": n["value"], "rank": rank[n["id"]],
             "graft point": bool(n.get("graft_point")), "selected": bool(n.get("selected")),
             "accepted": bool(n.get("accepted")), "expanded by": n.get("expanded_by") or ""}
            for n in nodes]
    cols = ["id", "token", "text", "parent", "depth", "provenance", "log q_weak (nats)", "log q_strong (nats)",
            "score s (nats)", "path value V (nats)", "rank", "graft point", "selected", "accepted", "expanded by"]
    return pd.DataFrame(rows, columns=cols).sort_values("rank").reset_index(drop=True)


def stage_diff(rec: StepRecord, stage: str) -> dict:
    """What one stage changed relative to the previous one (for the walkthrough)."""
    names = stage_names(rec)
    i = names.index(stage)
    now = {n["id"]: n for n in stage_nodes(rec, stage)}
    before = {n["id"]: n for n in stage_nodes(rec, names[i - 1])} if i > 0 else {}
    added = [n for k, n in now.items() if k not in before]
    out = {"nodes": len(now), "added": len(added),
           "added_by_provenance": {p: sum(provenance(n) == p for n in added) for p in PROVENANCE},
           "newly_rescored": sum(1 for k, n in now.items() if n.get("rescored") and not before.get(k, {}).get("rescored")),
           "graft_points": sum(1 for n in now.values() if n.get("graft_point")),
           "selected": sum(1 for n in now.values() if n.get("selected")),
           "accepted": sum(1 for n in now.values() if n.get("accepted"))}
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def token_arithmetic(rec: StepRecord) -> str:
    """'2 accepted + 1 bonus = 3 tokens', true also when eos or max new tokens cut the step:
    '1 of 3 accepted kept + 0 bonus = 1 token (cut at the token limit or end of text)'."""
    p = provenance_summary(rec)
    kept, drafted, bonus = p["accepted_kept"], p["accepted_drafted"], p["bonus"]
    acc = f"{kept} of {drafted} accepted kept" if kept < drafted else f"{kept} accepted"
    text = f"{acc} + {bonus} bonus = {plural(p['tokens'], 'token')}"
    if p["cut"]:
        text += " (cut: end of text or max new tokens reached)"
    return text


def strong_changes(rec: StepRecord) -> str:
    """One sentence: what the strong drafter changed in this step and what of it the target took."""
    if not rec.strong_called:
        return ""
    p = provenance_summary(rec)
    acc = p["accepted"]
    took = ", ".join(f"{acc[k]} {name}" for k, name in (("rescored", "rescored"), ("graft", "grafted"),
                                                         ("recovered", "recovered"), ("weak", "weak")) if acc[k])
    return (f"Strong drafter: rescored {plural(p['rescored'], 'node')}, recovered {p['recovered']}, "
            f"grafted {p['grafted']} (below {plural(p['graft_points'], 'graft point')}); "
            f"{p['selected']['rescored'] + p['selected']['graft'] + p['selected']['recovered']} of the "
            f"{len(rec.selected)} verified nodes carry its scores. Accepted tokens by provenance: "
            f"{took or 'none accepted'}"
            + (f" ({p['accepted_from_strong']} of {p['accepted_kept']} from the strong drafter's work)"
               if p["accepted_kept"] else "") + ".")


def shaded_text_html(records: Iterable[StepRecord]) -> str:
    """Generated text with each step's tokens (accepted + bonus) on its own shade."""
    shades = ["#DCEBFA", "#FCE5CD", "#D9EAD3", "#EAD1DC", "#FFF2CC", "#D0E0E3"]
    spans = []
    for r in records:
        title = f"step {r.step}: {plural(r.accept_len, 'token')}" + (", strong drafter ran" if r.strong_called else "")
        border = f"border-bottom:2px solid {colors.STRONG};" if r.strong_called else ""
        spans.append(f'<span title="{html.escape(title)}" style="background:{shades[r.step % len(shades)]};'
                     f'{border}border-radius:3px;padding:0 1px">{html.escape(r.text)}</span>')
    return f'<div style="white-space:pre-wrap;line-height:1.7;font-family:monospace">{"".join(spans)}</div>'


# ---------------------------------------------------------------- live charts

def _cumulative(records: list[StepRecord]) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.cumsum([r.accept_len for r in records], dtype=float)
    wall = np.cumsum([r.wall_s for r in records], dtype=float)
    return tokens, wall


def accept_figure(records: list[StepRecord]) -> go.Figure:
    """Tokens per step, stacked by where they came from: accepted draft tokens by provenance, then
    the bonus. A marker on top says whether the strong drafter ran (red) or not (blue)."""
    fig = go.Figure()
    sums = [provenance_summary(r) for r in records]
    steps = [r.step for r in records]
    for key, (label, color, _) in PROVENANCE.items():
        ys = [p["accepted"][key] for p in sums]
        if any(ys):
            fig.add_trace(go.Bar(x=steps, y=ys, name=f"accepted: {label}", meta="stack", marker_color=color,
                                 hovertemplate="step %{x}: %{y} accepted<extra>" + label + "</extra>"))
    fig.add_trace(go.Bar(x=steps, y=[p["bonus"] for p in sums], name="bonus (the target's own token)", meta="stack",
                         marker_color=colors.BONUS, hovertemplate="step %{x}: %{y} bonus<extra></extra>"))
    for called, name, color, symbol in ((True, "step total, strong drafter ran", colors.STRONG, "triangle-down"),
                                        (False, "step total, weak drafter only", colors.WEAK, "circle")):
        rs = [r for r in records if r.strong_called == called]
        if rs or called:
            fig.add_trace(go.Scatter(x=[r.step for r in rs], y=[r.accept_len + 0.35 for r in rs], mode="markers+text",
                                     name=name, meta="points", text=[str(r.accept_len) for r in rs],
                                     textposition="top center", marker=dict(color=color, symbol=symbol, size=9),
                                     hovertemplate="step %{x}: %{text} tokens<extra>" + name + "</extra>"))
    if records:
        tau = sum(r.accept_len for r in records) / len(records)
        # A legend entry, not an annotation: an annotation hides behind tall bars.
        fig.add_trace(go.Scatter(x=[min(steps) - 0.5, max(steps) + 0.5], y=[tau, tau], mode="lines", meta="mean",
                                 name=f"mean tau = {tau:.2f} tokens/forward", hoverinfo="name",
                                 line=dict(color="black", dash="dash", width=1.5)))
    top = max([r.accept_len for r in records] + [1])
    fig.update_layout(title="Tokens per step, by provenance", barmode="stack", height=360,
                      xaxis=dict(title="step (one target forward each)", dtick=1 if len(records) <= 30 else None),
                      yaxis=dict(title="accepted tokens + bonus (tokens)", range=[0, top + 1.2]),
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0, font=dict(size=10)),
                      meta={"kind": "accept", "points": len(records)}, margin=dict(t=50, b=40))
    return fig


def _method_style(method: str) -> dict:
    c = colors.method_color(method)
    return dict(line=dict(color=c), marker=dict(color=c))


def throughput_figure(runs: dict[str, list[StepRecord]], title: str = "Tokens vs measured wall time") -> go.Figure:
    """Cumulative tokens against cumulative measured wall time, one line per method."""
    fig = go.Figure()
    for method, records in runs.items():
        tokens, wall = _cumulative(records)
        # Plain lists, not numpy: plotly would ship typed arrays, which tests and the browser count badly.
        fig.add_trace(go.Scatter(x=wall.tolist(), y=tokens.tolist(), mode="lines+markers", name=method, meta="points",
                                 hovertemplate="%{y:.0f} tokens after %{x:.2f} s<extra>" + method + "</extra>",
                                 **_method_style(method)))
    fig.update_layout(title=title, height=360,
                      xaxis=dict(title="wall time (s)", rangemode="tozero"),
                      yaxis=dict(title="tokens generated (tokens)", rangemode="tozero"),
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0),
                      meta={"kind": "throughput", "points": {m: len(r) for m, r in runs.items()}},
                      margin=dict(t=50, b=40))
    return fig


def ar_time_at(ar: list[StepRecord], tokens: np.ndarray) -> np.ndarray:
    """Time plain decoding took (or, past its end, would take at its mean rate) for n tokens."""
    t, w = _cumulative(ar)
    t, w = np.concatenate([[0.0], t]), np.concatenate([[0.0], w])
    rate = w[-1] / t[-1] if t[-1] > 0 else float("nan")
    return np.where(tokens <= t[-1], np.interp(tokens, t, w), tokens * rate)


def speedup_figure(runs: dict[str, list[StepRecord]], title: str = "Running speedup vs ar (wall time)") -> go.Figure:
    """Running speedup: time ar needed for the same number of tokens / time this method took."""
    fig = go.Figure()
    ar = runs.get("ar")
    if ar:
        for method, records in runs.items():
            if method == "ar" or not records:
                continue
            tokens, wall = _cumulative(records)
            speed = ar_time_at(ar, tokens) / np.maximum(wall, 1e-9)
            fig.add_trace(go.Scatter(x=tokens.tolist(), y=speed.tolist(), mode="lines+markers", name=method, meta="points",
                                     hovertemplate="%{y:.2f}x after %{x:.0f} tokens<extra>" + method + "</extra>",
                                     **_method_style(method)))
        fig.add_trace(go.Scatter(x=[0, max(len(r) and _cumulative(r)[0][-1] for r in runs.values())], y=[1, 1],
                                 mode="lines", name="ar = 1x", meta="reference", hoverinfo="skip",
                                 line=dict(color=colors.AR, dash="dot", width=1)))
    else:
        fig.add_annotation(text="Compare with the baselines to measure ar on this prompt", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, height=360,
                      xaxis=dict(title="tokens generated (tokens)", rangemode="tozero"),
                      yaxis=dict(title="speedup vs ar (x, wall time ratio)", rangemode="tozero"),
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0),
                      meta={"kind": "speedup"}, margin=dict(t=50, b=40))
    return fig


SPEED_MEASURES = ("wall time", "per target forward", "median step cost")


def provenance_table(records: list[StepRecord]) -> pd.DataFrame:
    """Where a run's accepted tokens came from: per provenance (legend labels), per depth, accepted /
    sent to the target (rate), over every step so far."""
    depths, rows = provenance_rows(provenance_by_depth(records))
    return pd.DataFrame([{"provenance": PROVENANCE.get(kind, (kind,))[0]}
                         | {f"depth {d}": cell for d, cell in zip(depths, row)} | {"all depths": total}
                         for kind, row, total in rows])


def speed_table(runs: dict[str, list[StepRecord]]) -> pd.DataFrame:
    """Speedup vs ar three ways, per method:
      wall time           total time of ar for as many tokens / this method's total time;
      per target forward  tau: tokens per target forward (ar's is 1). Hardware-independent: it only
                          counts tokens, so no other process on the machine can move it;
      median step cost    tau x median ar step / median step of this method: the same cost
                          measurement as wall time, but medians ignore bursts of load."""
    ar = runs.get("ar")
    rows = []
    for method, records in runs.items():
        if not records:
            continue
        tokens = sum(r.accept_len for r in records)
        wall = sum(r.wall_s for r in records)
        tau = tokens / len(records)
        row = {"method": method, "tokens": tokens, "target forwards": len(records), "tau (tokens/forward)": tau,
               "tokens/s": tokens / wall if wall > 0 else float("nan"),
               "median step (ms)": 1e3 * float(np.median([r.wall_s for r in records]))}
        if ar:
            ar_step = float(np.median([r.wall_s for r in ar]))
            row["x ar: wall time"] = float(ar_time_at(ar, np.array([float(tokens)]))[0] / max(wall, 1e-9))
            row["x ar: per target forward"] = tau / (sum(r.accept_len for r in ar) / len(ar))
            row["x ar: median step cost"] = tau * ar_step / max(1e-9, row["median step (ms)"] / 1e3)
        rows.append(row)
    return pd.DataFrame(rows)


def speed_modes_figure(runs: dict[str, list[StepRecord]]) -> go.Figure:
    """Speedup vs ar measured three ways, one bar per method in its colour."""
    table = speed_table(runs)
    fig = go.Figure()
    if "x ar: wall time" in table.columns:
        for _, row in table.iterrows():
            if row["method"] == "ar":
                continue
            ys = [row[f"x ar: {m}"] for m in SPEED_MEASURES]
            fig.add_trace(go.Bar(x=list(SPEED_MEASURES), y=ys, name=row["method"], meta="points",
                                 marker_color=colors.method_color(row["method"]),
                                 text=[f"{y:.2f}" for y in ys], textposition="outside", textfont=dict(size=9),
                                 hovertemplate="%{x}: %{y:.2f}x<extra>" + row["method"] + "</extra>"))
        fig.add_trace(go.Scatter(x=list(SPEED_MEASURES), y=[1, 1, 1], mode="lines", name="ar = 1x", meta="reference",
                                 hoverinfo="skip", line=dict(color=colors.AR, dash="dot", width=1)))
    else:
        fig.add_annotation(text="Compare with the baselines to see the speedups", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title="Speedup vs ar, three ways", barmode="group", height=360,
                      yaxis=dict(title="speedup vs ar (x)", rangemode="tozero"),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, x=0),
                      meta={"kind": "speed_modes"}, margin=dict(t=50, b=40))
    return fig


# ---------------------------------------------------------------- the scheduler

def step_kind(r: StepRecord) -> str:
    """'call', 'skip', or 'solo': a solo step (the solo arm, or strong-first where the strong tree was
    sure) records no call, yet its one tree, and the features it was decided on, are the strong drafter's."""
    d = r.decision or {}
    if d.get("call"):
        return "call"
    return "solo" if r.strong_called else "skip"


POOL_OF = {"call": "weak pool", "skip": "weak pool", "solo": "strong tree alone"}


def decisions_table(records: list[StepRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        d = r.decision or {}
        o = d.get("oracle") or {}
        rows.append({"step": r.step, "policy": d.get("policy", "-"), "call strong": d.get("call"),
                     "strong ran": r.strong_called,
                     "features of": POOL_OF[step_kind(r)] if d else "-",
                     "score": d.get("score"), "threshold": d.get("threshold"),
                     "oracle says call": o.get("call"), "oracle delta (tokens/s)": o.get("delta"),
                     "accepted length (tokens)": r.accept_len, "step time (ms)": r.wall_s * 1e3,
                     "reason": d.get("reason", "no scheduler for this method")}
                    | {f"f:{k}": v for k, v in (d.get("features") or {}).items()})
    return pd.DataFrame(rows)


def decision_figure(records: list[StepRecord]) -> go.Figure:
    """Top: the scheduler's score against its threshold (or the call itself for rule policies).
    Bottom: accepted length, and the oracle's measured gain where the oracle ran."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("Scheduler decision", "Outcome"))
    steps = [r.step for r in records]
    ds = [r.decision or {} for r in records]
    kinds = [step_kind(r) for r in records]
    color = [colors.STRONG if k != "skip" else "#999" for k in kinds]
    symbol = ["star" if k == "solo" else "circle" for k in kinds]
    scored = any(d.get("score") is not None for d in ds)
    if scored:
        fig.add_trace(go.Scatter(x=steps, y=[d.get("score") for d in ds], mode="lines+markers",
                                 name="predicted value (score)", meta="points",
                                 marker=dict(color=color, symbol=symbol, size=10)),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=steps, y=[d.get("threshold") for d in ds], mode="lines", name="threshold",
                                 line=dict(dash="dash", color="black")), row=1, col=1)
        ytitle = "score (scheduler units)"
    else:
        solo = "solo" in kinds
        fig.add_trace(go.Scatter(x=steps, y=[{"skip": 0, "call": 1, "solo": 2}[k] for k in kinds], mode="markers",
                                 name="skip (0) / call strong (1)" + (" / strong tree alone (2)" if solo else ""),
                                 meta="points", marker=dict(color=color, symbol=symbol, size=12),
                                 hovertext=[d.get("reason", "") for d in ds], hoverinfo="text+x"), row=1, col=1)
        ytitle = "decision"
        fig.update_yaxes(range=[-0.5, 2.5 if solo else 1.5], tickvals=[0, 1, 2][:3 if solo else 2],
                         ticktext=["skip", "call", "strong alone"][:3 if solo else 2], row=1, col=1)
    fig.add_trace(go.Bar(x=steps, y=[r.accept_len for r in records], name="accepted length (tokens)",
                         marker_color=[colors.STRONG if r.strong_called else colors.WEAK for r in records]), row=2, col=1)
    oracle = [(r.step, d["oracle"]) for r, d in zip(records, ds) if d.get("oracle")]
    if oracle:
        fig.add_trace(go.Scatter(x=[s for s, _ in oracle], y=[o["delta"] for _, o in oracle], mode="markers",
                                 name="oracle gain of calling (tokens/s)", yaxis="y3",
                                 marker=dict(symbol=["triangle-up" if o["call"] else "triangle-down" for _, o in oracle],
                                             size=12, color=colors.ACCEPTED)), row=2, col=1)
    fig.update_yaxes(title_text=ytitle, row=1, col=1)
    fig.update_yaxes(title_text="tokens per forward (tokens)", row=2, col=1)
    fig.update_xaxes(title_text="step (one target forward each)", row=2, col=1)
    fig.update_xaxes(dtick=1 if len(records) <= 30 else None)
    fig.update_layout(height=480, meta={"kind": "decisions", "points": len(records)}, margin=dict(t=60, b=40))
    return fig


FEATURE_UNITS = {"root_top1": "probability", "root_entropy": "nats", "pool_mass_top16": "probability mass",
                 "best_value": "log-prob (nats)", "confident_depth": "fraction of depth D",
                 "recent_accept": "tokens/forward", "recent_strong_gain": "tokens/forward",
                 "position": "log(1 + tokens)", "weak_nodes": "log(1 + nodes)", "mass_depth1": "probability mass",
                 "mass_depth2": "probability mass", "mass_deep": "probability mass", "weak_expected": "tokens",
                 "recent_strong_tokens": "tokens", "steps_since_call": "log(1 + steps)", "weak_n": "nodes",
                 "c0_s": "s", "t1_s": "s", "strong_s": "s", "recent_gain": "tokens", "calls_seen": "calls",
                 "rate_so_far": "tokens/s", "tokens_left": "tokens",
                 "strong_match": "n-gram length (tokens)",
                 "target_top1": "probability", "target_sure": "probability"}


FEATURE_PANEL_PX, FEATURE_GAP_PX = 110, 60  # a feature panel's height, and the room for the next one's title


def features_figure(records: list[StepRecord]) -> go.Figure:
    """The scheduler's input features over the steps, one small panel each (their scales differ)."""
    decided = [r for r in records if r.decision]
    steps = [r.step for r in decided]
    feats = [r.decision.get("features") or {} for r in decided]
    solo = [step_kind(r) == "solo" for r in decided]
    names = sorted({k for f in feats for k in f})
    cols = 4
    rows = max(1, math.ceil(len(names) / cols))
    # Spacing is a fraction of the whole plot's height, so a fixed fraction squashes the panels as rows
    # are added (0.18 x 5 gaps left a tenth of the height to 6 rows): sized in pixels instead.
    area = rows * FEATURE_PANEL_PX + (rows - 1) * FEATURE_GAP_PX
    fig = make_subplots(rows=rows, cols=cols, shared_xaxes=True, vertical_spacing=FEATURE_GAP_PX / area,
                        horizontal_spacing=0.07,
                        subplot_titles=[f"{n} ({FEATURE_UNITS.get(n, 'value')})" for n in names] or ["no features"])
    for i, name in enumerate(names):
        # On a solo step the pool features were computed on the strong drafter's tree, not a weak pool:
        # marked apart, so a jump there is not read as the weak drafter's.
        fig.add_trace(go.Scatter(x=steps, y=[f.get(name) for f in feats], mode="lines+markers", name=name,
                                 meta="points", showlegend=False,
                                 marker=dict(symbol=["star" if s else "circle" for s in solo],
                                             color=[colors.STRONG if s else colors.WEAK for s in solo])),
                      row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(title_text="step", row=rows)
    fig.update_xaxes(dtick=1 if len(steps) <= 30 else None)
    fig.update_annotations(font_size=11)
    title = "Scheduler features per step"
    if any(solo):
        title += " (stars: a solo step, its features read on the strong drafter's tree)"
    fig.update_layout(title=title, height=area + 120,
                      meta={"kind": "features", "points": len(steps), "solo_steps": sum(solo)}, margin=dict(t=80, b=40))
    return fig


# ---------------------------------------------------------------- benchmarks

BENCH_METRICS = {"tokens_per_s": "throughput (tokens/s)", "speedup_vs_ar": "speedup vs ar (x, wall time)",
                 "tau": "tau (tokens per target forward)",
                 "mean_tree_size": "mean tree size (nodes)",
                 "strong_steps": "steps that used the strong drafter (steps)",
                 "strong_forwards": "strong drafter forwards (forwards)",
                 "matches_ar": "output identical to ar (fraction of prompts)"}


def strong_steps(results: pd.DataFrame) -> pd.Series | None:
    """Steps that used the strong drafter: the scheduler's calls for treegraft, every step for
    tree-strong (it drafts with the strong drafter and has no scheduler), the bench's count for the
    assisted methods; the bench's strong_calls column counts scheduler calls only."""
    if "strong_calls" not in results.columns:
        return None
    out = results["strong_calls"].astype(float).copy()
    if "target_forwards" in results.columns:
        every = results["method"].astype(str).str.partition(":")[0] == "tree-strong"
        out[every] = results.loc[every, "target_forwards"].astype(float)
    return out


def read_bench_dir(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """results.csv (required) and summary.csv (optional) of `python -m treegraft bench`."""
    p = Path(str(path)).expanduser()
    if not str(path).strip():
        raise ValueError("enter the path of a benchmark results directory")
    if not p.is_dir():
        raise FileNotFoundError(f"not a directory: {p}")
    if not (p / "results.csv").is_file():
        raise FileNotFoundError(f"{p} has no results.csv; run `python -m treegraft bench --out {p}` first")
    try:
        results = pd.read_csv(p / "results.csv")
        summary = pd.read_csv(p / "summary.csv") if (p / "summary.csv").is_file() else None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the CSV files in {p}: {e}") from e
    missing = {"category", "method"} - set(results.columns)
    if missing:
        raise ValueError(f"{p / 'results.csv'} lacks the columns {sorted(missing)}")
    return results, summary


def bench_config_line(path: str | Path) -> str | None:
    """What a results directory measured, from its config.json: models, machine, and the settings
    that move the numbers; None without a config. Older runs lack some keys: those are left out."""
    cfg_path = Path(str(path)).expanduser() / "config.json"
    if not cfg_path.is_file():
        return None
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(cfg, dict):
        return None
    models, gen = cfg.get("models") or {}, cfg.get("gen") or {}
    parts = [", ".join(f"{role} {models[role]}" for role in ("target", "weak", "strong") if role in models)]
    parts.append(" / ".join(str(cfg[k]) for k in ("hardware", "dtype", "kernels") if cfg.get(k))
                 + (f", {cfg['threads']} threads" if cfg.get("threads") else "")
                 + (f", torch {cfg['torch']}" if cfg.get("torch") else ""))
    size = [f"{cfg['prompts']} prompts" if cfg.get("prompts") else "",
            f"{gen['max_new_tokens']} new tokens" if gen.get("max_new_tokens") else "",
            f"{cfg['repeats']} rounds" if (cfg.get("repeats") or 1) > 1 else ""]
    parts.append(" x ".join(x for x in size[:2] if x) + (f", {size[2]}" if size[2] else ""))
    if gen:
        budget = f"budget auto (at most {gen.get('budget')})" if gen.get("auto_budget") else f"budget {gen.get('budget')}"
        parts.append(f"{budget}, depth {gen.get('depth')}, top-k {gen.get('topk')}, temperature {gen.get('temperature')}")
    return "; ".join(p for p in parts if p)


def bench_table(results: pd.DataFrame) -> pd.DataFrame:
    """Mean of each metric per category and method."""
    results = results.copy()
    steps = strong_steps(results)
    if steps is not None:
        results["strong_steps"] = steps
    cols = [c for c in BENCH_METRICS if c in results.columns]
    return results.groupby(["category", "method"], as_index=False, sort=False)[cols].mean(numeric_only=True)


def bench_figures(results: pd.DataFrame) -> list[go.Figure]:
    table = bench_table(results)
    figs = []
    for col, label in BENCH_METRICS.items():
        if col not in table.columns or table[col].isna().all():  # matches_ar of a sampled run: no check to show
            continue
        fig = go.Figure()
        for method, rows in table.groupby("method", sort=False):
            # Plain lists: plotly would ship typed arrays, which tests and the browser read badly.
            fig.add_trace(go.Bar(x=rows["category"].tolist(), y=rows[col].astype(float).tolist(), name=str(method),
                                 meta="points",
                                 marker_color=colors.method_color(str(method))))
        if col in ("speedup_vs_ar", "tau"):
            fig.add_hline(y=1.0, line_dash="dot", line_color=colors.AR)
        fig.update_layout(title=f"{label} by category and method (mean over prompts)", barmode="group",
                          height=340, xaxis_title="category", yaxis_title=label,
                          meta={"kind": f"bench:{col}"}, margin=dict(t=50, b=40))
        figs.append(fig)
    return figs

"""StepRecord: everything one target forward did, as plain JSON-serialisable data.

One type feeds the CLI's JSON, the benchmark rows, the app's tree and the tests."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field


@dataclass
class StepRecord:
    step: int
    method: str
    root_token: int
    root_pos: int
    nodes: list[dict] = field(default_factory=list)    # final pool, with provenance flags
    selected: list[int] = field(default_factory=list)  # node ids sent to the target
    accepted: list[int] = field(default_factory=list)  # node ids on the accepted path
    bonus: int = -1                                    # the target's own next token
    new_tokens: list[int] = field(default_factory=list)  # accepted tokens + bonus, after eos/limit cut
    times: dict = field(default_factory=dict)          # seconds per phase
    forwards: dict = field(default_factory=dict)       # model calls this step, per model
    strong_called: bool = False
    decision: dict | None = None                       # schedule.Decision.to_dict(): features, score, verdict
    stages: list[dict] = field(default_factory=list)   # [{name, nodes: [...]}] for stage replay
    stage_times: dict = field(default_factory=dict)    # seconds per refinement stage
    text: str = ""                                     # decoded new_tokens, when a tokenizer is known
    budget: int | None = None                          # N this step (--budget auto chooses it per step)

    @property
    def accept_len(self) -> int:
        """Tokens this target forward produced: accepted draft tokens + the bonus (tau's unit)."""
        return len(self.new_tokens)

    @property
    def wall_s(self) -> float:
        return float(sum(self.times.values()))

    def to_dict(self) -> dict:
        return asdict(self) | {"accept_len": self.accept_len, "wall_s": self.wall_s}

    @classmethod
    def from_dict(cls, d: dict) -> "StepRecord":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def dumps_trace(records: list[StepRecord], meta: dict | None = None) -> str:
    return json.dumps({"meta": meta or {}, "steps": [r.to_dict() for r in records]})


def loads_trace(text: str) -> tuple[dict, list[StepRecord]]:
    d = json.loads(text)
    return d.get("meta", {}), [StepRecord.from_dict(s) for s in d["steps"]]


def summarize(records: list[StepRecord], wall_s: float | None = None) -> dict:
    new = sum(r.accept_len for r in records)
    forwards = len(records)
    wall = wall_s if wall_s is not None else sum(r.wall_s for r in records)
    return {"new_tokens": new, "target_forwards": forwards,
            "tau": new / forwards if forwards else 0.0, "wall_s": wall,
            "tokens_per_s": new / wall if wall > 0 else 0.0,
            "strong_calls": sum(r.strong_called for r in records),
            "mean_tree_size": (sum(len(r.selected) for r in records) / forwards) if forwards else 0.0}


def first_call_excess(steps: list[tuple[int, float]]) -> float:
    """The strong drafter's prompt prefill, from one generation's oracle steps [(step, c1 - c0)]: what
    step 0's strong branch cost beyond the median of the later ones (the oracle runs both branches at
    every step, so only step 0 holds the prefill). 0 without both."""
    first = [x for s, x in steps if s == 0]
    later = [x for s, x in steps if s > 0]
    if not first or not later:
        return 0.0
    return max(0.0, first[0] - statistics.median(later))


def oracle_extra_s(records: list[StepRecord]) -> float:
    """Seconds one oracle generation spent beyond what a policy making the same calls would pay: each
    step's branch it did not keep (decision['oracle']['extra_s']), less the strong drafter's prompt
    prefill where the oracle skipped the strong branch at step 0 and kept one later. Such a policy pays
    that prefill at its first call; the oracle paid it in step 0's unkept branch."""
    steps = [(r.step, r.decision["oracle"]) for r in records if r.decision and r.decision.get("oracle")]
    extra = sum(o.get("extra_s", 0.0) for _, o in steps)
    first = next((o for s, o in steps if s == 0), None)
    if first is not None and not first["call"] and any(o["call"] for s, o in steps if s > 0):
        owed = first_call_excess([(s, o["c1"] - o["c0"]) for s, o in steps])
        extra -= min(owed, first.get("extra_s", 0.0))
    return max(0.0, extra)


KINDS = ("weak", "rescored", "graft", "recovered", "strong")


def prov(n: dict) -> str:
    """A node's provenance: its origin when the strong drafter proposed it (`graft`, `recovered`,
    `strong` for tree-strong), else `rescored` if the strong drafter rescored the weak proposal,
    else `weak`."""
    if n.get("origin") in ("graft", "recovered", "strong"):
        return n["origin"]
    return "rescored" if n.get("rescored") else "weak"


def provenance_by_depth(records: list[StepRecord]) -> dict:
    """Over a generation: {provenance: {depth: [sent to the target, accepted]}} (accepted = on the
    accepted path, before any cut by eos or max_new_tokens)."""
    out: dict = {}
    for rec in records:
        by_id = {n["id"]: n for n in rec.nodes}
        accepted = set(rec.accepted)
        for i in rec.selected:
            n = by_id.get(i)
            if n is None:
                continue
            cell = out.setdefault(prov(n), {}).setdefault(n["depth"], [0, 0])
            cell[0] += 1
            cell[1] += i in accepted
    return out


def provenance_rows(by_depth: dict) -> tuple[list[int], list[tuple[str, list[str], str]]]:
    """provenance_by_depth's counts as table cells: (depths, [(provenance, ['accepted/sent (rate)' per
    depth, '' where none was sent], the provenance's total)]), provenances in KINDS order."""
    depths = sorted({int(d) for cells in by_depth.values() for d in cells})
    rows = []
    for kind in sorted(by_depth, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
        cells = {int(d): c for d, c in by_depth[kind].items()}
        row = [f"{cells[d][1]}/{cells[d][0]} ({cells[d][1] / cells[d][0]:.0%})" if cells.get(d, [0])[0] else ""
               for d in depths]
        sent, acc = sum(c[0] for c in cells.values()), sum(c[1] for c in cells.values())
        rows.append((kind, row, f"{acc}/{sent} ({acc / max(1, sent):.0%})"))
    return depths, rows


def provenance_summary(rec: StepRecord) -> dict:
    """What the strong drafter changed in one step, and where the step's tokens came from (provenance:
    see `prov`). Returns counts over the final pool, the nodes sent to the target and the accepted
    path, the accepted tokens' provenance by depth, and the step's token arithmetic: accepted draft
    tokens kept + bonus = tokens, where eos or max_new_tokens may cut the accepted path and drop the
    bonus (then `cut` is True)."""
    by_id = {n["id"]: n for n in rec.nodes}
    selected = set(rec.selected)
    kept = min(len(rec.accepted), len(rec.new_tokens))
    bonus = len(rec.new_tokens) - kept
    accepted = [by_id[i] for i in rec.accepted[:kept] if i in by_id]

    def count(nodes) -> dict:
        out = dict.fromkeys(KINDS, 0)
        for n in nodes:
            out[prov(n)] += 1
        return out

    pool, sent, acc = count(rec.nodes), count(by_id[i] for i in selected if i in by_id), count(accepted)
    return {"pool": pool, "selected": sent, "accepted": acc,
            "accepted_by_depth": [{"depth": n["depth"], "provenance": prov(n), "token": n["token"]}
                                  for n in accepted],
            "rescored": sum(1 for n in rec.nodes if n.get("rescored")),
            "recovered": pool["recovered"], "grafted": pool["graft"],
            "graft_points": sum(1 for n in rec.nodes if n.get("graft_point")),
            "accepted_from_strong": acc["rescored"] + acc["graft"] + acc["recovered"] + acc["strong"],
            "accepted_drafted": len(rec.accepted), "accepted_kept": kept, "bonus": bonus,
            "tokens": len(rec.new_tokens), "cut": kept < len(rec.accepted) or bonus == 0}

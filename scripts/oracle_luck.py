"""How much of the live oracle's lead is the luck of its clock, per pair, from its recorded steps.

The live oracle (`treegraft:oracle`) plays every step both ways and keeps the branch whose measured
tokens per second is higher. A timing is noisy (the same forward reads 7-9% apart on this CPU), so
where the two branches are close it keeps whichever happened to read faster, and a net quoted from
those same readings is too high: on a step where both branches send the same tree it pays the faster
of two timings of one forward. Since 2026-12-02 the engine charges a second reading of the kept
branch's forward (`Engine.oracle_step`); this script says how large the effect is on the rows the
schedulers were trained on (`oracle-steps.jsonl`, collected before that change), over the steps after
the first (step 0 holds the prompt prefill):

- `by its readings`: choose and charge by the measured seconds (the old net);
- `by the model, verify`: choose with each branch's verification priced by the pair's fitted cost
  model (treegraft.scheduler_train.fit_cost_model), the strong pass as measured; charge measured;
- `by the model, both`: choose with the strong pass priced by the model too; charge measured.

A choice that does not read the noise it is charged with is unbiased, but the ratio of the first to
the others mixes the luck with the difference between two per-step rules (a per-step comparison of
rates is not the best rule for a generation's rate, so a rule on modelled seconds can come out
ahead). The clean part is the ties: on steps where both branches send the same number of nodes and
keep the same tokens, the model never calls (the call only adds the strong pass), while the readings
keep the faster of two timings of the same work. `tie luck` is what that saved, as a share of the
readings' seconds: a lower bound on the luck.

  PYTHONPATH=. .venv/bin/python scripts/oracle_luck.py assets/scheduler
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from treegraft.scheduler_train import fit_cost_model, verify_cost


def rates(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Policy -> (tokens per measured second, share of steps called), over steps after the first."""
    cm = fit_cost_model(rows)
    per = cm["strong_per_forward_s"]
    later = [r for r in rows if r["step"] > 0]

    def by_readings(r):
        return r["a1"] / r["c1"] > r["a0"] / r["c0"]

    def by_model(r, strong_too: bool):
        strong = per * r["strong_forwards"] if strong_too else r["refine_s"]
        c0 = r["weak_s"] + verify_cost(cm, r["n0"])
        c1 = r["weak_s"] + strong + verify_cost(cm, r["n1"])
        return r["a1"] / c1 > r["a0"] / c0

    rules = {"by its readings": by_readings, "by the model, verify": lambda r: by_model(r, False),
             "by the model, both": lambda r: by_model(r, True), "never": lambda r: False, "always": lambda r: True}
    ties = [r for r in later if r["a0"] == r["a1"] and r["n0"] == r["n1"]]
    out = {"ties": (len(ties), 0.0)}
    for name, rule in rules.items():
        calls = [rule(r) for r in later]
        tokens = sum(r["a1"] if c else r["a0"] for r, c in zip(later, calls))
        seconds = sum(r["c1"] if c else r["c0"] for r, c in zip(later, calls))
        out[name] = (tokens / seconds, sum(calls) / max(1, len(calls)))
        if name == "by its readings":
            saved = sum(r["c0"] - min(r["c0"], r["c1"]) for r in ties)
            out["tie luck"] = (saved / seconds, 0.0)
    return out


def table(root: Path) -> str:
    head = ("| pair | steps | ties | tie luck | never | always | by its readings | by the model, verify | by the model, both "
            "| readings / model, verify | readings / model, both |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for path in sorted(root.glob("*/*/oracle-steps.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        r = rates(rows)
        cell = {k: f"{v[0]:.2f} ({v[1]:.0%})" for k, v in r.items() if k not in ("ties", "tie luck")}
        lines.append(f"| {path.parent.parent.name}/{path.parent.name} | {sum(x['step'] > 0 for x in rows)} | "
                     f"{r['ties'][0]} | {r['tie luck'][0]:.1%} | "
                     f"{r['never'][0]:.2f} | {r['always'][0]:.2f} | {cell['by its readings']} | "
                     f"{cell['by the model, verify']} | {cell['by the model, both']} | "
                     f"{r['by its readings'][0] / r['by the model, verify'][0]:.3f} | "
                     f"{r['by its readings'][0] / r['by the model, both'][0]:.3f} |")
    return ("Tokens per measured second over each pair's oracle steps after the first (share of steps "
            "called in brackets):\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a folder of <trio>/<pair>/oracle-steps.jsonl (assets/scheduler)")
    args = ap.parse_args()
    if not any(args.root.glob("*/*/oracle-steps.jsonl")):
        raise SystemExit(f"no <trio>/<pair>/oracle-steps.jsonl under {args.root}")
    print(table(args.root))


if __name__ == "__main__":
    main()

"""Where a TreeGraft step's time goes: the mean of each phase timer over every step after the
first (the first carries the prefill), for one pair and one policy, greedy, `--budget auto`, on the
validation prompts 70.. of mt-bench, humaneval and xsum (not the held-out ones). Prints ms per step
per phase (`verify`, `draft_weak`, `draft_strong`, `schedule`, `overhead`), the strong pass's stages
(`rescore`, `recover`, `graft`) and tokens/s, and writes the new tokens of every prompt to --out so
two checkouts can be compared for identical output (`cmp`).

    PYTHONPATH=. .venv/bin/python scripts/phase_times.py --weak asset:weak --strong ngram \\
        --policy always --out /tmp/phases.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.bench.prompts import load_suite
from treegraft.engine import Engine, GenConfig
from treegraft.models import load_trio
from treegraft.options import encode_prompt

SETS = ("mt-bench", "humaneval", "xsum")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trio", default="smollm2")
    ap.add_argument("--weak", default="default")
    ap.add_argument("--strong", default="default")
    ap.add_argument("--policy", default="always")
    ap.add_argument("--prompts", type=int, default=4, help="per set, from prompt 70 on")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not 1 <= args.prompts <= 10:
        ap.error("--prompts must be 1..10 (the validation prompts 70..79 of each set)")

    trio = load_trio(trio=args.trio, weak=args.weak, strong=args.strong)
    prompts = [p for s in SETS for p in load_suite(s, 70 + args.prompts)[70:]]
    engine = Engine(trio, GenConfig(method="treegraft", policy=args.policy, auto_budget=True,
                                    budget=64, depth=args.depth, max_new_tokens=args.max_new_tokens,
                                    record_stages=False))
    phases: dict[str, list[float]] = {}
    stages: dict[str, list[float]] = {}
    tokens, wall, outputs = 0, 0.0, []
    for _ in range(args.reps):
        for p in prompts:
            ids = encode_prompt(trio.tokenizer, p.text, False)
            start = time.perf_counter()
            records = list(engine.generate(ids))
            wall += time.perf_counter() - start
            tokens += len(engine.new_tokens)
            outputs.append(list(engine.new_tokens))
            for r in records[1:]:
                for k, v in r.times.items():
                    phases.setdefault(k, []).append(v)
                for k, v in r.stage_times.items():
                    stages.setdefault(k, []).append(v)
    for name, table in (("phase", phases), ("strong stage", stages)):
        for k, v in table.items():
            print(f"{name:>12} {k:<14} {1e3 * sum(v) / len(v):8.2f} ms/step  over {len(v)} steps")
    print(f"tokens/s {tokens / wall:.2f} ({tokens} tokens in {wall:.1f} s)")
    args.out.write_text(json.dumps(outputs))


if __name__ == "__main__":
    main()

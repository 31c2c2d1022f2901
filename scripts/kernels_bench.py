"""Stock vs prepacked fp32 kernels, side by side in one run: the same prompts, methods and trio,
interleaved (prompt by prompt, kernels alternating), greedy. Prints tokens/s of each and the speedup
of packed over stock per method, and checks every output equals the stock ar output.

    .venv/bin/python scripts/kernels_bench.py --trio smollm2 --limit 1 --max-new-tokens 32 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.bench.prompts import SUITES, load_suite
from treegraft.engine import Engine, GenConfig
from treegraft.models import load_trio
from treegraft.options import encode_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trio", default="smollm2")
    ap.add_argument("--methods", default="ar,tree-weak,treegraft")
    ap.add_argument("--limit", type=int, default=1, help="prompts per set (all six sets)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    trios = {k: load_trio(trio=a.trio, dtype="float32", kernels=k) for k in ("stock", "packed")}
    prompts = [p for s in SUITES for p in load_suite(s, a.limit)]
    methods = a.methods.split(",")
    tokens = {(k, m): 0 for k in trios for m in methods}
    seconds = {(k, m): 0.0 for k in trios for m in methods}
    same = True
    for p in prompts:
        ids = encode_prompt(trios["stock"].tokenizer, p.text, raw=False)
        ref = None
        for m in methods:
            for k, trio in trios.items():
                engine = Engine(trio, GenConfig(method=m, policy="always", max_new_tokens=a.max_new_tokens,
                                                record_stages=False))
                t = time.perf_counter()
                list(engine.generate(ids))
                seconds[k, m] += time.perf_counter() - t
                tokens[k, m] += len(engine.new_tokens)
                ref = ref or engine.new_tokens
                same &= engine.new_tokens == ref
    print(f"{a.trio}, fp32, {len(prompts)} prompts x {a.max_new_tokens} new tokens, {torch.get_num_threads()} threads")
    print(f"{'method':<12}{'stock tok/s':>12}{'packed tok/s':>14}{'packed / stock':>16}")
    for m in methods:
        s, p = (tokens[k, m] / seconds[k, m] for k in ("stock", "packed"))
        print(f"{m:<12}{s:>12.2f}{p:>14.2f}{p / s:>15.2f}x")
    print("every output equals stock ar's:", same)


if __name__ == "__main__":
    main()

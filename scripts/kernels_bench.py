"""Stock vs prepacked kernels, side by side in one run: the same prompts, methods and trio,
interleaved (prompt by prompt and method by method, the kernel that runs first alternating), greedy.
Prints tokens/s of each and the speedup of packed over stock per method, and how many outputs equal
the stock ar output (all of them in fp32; in bf16 a tree's kernels may flip a near-tie).

    .venv/bin/python scripts/kernels_bench.py --trio smollm2 --limit 1 --max-new-tokens 32 --threads 1
    .venv/bin/python scripts/kernels_bench.py --trio qwen-coder --weak ngram --strong qwen-coder-0.5b \
        --dtype bfloat16 --auto-budget --depth 10 --methods ar,tree-strong,treegraft --threads 2
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
    ap.add_argument("--weak", default=None, help="as `generate --weak` (default: the trio's)")
    ap.add_argument("--strong", default=None, help="as `generate --strong` (default: the trio's)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--auto-budget", action="store_true", help="--budget auto (each kernel's own cost curve)")
    ap.add_argument("--depth", type=int, default=6)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    trios = {k: load_trio(trio=a.trio, weak=a.weak, strong=a.strong, dtype=a.dtype, kernels=k)
             for k in ("stock", "packed")}
    prompts = [p for s in SUITES for p in load_suite(s, a.limit)]
    methods = a.methods.split(",")
    tokens = {(k, m): 0 for k in trios for m in methods}
    seconds = {(k, m): 0.0 for k in trios for m in methods}
    forwards = {(k, m): 0 for k in trios for m in methods}
    same, runs = 0, 0
    for i, p in enumerate(prompts):
        ids = encode_prompt(trios["stock"].tokenizer, p.text, raw=False)
        outputs = {}
        for m in methods:
            for k in (("stock", "packed") if i % 2 == 0 else ("packed", "stock")):
                engine = Engine(trios[k], GenConfig(method=m, policy="always", max_new_tokens=a.max_new_tokens,
                                                    budget=a.budget, auto_budget=a.auto_budget, depth=a.depth,
                                                    record_stages=False))
                t = time.perf_counter()
                list(engine.generate(ids))
                seconds[k, m] += time.perf_counter() - t
                tokens[k, m] += len(engine.new_tokens)
                forwards[k, m] += len(engine.records) or len(engine.new_tokens)
                outputs[k, m] = engine.new_tokens
        ref = outputs.get(("stock", "ar"))
        if ref is not None:
            others = [out for key, out in outputs.items() if key != ("stock", "ar")]
            runs += len(others)
            same += sum(out == ref for out in others)
    dtype = "fp32" if a.dtype == "float32" else "bf16"
    print(f"{a.trio}, {dtype}, {len(prompts)} prompts x {a.max_new_tokens} new tokens, {torch.get_num_threads()} threads")
    print(f"{'method':<12}{'stock tok/s':>12}{'packed tok/s':>14}{'packed / stock':>16}{'tau stock':>11}{'tau packed':>12}")
    for m in methods:
        s, p = (tokens[k, m] / seconds[k, m] for k in ("stock", "packed"))
        ts, tp = (tokens[k, m] / max(1, forwards[k, m]) for k in ("stock", "packed"))
        print(f"{m:<12}{s:>12.2f}{p:>14.2f}{p / s:>15.2f}x{ts:>11.2f}{tp:>12.2f}")
    print(f"outputs equal to stock ar's: {same} of {runs}" if runs else "no ar in --methods: outputs not compared")


if __name__ == "__main__":
    main()

"""Row padding on and off, side by side on one loaded model: ms of one forward over q tree tokens
(a ~200-token cache, as `profile` measures), the same packed weights with each Linear's measured row
pads (`--kernels auto`, treegraft.fastpath.row_pads) and without (rows as they come), the two
interleaved in every round, alternating which goes first. Prints the pads in use and the medians.
With --methods, then whole generations the same way (greedy, `--budget auto --depth 10`, policy
always, the first --limit prompts of each of the six sets, pads on and off alternating which runs
first, prompt by prompt; both size trees on the one cached profile, measured with the pads, which
each generation rescales by its own verifications): tokens/s of each, and whether every output
equals `ar`'s without pads.

    PYTHONPATH=. .venv/bin/python scripts/row_pad_ab.py --trio qwen-coder --strong qwen-coder-0.5b --rounds 7 \
        --methods ar,tree-strong,treegraft
    PYTHONPATH=. .venv/bin/python scripts/row_pad_ab.py --trio smollm2 --weak asset:weak --strong asset:strong --rounds 15 \
        --methods ar,tree-weak,tree-strong,treegraft
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.bench.prompts import SUITES, load_suite
from treegraft.costs import _context
from treegraft.engine import Engine, GenConfig
from treegraft.fastpath import pad_table
from treegraft.kv import make_runner
from treegraft.models import load_trio, sync
from treegraft.options import encode_prompt
from treegraft.tree import ROOT, DraftTree


def set_pads(linears, pads: dict, on: bool) -> None:
    for m in linears:
        m.treegraft_pad = pads[id(m)] if on else {}


def generations(trio, linears, pads, args) -> None:
    """Whole generations, pads on and off, interleaved prompt by prompt."""
    prompts = [p for s in SUITES for p in load_suite(s, args.limit)]
    methods = args.methods.split(",")
    tokens = {(on, m): 0 for on in (False, True) for m in methods}
    seconds = {(on, m): 0.0 for on in (False, True) for m in methods}
    same = runs = 0
    for i, p in enumerate(prompts):
        ids = encode_prompt(trio.tokenizer, p.text, raw=False)
        outputs = {}
        for m in methods:
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                set_pads(linears, pads, on)
                engine = Engine(trio, GenConfig(method=m, policy="always", max_new_tokens=args.max_new_tokens,
                                                budget=64, auto_budget=True, depth=10, record_stages=False))
                t = time.perf_counter()
                list(engine.generate(ids))
                seconds[on, m] += time.perf_counter() - t
                tokens[on, m] += len(engine.new_tokens)
                outputs[on, m] = engine.new_tokens
        ref = outputs.get((False, "ar"))
        if ref is not None:
            others = [out for key, out in outputs.items() if key != (False, "ar")]
            runs += len(others)
            same += sum(out == ref for out in others)
    print(f"{len(prompts)} prompts x {args.max_new_tokens} new tokens, fp32, {torch.get_num_threads()} threads")
    print(f"{'method':<12}{'as they come tok/s':>20}{'padded tok/s':>14}{'padded / as they come':>23}")
    for m in methods:
        a, b = (tokens[on, m] / seconds[on, m] for on in (False, True))
        print(f"{m:<12}{a:>20.2f}{b:>14.2f}{b / a:>22.2f}x")
    print(f"outputs equal to ar's without pads: {same} of {runs}" if runs else "no ar in --methods: outputs not compared")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trio", default="smollm2")
    ap.add_argument("--weak", default="ngram", help="the weak drafter of the generations (--methods)")
    ap.add_argument("--strong", default="default", help="the drafter timed beside the target")
    ap.add_argument("--methods", default="", help="comma-separated engine methods to generate with, pads on and off")
    ap.add_argument("--limit", type=int, default=1, help="prompts per set for --methods")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--qs", default="1,2,3,4,5,6,7,8,12")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    trio = load_trio(trio=args.trio, weak=args.weak, strong=args.strong, dtype="float32", kernels="auto")
    if trio.kernels != "packed":
        sys.exit(f"--kernels auto chose {trio.kernels} on this machine: no packed Linears, nothing to pad")
    models = {"target": trio.target, "strong": trio.strong}
    linears = [m for model in (trio.target, trio.weak, trio.strong) for m in model.modules()
               if getattr(m, "treegraft_packed", False)]
    pads = {id(m): dict(m.treegraft_pad) for m in linears}
    print("row pads (out x in: rows -> rows):", pad_table(list(models.values())))

    seq = _context(trio, 200)
    target = make_runner(trio.target, "target")
    runners = {"target": target, "strong": make_runner(trio.strong, "strong", features_from=target)}
    target.catch_up(seq[:-1])
    runners["strong"].catch_up(seq)
    target.catch_up(seq)
    qs = [int(q) for q in args.qs.split(",")]
    times = {(role, on, q): [] for role in runners for on in (False, True) for q in qs}
    with torch.inference_mode():
        for rnd in range(args.rounds + 1):          # round 0 warms up, not counted
            for q in qs:
                tree = DraftTree()
                nodes = [tree.add(ROOT, (7 * j + 11) % int(trio.target.config.vocab_size), 0.0, "weak")[0]
                         for j in range(q)]
                for on in ((False, True) if rnd % 2 else (True, False)):
                    set_pads(linears, pads, on)
                    for role, r in runners.items():
                        n = r.n
                        sync(trio.device)
                        t = time.perf_counter()
                        r.forward_nodes(tree, nodes, len(seq) - 1)
                        sync(trio.device)
                        if rnd:
                            times[(role, on, q)].append((time.perf_counter() - t) * 1e3)
                        r.restore(n)
    for role in runners:
        print(f"{role}: {trio.names[role]}")
        print("   q  as they come ms  padded ms  padded / as they come")
        for q in qs:
            a, b = statistics.median(times[(role, False, q)]), statistics.median(times[(role, True, q)])
            print(f"  {q:2d}  {a:15.1f}  {b:9.1f}  {b / a:.2f}")
    set_pads(linears, pads, True)
    if args.methods:
        generations(trio, linears, pads, args)


if __name__ == "__main__":
    main()

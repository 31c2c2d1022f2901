"""One Linear, stock vs prepacked, per number of rows q: where `--kernels auto`'s single verdict (the
sum over q = 1 and 8 of one shape) hides a crossing. Prints microseconds per call (median of
interleaved repeats) of F.linear on the dense weight ("stock"), oneDNN's general packed layout
("packed") and, at q = 1, its one-row layout ("one-row", what `dual` keeps), for the shapes of the
shipped targets, at the current thread count. No model is loaded; weights are random.

    .venv/bin/python scripts/linear_bench.py --threads 2
    .venv/bin/python scripts/linear_bench.py --threads 2 --dtype bfloat16 --qs 1,2,4,8,16,32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.fastpath import packable, packing_available

SHAPES = {  # (out, in): what each is
    "smollm2 q/o": (576, 576), "smollm2 mlp": (1536, 576), "smollm2 head": (49152, 576),
    "qwen-1.5b attn": (1536, 1536), "qwen-1.5b mlp": (8960, 1536), "qwen-1.5b head": (151936, 1536),
}


def time_call(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


@torch.inference_mode()
def bench_shape(out_f: int, in_f: int, qs: list[int], dtype: torch.dtype, repeats: int) -> dict[int, dict[str, float]]:
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(out_f, in_f, generator=gen) * 0.02).to(dtype)
    general = torch.ops.mkldnn._reorder_linear_weight(w, None)
    one_row = torch.ops.mkldnn._reorder_linear_weight(w, 1)
    out = {}
    for q in qs:
        x = torch.randn(1, q, in_f, generator=gen).to(dtype)
        kernels = {"stock": lambda: F.linear(x, w),
                   "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, general, None, "none", [], "")}
        if q == 1:
            kernels["one-row"] = lambda: torch.ops.mkldnn._linear_pointwise(x, one_row, None, "none", [], "")
        calls = max(3, int(2e8 / (out_f * in_f * q)))  # ~0.1-0.5 s per kernel and q
        times = {k: [] for k in kernels}
        for _ in range(repeats):
            for k, fn in kernels.items():
                times[k].append(time_call(fn, calls))
        out[q] = {k: statistics.median(v) for k, v in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--qs", default="1,2,4,8,16", help="rows per call, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    try:
        qs = [int(q) for q in args.qs.split(",")]
    except ValueError:
        ap.error(f"--qs takes comma-separated integers, got {args.qs!r}")
    if not qs or min(qs) < 1 or max(qs) > 512:
        ap.error("--qs must list row counts in 1..512")
    if not 1 <= args.threads <= 256 or not 1 <= args.repeats <= 100:
        ap.error("--threads must be 1..256 and --repeats 1..100")
    if not packing_available() or not packable(torch.device("cpu"), dtype):
        sys.exit(f"prepacked {args.dtype} Linears do not run natively on this CPU/PyTorch: nothing to compare")
    torch.set_num_threads(args.threads)
    print(f"us per call, {args.dtype}, {args.threads} threads; 'packed/stock' < 1: packed is faster")
    print(f"{'shape':<16} {'out x in':>12} {'q':>4} {'stock':>10} {'packed':>10} {'one-row':>10} {'packed/stock':>13}")
    for name, (o, i) in SHAPES.items():
        for q, t in bench_shape(o, i, qs, dtype, args.repeats).items():
            row = f"{t['one-row'] * 1e6:10.0f}" if "one-row" in t else f"{'':>10}"
            print(f"{name:<16} {f'{o}x{i}':>12} {q:>4} {t['stock'] * 1e6:10.0f} {t['packed'] * 1e6:10.0f} {row} "
                  f"{t['packed'] / t['stock']:13.2f}", flush=True)


if __name__ == "__main__":
    main()

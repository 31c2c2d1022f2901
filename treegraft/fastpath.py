"""The CPU fast path: fp32 Linear layers run on oneDNN-prepacked weights.

Why: with stock ``nn.Linear`` in fp32 on CPU, a forward over 2-8 new tokens costs about 2x a one-token
forward (a kernel-path switch in the BLAS, not arithmetic), so every tree verification and every
batched drafter level pays twice. Weights reordered once into oneDNN's blocked layout give a flat
cost curve for small q and a faster q=1 (FACTS.md). Logits move by ~1e-4 (argmax unchanged on the
lossless tests, which run under both kernels).

oneDNN picks the blocked layout from a batch-size hint, and no single layout is best at every q:
measured on an AVX2 EPYC (8960x1536, 2 threads), the one-row layout costs 3.9 / 6.8 / 7.9 / 9.2 ms
at q = 1 / 2 / 8 / 16 while the general one costs 4.6 / 4.8 / 6.2 / 7.8 ms. So every Linear gets the
general layout, and a model that mostly runs one row at a time (the target: plain decoding, its
catch-up) may also keep a one-row copy (``dual``) when memory allows; rows pick the layout per call.

The same holds in bf16 on a CPU with native bf16 (AVX512-BF16 / AMX), where stock bf16 Linears pay a
weight reorder on every call: measured on the qwen-coder trio (2 threads, AVX512-BF16, `profile`), the
1.5B's one-token forward costs 215 ms fp32 packed, 145 ms bf16 stock and 92 ms bf16 packed.

Nor is a layout monotone in rows: on an AVX-512 EPYC (fp32, 2 threads) every Linear of SmolLM2 and
the Qwen pair costs least at 4-6 rows and most at 2, as a forward sees it (weights streamed from
memory), and the one-row layout is no faster there. So under ``auto`` each packed Linear may also pad
a call of few rows with zero rows to a row count that runs faster, measured once per machine and
shape (``row_pads``): the 1.5B's 2-token forward went 269 -> 174 ms, its 1-token one 186 -> 170.

Kernels: ``stock`` (nn.Linear), ``packed`` (prepacked oneDNN), ``auto`` (packed on CPU in fp32, or in
bf16 where the CPU has native bf16, when a quick measurement on this machine says it is faster; the
verdict is cached per machine and dtype in TREEGRAFT_HOME/kernels.json, with the measured row pads).
On CUDA, for fp16, and for
bf16 without native support, ``auto`` means stock.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

KERNELS = ("auto", "stock", "packed")


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    """Read once per process: every Engine, bench config and profile key asks for the machine's class."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split())


def cpu_has_bf16() -> bool:
    """Native bf16 matmuls on x86 need AVX512-BF16 or AMX; without them bf16 is emulated and slower."""
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def hardware_class(device: torch.device | str = "cpu") -> str:
    """The kind of machine a measurement was made on, coarse enough to recur: "cuda", or the CPU's widest
    vector unit ("cpu-avx512", "cpu-avx2", "cpu"). What verifying a tree costs moves with it (the 1.5B's
    8-token forward: 1.65x its one-token forward on an AVX2 EPYC, 1.04-1.10x on an AVX-512 one), and
    with it the fastest way to use two drafters, so a scheduler may keep an arm per class."""
    if torch.device(device).type != "cpu":
        return torch.device(device).type
    flags = _cpu_flags()
    return "cpu-avx512" if "avx512f" in flags else "cpu-avx2" if "avx2" in flags else "cpu"


def packable(device: torch.device, dtype: torch.dtype) -> bool:
    """Where prepacked Linears exist and are native: the CPU in fp32, or in bf16 with native bf16."""
    return device.type == "cpu" and (dtype == torch.float32 or (dtype == torch.bfloat16 and cpu_has_bf16()))


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packed_forward(module: nn.Linear, packed: torch.Tensor, row: torch.Tensor | None, bias: torch.Tensor | None):
    dtype = module.weight.dtype
    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != dtype or x.device.type != "cpu" or torch.is_grad_enabled():
            raise RuntimeError(f"a packed Linear runs {str(dtype).replace('torch.', '')} CPU inference only; "
                               "load with --kernels stock to train or to change dtype")
        rows = x.numel() // x.shape[-1]
        to = module.treegraft_pad.get(rows)
        if to is None:
            w = row if rows == 1 and row is not None else packed
            return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
        # Zero rows appended: each output row reads only its own input row, so the real rows' outputs
        # are what they would be at `to` rows, and the padding is sliced off.
        padded = x.new_zeros(to, x.shape[-1])
        padded[:rows] = x.reshape(rows, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(padded, packed, bias, "none", [], "")[:rows]
        return out.reshape(*x.shape[:-1], out.shape[-1])
    return forward


def pack_linear(module: nn.Linear, keep_dense: bool = False, packed: tuple | None = None,
                dual: bool = False) -> tuple:
    """Swap this Linear's forward for a prepacked one, in place: modules that hold a reference to it
    (a drafter sharing the target's head) get the fast path too. The dense weight is dropped unless
    it is shared with another module (a tied embedding), so memory does not double (``dual`` adds a
    one-row copy: memory x2 for this Linear). Returns (general, one-row or None) packed weights."""
    if getattr(module, "treegraft_packed", False):
        return module.packed_weight
    w = module.weight.detach()
    if packed is None:
        packed = (torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None),
                  torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 1) if dual else None)
    bias = None if module.bias is None else module.bias.detach()
    module.treegraft_pad = {}  # rows -> the row count to run them at (set_row_pads); empty: as they come
    module.forward = _packed_forward(module, *packed, bias)
    module.treegraft_packed = True
    module.packed_weight = packed
    if not keep_dense:
        # A zero-size stand-in keeps .weight.dtype/.device readable for code that asks.
        module.weight = nn.Parameter(torch.empty(0, dtype=w.dtype, device=w.device), requires_grad=False)
    return packed


def pack_models(models: list[nn.Module], dual: list[nn.Module] = ()) -> int:
    """Pack every Linear of these models once (shared modules are packed once); the Linears of the
    models in `dual` also keep a one-row copy. Returns the count."""
    dual_ids = {id(mod) for m in dual for mod in m.modules()}
    embedding_ptrs = {p.data_ptr() for m in models for mod in m.modules()
                      if not isinstance(mod, nn.Linear) for p in mod.parameters(recurse=False)}
    linears = {id(mod): mod for m in models for mod in m.modules() if isinstance(mod, nn.Linear)}
    users: dict[int, int] = {}
    for mod in linears.values():
        users[mod.weight.data_ptr()] = users.get(mod.weight.data_ptr(), 0) + 1
    by_weight: dict[int, torch.Tensor] = {}  # Linears sharing one weight share one packed copy
    for mod in linears.values():
        if getattr(mod, "treegraft_packed", False) or not mod.weight.numel():
            continue
        ptr = mod.weight.data_ptr()
        users[ptr] -= 1
        keep = ptr in embedding_ptrs or users[ptr] > 0
        by_weight[ptr] = pack_linear(mod, keep_dense=keep, packed=by_weight.get(ptr), dual=id(mod) in dual_ids)
    return len(by_weight)


def linear_bytes(model: nn.Module) -> int:
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))


def room_for_dual(models: list[nn.Module], margin_bytes: int = 4 << 30) -> list[nn.Module]:
    """The models, in order, whose Linears also get a one-row copy while `margin_bytes` stay free."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return []
    free = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines()
                 if line.startswith("MemAvailable:")), 0) - margin_bytes
    out = []
    for m in models:
        need = linear_bytes(m)
        if need <= free:
            free -= need
            out.append(m)
    return out


# ---------------------------------------------------------------- choosing kernels

def _cache_file() -> Path:
    home = Path(os.environ.get("TREEGRAFT_HOME", Path.home() / ".cache" / "treegraft"))
    return home / "kernels.json"


def _machine_key(shape: tuple[int, int], dtype: torch.dtype = torch.float32) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # fp32 keys predate bf16 packing; they stay as they were so cached verdicts still apply
    tag = "" if dtype == torch.float32 else f"|{str(dtype).replace('torch.', '')}"
    return f"{cpu}|torch {torch.__version__}|threads {torch.get_num_threads()}|{shape[0]}x{shape[1]}{tag}"


@torch.inference_mode()
def measure_linear(out_f: int, in_f: int, qs=(1, 8), repeats: int = 5,
                   dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Median seconds of stock vs packed for one Linear shape, summed over q, interleaved repeats."""
    gen = torch.Generator().manual_seed(0)
    lin = nn.Linear(in_f, out_f, bias=False, dtype=dtype)
    lin.weight.data = (torch.randn(out_f, in_f, generator=gen) * 0.02).to(dtype)
    packed = nn.Linear(in_f, out_f, bias=False, dtype=dtype)
    packed.weight.data = lin.weight.data.clone()
    pack_linear(packed)
    xs = [torch.randn(1, q, in_f, generator=gen).to(dtype) for q in qs]
    times = {"stock": [], "packed": []}
    for _ in range(repeats):
        for name, f in (("stock", lin), ("packed", packed)):
            t = time.perf_counter()
            for x in xs:
                f(x)
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def choose_kernels(kernels: str, device: torch.device, dtype: torch.dtype, shape: tuple[int, int]) -> str:
    """Resolve ``auto`` for this device/dtype, measuring once per machine and Linear shape."""
    if kernels not in KERNELS:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")
    native = packable(device, dtype)
    if kernels == "packed" and not native:
        raise ValueError("--kernels packed runs on CPU in float32, or in bfloat16 where the CPU has native "
                         f"bf16 (AVX512-BF16 / AMX); use stock (or auto) for {device.type} "
                         f"{str(dtype).replace('torch.', '')} here")
    if kernels == "packed" and not packing_available():
        raise ValueError("--kernels packed needs PyTorch built with oneDNN (mkldnn); this build has none")
    if kernels != "auto":
        return kernels
    if not native or not packing_available():
        return "stock"
    path, key = _cache_file(), _machine_key(shape, dtype)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key not in cached:
        t = measure_linear(*shape, dtype=dtype)
        cached[key] = {"choice": "packed" if t["packed"] < t["stock"] else "stock",
                       "stock_s": t["stock"], "packed_s": t["packed"]}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached, indent=2))
        tmp.replace(path)
    return cached[key]["choice"]


PAD_ROWS = 8     # row counts measured for padding: the sizes of CPU trees and drafter levels
PAD_GAIN = 0.9   # pad only where the padded call is at least 10% faster: a smaller edge is timing noise
COLD_BYTES = 96 << 20  # weights cycled through per measurement: past a CPU's last-level cache, as in a forward


@torch.inference_mode()
def measure_rows(out_f: int, in_f: int, rows: int = PAD_ROWS, repeats: int = 5,
                 dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Median seconds of one packed call per row count 1..rows (general layout; "1 row": the one-row
    layout), and of padding m rows to p ("pad m>p": the zeros, the copy and the slice, not the call),
    interleaved repeats. Calls are timed cold: a forward streams every layer's weights from memory,
    so they cycle through copies of the weight that together outgrow the caches (timed hot, from
    cache, small shapes hide the gain a real forward sees)."""
    copies = max(1, min(256, COLD_BYTES // (out_f * in_f * torch.finfo(dtype).bits // 8)))
    w = torch.full((out_f, in_f), 0.01, dtype=dtype)
    weights = [(torch.ops.mkldnn._reorder_linear_weight(w, None), torch.ops.mkldnn._reorder_linear_weight(w, 1))
               for _ in range(copies)]
    xs = {str(m): torch.full((1, m, in_f), 0.5, dtype=dtype) for m in range(1, rows + 1)}
    xs["1 row"] = xs["1"]
    out = torch.zeros(rows, out_f, dtype=dtype)
    pads = [(m, p) for m in range(1, rows) for p in range(m + 1, rows + 1)]
    times = {m: [] for m in list(xs) + [f"pad {m}>{p}" for m, p in pads]}
    for _ in range(repeats):
        for m, x in xs.items():
            layout = 1 if m == "1 row" else 0
            t = time.perf_counter()
            for pair in weights:
                torch.ops.mkldnn._linear_pointwise(x, pair[layout], None, "none", [], "")
            times[m].append((time.perf_counter() - t) / copies)
        for m, p in pads:  # what _packed_forward adds around the call
            x = xs[str(m)]
            t = time.perf_counter()
            for _ in range(20):
                padded = x.new_zeros(p, in_f)
                padded[:m] = x.reshape(m, in_f)
                out[:m].reshape(*x.shape[:-1], out_f)
            times[f"pad {m}>{p}"].append((time.perf_counter() - t) / 20)
    return {m: statistics.median(v) for m, v in times.items()}


def pads_from(seconds: dict[str, float], gain: float = PAD_GAIN) -> dict[int, int]:
    """rows -> the row count p > rows whose call plus the padding is fastest, where that beats running
    them as they come (one row: in either layout) by `gain`. oneDNN's blocked kernels are not monotone
    in rows: on an AVX-512 EPYC (fp32, 2 threads, cold) every Linear of SmolLM2 and the Qwen pair costs
    least at 4-6 rows and 1.2-1.4x that at 2 (the 1.5B's 8960-wide MLP: 2.19 ms at 2 rows, 1.59 at 6)."""
    general = {int(m): t for m, t in seconds.items() if m.isdigit()}
    out = {}
    for m in sorted(general):
        as_they_come = min(general[m], seconds.get("1 row", general[m])) if m == 1 else general[m]
        costs = {p: general[p] + seconds[f"pad {m}>{p}"] for p in general if p > m and f"pad {m}>{p}" in seconds}
        if costs:
            best = min(costs, key=lambda p: (costs[p], p))
            if costs[best] < gain * as_they_come:
                out[m] = best
    return out


def row_pads(shape: tuple[int, int], dtype: torch.dtype = torch.float32) -> dict[int, int]:
    """pads_from this machine's measurement of one Linear shape, measured once and cached
    (TREEGRAFT_HOME/kernels.json, beside the kernel verdicts)."""
    path, key = _cache_file(), _machine_key(shape, dtype) + "|row pads"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key not in cached:
        t = measure_rows(*shape, dtype=dtype)
        cached[key] = {"pads": {str(m): p for m, p in pads_from(t).items()},
                       "seconds": {str(m): s for m, s in t.items()}}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached, indent=2))
        tmp.replace(path)
    return {int(m): int(p) for m, p in cached[key]["pads"].items()}


def set_row_pads(models: list[nn.Module], dtype: torch.dtype) -> dict[tuple[int, int], dict[int, int]]:
    """Give every packed Linear of these models its shape's measured row pads. Returns them by shape."""
    linears = [m for model in models for m in model.modules() if getattr(m, "treegraft_packed", False)]
    by_shape = {}
    for mod in linears:
        shape = (mod.out_features, mod.in_features)
        if shape not in by_shape:
            by_shape[shape] = row_pads(shape, dtype)
        mod.treegraft_pad = by_shape[shape]
    return by_shape


def pad_table(models: list[nn.Module]) -> list:
    """The row pads these models' packed Linears run with, as sorted plain data: part of what a cost
    profile was measured under (treegraft.costs keys its cache by it)."""
    table = {(m.out_features, m.in_features): sorted(m.treegraft_pad.items())
             for model in models for m in model.modules() if getattr(m, "treegraft_pad", None)}
    return sorted([list(shape), pads] for shape, pads in table.items())


def largest_linear(model: nn.Module) -> tuple[int, int]:
    """(out, in) of the model's biggest Linear below the head: what dominates a forward's cost."""
    shapes = [(m.out_features, m.in_features) for n, m in model.named_modules()
              if isinstance(m, nn.Linear) and "lm_head" not in n]
    return max(shapes, key=lambda s: s[0] * s[1]) if shapes else (1024, 1024)

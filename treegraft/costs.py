"""What one forward over q new tree tokens costs on this machine, per model of a trio.

For the target and each drafter: one forward over q = 1 ... 128 new tokens (a tree of q siblings
under the root, float tree mask, explicit positions) on a ~200-token cache, medians of interleaved
repeats (every q once per round, so a busy neighbour slows all q alike). Every q up to 8 is measured,
not interpolated: CPU kernels work in blocks of rows (oneDNN's fp32 kernels take 6 at a time on
AVX-512), so a forward can cost the same from 1 to 6 tokens and jump at 7, a step that a grid of
powers of two draws as a slope from 4 to 8. Cached per
machine, models (their names and tensor shapes), device, dtype and kernels in TREEGRAFT_HOME/profiles/: `profile` prints it, the
hardware-aware budget (treegraft.budget) reads the target's curve.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from .chunks import cache_home
from .fastpath import hardware_class, pad_table
from .kv import make_runner
from .models import Trio, sync
from .tree import ROOT, DraftTree

QS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128)
ROLES = ("target", "weak", "strong")
# The curve is cached for good, so one busy moment must not size every later tree: a median of 2
# rounds is their mean, and once priced SmolLM2's q = 1-6 at 51-60 ms against 41-44, so trees of 8-12
# looked nearly free and ran 12-14% slower (README, "A noisy profile"); a median of 5 outvotes 2.
CURVE_REPEATS = 5


def _shapes(model) -> str:
    """What a forward's cost follows: every tensor's name, shape and dtype, not the values in it."""
    tensors = [*model.named_parameters(), *model.named_buffers()] if isinstance(model, torch.nn.Module) else []
    spec = [(name, list(t.shape), str(t.dtype)) for name, t in tensors]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:16]


def _path(trio: Trio, context: int, roles) -> Path:
    # Names alone would hand a drafter retrained at the same path, at another size, its old costs.
    # platform.processor() is empty on most Linux machines: the class keeps AVX2 and AVX-512 curves apart
    what = json.dumps([trio.names, [_shapes(m) for m in (trio.target, trio.weak, trio.strong)],
                       str(trio.device), str(trio.dtype), trio.kernels, platform.processor(),
                       platform.machine(), torch.__version__, torch.get_num_threads(), context, list(roles),
                       hardware_class(trio.device)]
                      + ([pad_table([trio.target, trio.weak, trio.strong])] if trio.kernels == "packed" else []),
                      sort_keys=True)
    return cache_home() / "profiles" / f"{hashlib.sha256(what.encode()).hexdigest()[:16]}.json"


def _context(trio: Trio, length: int) -> list[int]:
    """A real-looking context: a fixed text repeated, so prompt lookup behaves as on real input."""
    text = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
            "The quick brown fox jumps over the lazy dog. ") * 40
    ids = trio.tokenizer(text, add_special_tokens=False)["input_ids"] if trio.tokenizer else list(range(3, 60))
    return (ids * (length // max(1, len(ids)) + 1))[:length]


@torch.inference_mode()
def measure(trio: Trio, qs=QS, context: int = 200, repeats: int = 3, roles=ROLES) -> dict:
    """Median ms of one forward over q tree tokens, per role, interleaved."""
    seq = _context(trio, min(context, trio.context_len - max(qs) - 1))
    target = make_runner(trio.target, "target")
    runners = {"target": target,
               "weak": make_runner(trio.weak, "weak", features_from=target),
               "strong": make_runner(trio.strong, "strong", features_from=target)}
    target.catch_up(seq[:-1])           # feature drafters read the target's features of the prefix
    for name in ("weak", "strong"):
        runners[name].catch_up(seq)
    target.catch_up(seq)
    runners = {name: r for name, r in runners.items() if name in roles}
    vocab = int(trio.target.config.vocab_size)
    times = {name: {q: [] for q in qs} for name in runners}
    for _ in range(repeats + 1):        # the first round warms caches and allocators; not counted
        for q in qs:
            tree = DraftTree()
            nodes = [tree.add(ROOT, (7 * j + 11) % vocab, 0.0, "weak")[0] for j in range(q)]
            for name, r in runners.items():
                n = r.n
                sync(trio.device)
                t = time.perf_counter()
                r.forward_nodes(tree, nodes, len(seq) - 1)
                sync(trio.device)
                times[name][q].append(time.perf_counter() - t)
                r.restore(n)
    return {name: {str(q): statistics.median(v[1:]) * 1e3 for q, v in per.items()} for name, per in times.items()}


def profile(trio: Trio, qs=QS, context: int = 200, repeats: int = 3, refresh: bool = False, roles=ROLES) -> dict:
    """The cached profile of this trio on this machine, measured now if there is none (or refresh)."""
    path = _path(trio, context, roles)
    if path.exists() and not refresh:
        cached = json.loads(path.read_text())
        # the key holds no round count: a profile of fewer rounds than asked is measured again
        if all(str(q) in cached["target"] for q in qs) and cached.get("repeats", 0) >= repeats:
            return cached | {"cached": True}
    out = measure(trio, qs, context, repeats, roles)
    out |= {"device": str(trio.device), "dtype": str(trio.dtype).replace("torch.", ""), "kernels": trio.kernels,
            "trio": trio.trio, "models": trio.names, "context": context, "repeats": repeats,
            "threads": torch.get_num_threads()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(path)
    return out | {"cached": False}


def target_curve(trio: Trio) -> dict[int, float]:
    """The target's ms per forward over q tokens: from a full profile if one was measured, else a
    quick target-only measurement (cached too)."""
    full = _path(trio, 200, ROLES)
    p = json.loads(full.read_text()) if full.exists() else None
    # none, or on an older, coarser grid, or from fewer rounds than a curve cached for good needs
    if p is None or not all(str(q) in p["target"] for q in QS[:-1]) or p.get("repeats", 0) < CURVE_REPEATS:
        p = profile(trio, QS[:-1], 200, CURVE_REPEATS, roles=("target",))
    return {int(q): ms for q, ms in p["target"].items()}

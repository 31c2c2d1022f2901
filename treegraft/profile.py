"""`python -m treegraft profile`: what one forward over q new tree tokens costs, per model of a trio.

For the target and each drafter: one forward over q = 1, 2, 4, ..., 128 new tokens (a tree of q
siblings under the root, float tree mask, explicit positions) on a ~200-token cache, medians of
interleaved repeats (every q once per round, so a busy neighbour slows all q alike). Cached per
machine, trio, device, dtype and kernels in TREEGRAFT_HOME/profiles/, so the hardware-aware budget
and the app read it without measuring again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import time

import torch

from .chunks import cache_home
from .engine import ConfigError
from .kv import make_runner
from .models import ModelLoadError, Trio, sync
from .options import add_model_args, trio_from_args
from .tree import ROOT, DraftTree

QS = (1, 2, 4, 8, 16, 32, 64, 128)


def _key(trio: Trio, context: int) -> str:
    what = json.dumps([trio.names, str(trio.device), str(trio.dtype), trio.kernels, platform.processor(),
                       platform.machine(), torch.__version__, torch.get_num_threads(), context], sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def _context(trio: Trio, length: int) -> list[int]:
    """A real-looking context: a fixed text repeated, so prompt lookup behaves as on real input."""
    text = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
            "The quick brown fox jumps over the lazy dog. ") * 40
    ids = trio.tokenizer(text, add_special_tokens=False)["input_ids"] if trio.tokenizer else list(range(3, 500))
    return (ids * (length // max(1, len(ids)) + 1))[:length]


@torch.inference_mode()
def measure(trio: Trio, qs=QS, context: int = 200, repeats: int = 3) -> dict:
    """Median ms of one forward over q tree tokens, per role, interleaved."""
    seq = _context(trio, context)
    target = make_runner(trio.target, "target")
    runners = {"target": target,
               "weak": make_runner(trio.weak, "weak", features_from=target),
               "strong": make_runner(trio.strong, "strong", features_from=target)}
    target.catch_up(seq[:-1])           # feature drafters read the target's features of the prefix
    for name in ("weak", "strong"):
        runners[name].catch_up(seq)
    target.catch_up(seq)
    times = {name: {q: [] for q in qs} for name in runners}
    for _ in range(repeats + 1):        # the first round warms caches and allocators; not counted
        for q in qs:
            tree = DraftTree()
            nodes = [tree.add(ROOT, 1000 + j, 0.0, "weak")[0] for j in range(q)]
            for name, r in runners.items():
                n = r.n
                sync(trio.device)
                t = time.perf_counter()
                r.forward_nodes(tree, nodes, len(seq) - 1)
                sync(trio.device)
                times[name][q].append(time.perf_counter() - t)
                r.restore(n)
    return {name: {str(q): statistics.median(v[1:]) * 1e3 for q, v in per.items()} for name, per in times.items()}


def profile(trio: Trio, qs=QS, context: int = 200, repeats: int = 3, refresh: bool = False) -> dict:
    path = cache_home() / "profiles" / f"{_key(trio, context)}.json"
    if path.exists() and not refresh:
        cached = json.loads(path.read_text())
        if all(str(q) in cached["target"] for q in qs):
            return cached | {"cached": True}
    out = measure(trio, qs, context, repeats)
    out |= {"device": str(trio.device), "dtype": str(trio.dtype).replace("torch.", ""), "kernels": trio.kernels,
            "trio": trio.trio, "models": trio.names, "context": context, "repeats": repeats,
            "threads": torch.get_num_threads()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(path)
    return out | {"cached": False}


def cached_profile(trio: Trio, context: int = 200) -> dict | None:
    """The profile of this trio on this machine if one was measured, else None (never measures)."""
    path = cache_home() / "profiles" / f"{_key(trio, context)}.json"
    return json.loads(path.read_text()) if path.exists() else None


def table(p: dict) -> str:
    qs = list(p["target"])
    lines = [f"one forward over q new tokens on a {p['context']}-token cache, ms (ratio to q=1); "
             f"{p['device']} {p['dtype']} kernels={p['kernels']}, {p['threads']} threads",
             f"{'model':<10}" + "".join(f"{'q=' + q:>16}" for q in qs)]
    for role in ("target", "weak", "strong"):
        base = p[role]["1"]
        lines.append(f"{role:<10}" + "".join(f"{p[role][q]:>8.1f} ({p[role][q] / base:4.2f}x)" for q in qs))
    lines.append("models: " + ", ".join(f"{k} = {v}" for k, v in p["models"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m treegraft profile", description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--qs", default=",".join(map(str, QS)), help="comma-separated new-token counts")
    ap.add_argument("--context", type=int, default=200, help="cached tokens before the tree")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians)")
    ap.add_argument("--refresh", action="store_true", help="measure again even if a cached profile exists")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = ap.parse_args(argv)
    try:
        qs = tuple(int(q) for q in a.qs.split(","))
    except ValueError:
        raise ConfigError(f"--qs must be comma-separated integers, got {a.qs!r}") from None
    if not qs or min(qs) < 1 or max(qs) > 512 or 1 not in qs:
        raise ConfigError(f"--qs must include 1 and lie in [1, 512], got {a.qs!r}")
    if not 1 <= a.context <= 4096 or not 1 <= a.repeats <= 50:
        raise ConfigError("--context must be in [1, 4096] and --repeats in [1, 50]")
    trio = trio_from_args(a)
    out = profile(trio, qs, a.context, a.repeats, a.refresh)
    print(table(out), file=sys.stderr)
    if a.json:
        print(json.dumps({k: out[k] for k in ("target", "weak", "strong", "device", "dtype", "kernels", "trio",
                                              "models", "context", "threads", "cached")}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    try:
        sys.exit(main())
    except (ConfigError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

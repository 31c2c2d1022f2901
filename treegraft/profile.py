"""`python -m treegraft profile`: what one forward over q new tree tokens costs, per model of a trio
(measured and cached by treegraft.costs; `--budget auto` and the app read the same cache)."""

from __future__ import annotations

import argparse
import json
import sys

from .costs import CURVE_REPEATS, QS, profile
from .engine import ConfigError
from .options import add_model_args, trio_from_args


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
    ap.add_argument("--repeats", type=int, default=CURVE_REPEATS, help="interleaved rounds (medians)")
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


"""`python -m treegraft generate|bench|distill|scheduler ...`

Bad input exits with code 2 and one specific message on stderr, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import torch

from .engine import METHODS, ConfigError, Engine
from .models import ModelLoadError
from .options import add_model_args, add_tree_args, check_prompt, encode_prompt, gen_config, trio_from_args
from .record import dumps_trace


def cmd_generate(a) -> int:
    cfg = gen_config(a, a.method)
    cfg.record_stages = bool(a.trace)  # stage snapshots cost time; only a trace shows them
    check_prompt(a.prompt)  # before any model loads
    trio = trio_from_args(a)
    ids = encode_prompt(trio.tokenizer, a.prompt, a.raw)
    engine = Engine(trio, cfg)
    engine.start(ids)  # checks the prompt fits the context window before any work
    t0 = time.perf_counter()
    records = []
    while not engine.done:
        rec = engine.step()
        records.append(rec)
        if not a.json:
            print(rec.text, end="", flush=True)
    wall = time.perf_counter() - t0
    new = engine.new_tokens
    if a.trace:
        with open(a.trace, "w") as f:
            f.write(dumps_trace(records, {"config": vars(a) | {"graft": vars(cfg.graft)}, "names": trio.names}))
    out = {"text": trio.tokenizer.decode(new, skip_special_tokens=True), "token_ids": new, "new_tokens": len(new),
           "target_forwards": len(records), "tau": len(new) / max(1, len(records)), "wall_s": wall,
           "tokens_per_s": len(new) / wall if wall > 0 else 0.0, "method": cfg.method,
           "policy": cfg.policy if cfg.method == "treegraft" else None,
           "strong_calls": sum(r.strong_called for r in records),
           "time_split_s": {k: sum(r.times.get(k, 0.0) for r in records)
                            for k in sorted({k for r in records for k in r.times})},
           "models": trio.names, "device": str(trio.device), "dtype": str(trio.dtype).replace("torch.", "")}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"\n\n[{cfg.method}] {out['new_tokens']} tokens in {wall:.2f} s = {out['tokens_per_s']:.1f} tokens/s, "
              f"tau {out['tau']:.2f} tokens per target forward ({trio.names['target']}, {out['device']}, {out['dtype']})",
              file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m treegraft", description="TreeGraft speculative decoding")
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="treegraft", choices=METHODS)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    g.add_argument("--trace", default=None, help="write every step record as JSON to this file")
    add_model_args(g)
    add_tree_args(g)
    g.set_defaults(func=cmd_generate)

    for name in DELEGATED:  # listed for --help; main() hands them their argv whole
        sub.add_parser(name, help=f"see `python -m treegraft {name} --help`", add_help=False)
    return p


# Subcommands with their own parsers, imported on demand: they pull in pandas, tqdm and safetensors,
# which `generate` does not need.
DELEGATED = {"bench": "bench", "distill": "distill", "scheduler": "scheduler_train", "profile": "profile",
             "pairs": "bench.pairs"}


def main(argv=None) -> int:
    if os.environ.get("TREEGRAFT_THREADS"):  # a shared CPU: fewer threads beat oversubscription
        torch.set_num_threads(int(os.environ["TREEGRAFT_THREADS"]))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        # argparse.REMAINDER drops options that come first (`bench --suite all`): hand them over whole.
        module = importlib.import_module(f"treegraft.{DELEGATED[argv[0]]}")
        a = argparse.Namespace(func=lambda _: module.main(argv[1:]))
    else:
        a = build_parser().parse_args(argv)
    try:
        return a.func(a) or 0
    except (ConfigError, ModelLoadError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

"""`python -m treegraft generate|bench|distill|scheduler ...`

Bad input exits with code 2 and one specific message on stderr, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .engine import METHODS, ConfigError, GenConfig
from .graft import GraftConfig
from .models import ModelLoadError
from .schedule import POLICIES


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", default="default", help="HF id (local cache only), directory, .gguf file, or 'default'")
    g.add_argument("--weak", default="default", help="weak drafter: same forms as --target")
    g.add_argument("--strong", default="default", help="strong drafter: same forms as --target")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def add_tree_args(p: argparse.ArgumentParser) -> None:
    d = GenConfig()
    gc = GraftConfig()
    g = p.add_argument_group("tree and TreeGraft")
    g.add_argument("--budget", type=int, default=d.budget, help="nodes sent to the target (N)")
    g.add_argument("--depth", type=int, default=d.depth, help="maximum tree depth (D)")
    g.add_argument("--topk", type=int, default=d.topk, help="children per expanded node (k)")
    g.add_argument("--width", type=int, default=None, help="frontier nodes expanded per level (default: topk)")
    g.add_argument("--policy", default=None, choices=POLICIES, help="when TreeGraft calls the strong drafter")
    g.add_argument("--every-k", type=int, default=d.every_k)
    g.add_argument("--scheduler", default=None, help="learned scheduler file (default: the shipped one)")
    g.add_argument("--rescore-m", type=int, default=gc.rescore_m, help="M: pool nodes the strong drafter rescores")
    g.add_argument("--recover-k", type=int, default=gc.recover_k, help="k_r: strong top-k recovered per scored parent")
    g.add_argument("--graft-g", type=int, default=gc.graft_g, help="G: graft positions")
    g.add_argument("--graft-h", type=int, default=gc.graft_h, help="h: graft subtree depth")
    g.add_argument("--graft-k", type=int, default=gc.graft_k, help="children per node inside a graft")
    g.add_argument("--blend", type=float, default=gc.blend, help="weight of log q_s in a rescored node's score")


def gen_config(a, method: str) -> GenConfig:
    from .value import default_policy
    cfg = GenConfig(method=method, max_new_tokens=a.max_new_tokens, budget=a.budget, depth=a.depth,
                    topk=a.topk, width=a.width, temperature=a.temperature, top_p=a.top_p, seed=a.seed,
                    policy=a.policy or default_policy(), every_k=a.every_k, scheduler_path=a.scheduler,
                    graft=GraftConfig(a.rescore_m, a.recover_k, a.graft_g, a.graft_h, a.graft_k, a.blend))
    cfg.check()
    return cfg


def encode_prompt(tokenizer, prompt: str, raw: bool) -> list[int]:
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty")
    if raw or tokenizer.chat_template is None:
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                              add_generation_prompt=True, tokenize=True, return_dict=False))


def cmd_generate(a) -> int:
    from .engine import Engine
    from .models import load_trio
    from .record import dumps_trace

    cfg = gen_config(a, a.method)
    if not a.prompt or not a.prompt.strip():
        raise ConfigError("the prompt is empty")
    trio = load_trio(a.target, a.weak, a.strong, a.device, None if a.dtype == "auto" else a.dtype)
    ids = encode_prompt(trio.tokenizer, a.prompt, a.raw)
    engine = Engine(trio, cfg)
    engine.start(ids)  # validates the prompt before any work
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


DELEGATED = {"bench": "bench", "distill": "distill", "scheduler": "value"}


def main(argv=None) -> int:
    if os.environ.get("TREEGRAFT_THREADS"):  # a shared CPU: fewer threads beat oversubscription
        import torch
        torch.set_num_threads(int(os.environ["TREEGRAFT_THREADS"]))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        # argparse.REMAINDER drops options that come first (`bench --suite all`): hand them over whole.
        module = __import__(f"treegraft.{DELEGATED[argv[0]]}", fromlist=["main"])
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

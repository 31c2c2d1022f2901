"""Settings from the outside world, shared by every front end (cli, bench, the scheduler trainer,
the app): the model and tree options of the command line, GenConfig built from them, and the prompt
checked and turned into token ids."""

from __future__ import annotations

import argparse
import dataclasses

from .engine import AUTO_CAP, ConfigError, GenConfig
from .fastpath import KERNELS
from .models import INT8_ROLES, Trio, load_trio
from .trios import TRIOS, draft_vocab_defaults
from .graft import GraftConfig
from .schedule import POLICIES, default_policy


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--trio", default="smollm2", choices=sorted(TRIOS),
                   help="named trio (target, weak, strong); --target/--weak/--strong override single roles")
    g.add_argument("--target", default="default",
                   help="the trio's ('default'), a named model (qwen-coder-1.5b, qwen-coder-0.5b), a directory, "
                        "a .gguf file, or an HF id (local cache only)")
    g.add_argument("--weak", default="default", help="weak drafter: same forms as --target, or 'ngram' (prompt lookup)")
    g.add_argument("--strong", default="default", help="strong drafter: same forms as --weak")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--kernels", default="auto", choices=KERNELS,
                   help="CPU Linear kernels (fp32, or bf16 on a CPU with native bf16): packed (oneDNN prepacked), stock, "
                        "or auto (measured once per machine and dtype: packed or stock, and per Linear the row "
                        "counts worth padding to a faster one)")
    g.add_argument("--int8", default="none", choices=INT8_ROLES,
                   help="run these standalone drafters in int8 on the CPU (faster, may accept less; the target "
                        "stays as loaded, so output is unchanged)")
    g.add_argument("--draft-vocab", type=int, default=None, metavar="K",
                   help="cut each drafter's full output head to the target's K most frequent tokens (0: full "
                        f"heads; default: the trio's, {draft_vocab_defaults()}): a cheaper drafter forward, the target "
                        "still verifies over every token")
    g.add_argument("--draft-vocab-prompt", action=argparse.BooleanOptionalAction, default=True,
                   help="a cut head also gets each prompt's own tokens for that generation (rare words the answer "
                        "copies; default: on)")


def trio_from_args(a) -> Trio:
    """The trio that add_model_args' options name."""
    return load_trio(a.target, a.weak, a.strong, a.device, None if a.dtype == "auto" else a.dtype,
                     trio=getattr(a, "trio", "smollm2"), kernels=getattr(a, "kernels", "auto"),
                     int8=getattr(a, "int8", "none"), draft_vocab=getattr(a, "draft_vocab", None),
                     draft_vocab_prompt=getattr(a, "draft_vocab_prompt", True))


def add_tree_args(p: argparse.ArgumentParser) -> None:
    d = GenConfig()
    g = p.add_argument_group("tree and TreeGraft")
    g.add_argument("--budget", type=budget_arg, default="auto",
                   help=f"nodes sent to the target (N), or 'auto' (the default): per step, the N <= {AUTO_CAP} "
                        "with the most expected tokens per second on this machine's measured cost curve, and "
                        "drafter levels only while they pay")
    g.add_argument("--depth", type=int, default=d.depth, help="maximum tree depth (D)")
    g.add_argument("--topk", type=int, default=d.topk, help="children per expanded node (k)")
    g.add_argument("--width", type=int, default=None, help="frontier nodes expanded per level (default: topk)")
    g.add_argument("--policy", default=None, choices=POLICIES, help="when TreeGraft calls the strong drafter")
    g.add_argument("--every-k", type=int, default=d.every_k)
    g.add_argument("--unsure", type=float, default=d.unsure,
                   help="when-unsure: call the strong drafter where the weak tree expects fewer tokens than this")
    g.add_argument("--sure", type=float, default=d.sure,
                   help="strong-first: the strong drafter's tree is verified alone where it expects at least "
                        "this many tokens (the bonus token included)")
    g.add_argument("--scheduler", default=None, help="learned scheduler file (default: the shipped one)")
    g.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=d.calibrate,
                   help="score tree nodes by the acceptance rate measured on this generation for the drafter's "
                        "log-probability at that depth (treegraft.calibrate), not by the log-probability itself")
    g.add_argument("--temper", action=argparse.BooleanOptionalAction, default=d.temper,
                   help="under sampling, score the neural drafters' nodes at the sampling temperature "
                        "(a path is accepted with the product of the target's tempered probabilities); off by default: "
                        "measured, it does not pay (README); no effect when greedy or on prompt lookup")
    for f in dataclasses.fields(GraftConfig):  # --rescore-m, --recover-k, --graft-g, ... --blend
        g.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default, help=f.metadata["help"])


def budget_arg(text: str) -> int | str:
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget takes an integer or 'auto', got {text!r}") from None


def gen_config(a, method: str) -> GenConfig:
    """GenConfig from parsed add_tree_args options (plus max_new_tokens, temperature, top_p, seed), checked."""
    auto = a.budget == "auto"
    cfg = GenConfig(method=method, max_new_tokens=a.max_new_tokens, budget=AUTO_CAP if auto else a.budget,
                    auto_budget=auto, depth=a.depth,
                    topk=a.topk, width=a.width, temperature=a.temperature, top_p=a.top_p, seed=a.seed,
                    policy=a.policy or default_policy(), every_k=a.every_k, unsure=a.unsure, sure=a.sure, scheduler_path=a.scheduler,
                    calibrate=a.calibrate, temper=getattr(a, "temper", False),
                    graft=GraftConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(GraftConfig)}))
    cfg.check()
    return cfg


def check_prompt(prompt: str) -> str:
    """Where text enters: refuse an empty prompt before anything is loaded."""
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty")
    return prompt


def encode_prompt(tokenizer, prompt: str, raw: bool) -> list[int]:
    """Token ids of a (checked) prompt: the chat template's user turn, or the raw text."""
    if raw or tokenizer.chat_template is None:
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                              add_generation_prompt=True, tokenize=True, return_dict=False))

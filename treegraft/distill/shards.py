"""The target writes the training data (`distill data`), and the stored data is read back.

Shards are flat safetensors files in the data directory (default data/distill): token ids, per-sample
offsets and answer starts, and the target's top-k log-probs at every answer token. gen-*: greedy
answers to training prompts; tf-*: teacher-forced over ShareGPT's own answers; heldout: greedy
answers to the held-out benchmark prompts; text-pool-*: free ShareGPT text (labels: the real next
tokens, no target compute)."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..models import REPO_ROOT, load_model, load_tokenizer
from .loop import log_line
from .sources import build_training_prompts, heldout_prompts

DATA = REPO_ROOT / "data" / "distill"
HELDOUT = "heldout.safetensors"
TOPK = 8
MAX_PROMPT = 256  # tokens; longer prompts are skipped (prefill is the expensive part of generation)
MAX_SEQ = 448     # tokens per training sequence (prompt + answer)


def chat_ids(tok, prompt: str, answer: str | None = None) -> list[int]:
    msgs = [{"role": "user", "content": prompt}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if answer is not None:
        ids += tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return ids


class TopKRecorder:
    """A logits processor that keeps the target's top-k log-probs of every generated step, so greedy
    answers come with soft labels at no extra target cost."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        lp = torch.log_softmax(scores.float(), -1)
        v, i = lp.topk(TOPK, -1)
        self.steps.append((i.to(torch.int32), v.to(torch.float16)))
        return scores


@torch.no_grad()
def generate_batch(model, tok, items: list[dict], max_new: int) -> list[dict]:
    """Greedy answers for a left-padded batch; returns samples with the target's top-k per answer token."""
    seqs = [chat_ids(tok, p["prompt"]) for p in items]
    width = max(len(s) for s in seqs)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    rec = TopKRecorder()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                         logits_processor=[rec], pad_token_id=pad, eos_token_id=tok.eos_token_id)
    gen = out[:, width:]
    topi = torch.stack([s[0] for s in rec.steps], 1)  # [B, steps, k]
    topv = torch.stack([s[1] for s in rec.steps], 1)
    samples = []
    for b, s in enumerate(seqs):
        g = gen[b].tolist()
        n = g.index(tok.eos_token_id) + 1 if tok.eos_token_id in g else len(g)
        samples.append({"ids": s + g[:n], "start": len(s), "kind": items[b].get("kind") or items[b]["cat"],
                        "topi": topi[b, :n], "topv": topv[b, :n]})
    return samples


@torch.no_grad()
def teacher_force_batch(model, tok, pairs: list[dict]) -> list[dict]:
    """Top-k of the target over ShareGPT's own answers: ~4x cheaper per token than generating."""
    seqs = []
    for p in pairs:
        s = chat_ids(tok, p["prompt"], p["answer"])[:MAX_SEQ]
        start = len(chat_ids(tok, p["prompt"]))
        if start <= MAX_PROMPT and len(s) - start >= 16:
            seqs.append((s, start))
    if not seqs:
        return []
    width = max(len(s) for s, _ in seqs)
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s, _ in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in seqs])
    logits = model(input_ids=ids, attention_mask=mask).logits
    samples = []
    for b, (s, start) in enumerate(seqs):
        lp = torch.log_softmax(logits[b, start - 1: len(s) - 1].float(), -1)
        v, i = lp.topk(TOPK, -1)
        samples.append({"ids": s, "start": start, "kind": "tf", "topi": i.to(torch.int32),
                        "topv": v.to(torch.float16)})
    return samples


def save_shard(path: Path, samples: list[dict]) -> int:
    """One flat safetensors file per shard: ids, per-sample offsets and starts, top-k per label token."""
    ids = torch.cat([torch.as_tensor(s["ids"], dtype=torch.int32) for s in samples])
    lens = torch.tensor([len(s["ids"]) for s in samples], dtype=torch.int64)
    starts = torch.tensor([s["start"] for s in samples], dtype=torch.int64)
    topi = torch.cat([s["topi"] for s in samples])
    topv = torch.cat([s["topv"] for s in samples])
    assert topi.shape[0] == int((lens - starts).sum())
    tmp = path.with_suffix(".tmp")
    save_file({"ids": ids, "lens": lens, "starts": starts, "topi": topi, "topv": topv}, str(tmp),
              metadata={"kinds": json.dumps([s["kind"] for s in samples])})
    tmp.rename(path)
    return int(topi.shape[0])


def load_shard(path: Path) -> list[dict]:
    with safe_open(str(path), "pt") as f:
        kinds = json.loads(f.metadata()["kinds"])
    t = load_file(str(path))
    out, o, lo = [], 0, 0
    for n, st, kind in zip(t["lens"].tolist(), t["starts"].tolist(), kinds):
        m = n - st
        out.append({"ids": t["ids"][o:o + n].long(), "start": st, "kind": kind,
                    "topi": t["topi"][lo:lo + m].long(), "topv": t["topv"][lo:lo + m].float()})
        o, lo = o + n, lo + m
    return out


def run_gen_shards(data: Path, model, tok, items, prefix: str, shard_size: int, batch: int, max_new: int,
                   deadline: float, fn) -> None:
    """Process items shard by shard until the deadline; finished shards are skipped on resume."""
    for k in tqdm(range(0, len(items), shard_size), desc=prefix, mininterval=30, file=sys.stdout):
        path = data / f"{prefix}-{k // shard_size:05d}.safetensors"
        if path.exists():
            continue
        if time.time() > deadline:
            return
        chunk = items[k:k + shard_size]
        t0 = time.time()
        samples = []
        for b in range(0, len(chunk), batch):
            samples += fn(model, tok, chunk[b:b + batch], max_new)
        n = save_shard(path, samples)
        log_line(data / "data_log.jsonl", {"shard": path.name, "samples": len(samples), "label_tokens": n,
                                           "seconds": round(time.time() - t0, 1),
                                           "tokens_per_s": round(n / (time.time() - t0), 1)})


def fits_prompt(tok, items):
    return [p for p in items if len(chat_ids(tok, p["prompt"])) <= MAX_PROMPT]


def phase_data(args) -> None:
    torch.set_num_threads(args.threads)
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(args.target)
    model = load_model(args.target, torch.device("cpu"), torch.float32)
    held = data / HELDOUT
    if not held.exists():
        prompts = heldout_prompts(args.heldout_per_cat)
        samples = []
        for b in range(0, len(prompts), 12):
            samples += generate_batch(model, tok, prompts[b:b + 12], args.max_new)
        save_shard(held, samples)
        print(f"held-out set: {len(samples)} prompts", flush=True)
    gen, tf = build_training_prompts(args.seed)
    t_end_gen = time.time() + args.gen_minutes * 60
    # Sorting within a shard by prompt length keeps left padding (and wasted prefill) small.
    gen = fits_prompt(tok, gen[: args.max_gen_prompts])
    gen = [p for k in range(0, len(gen), args.shard) for p in
           sorted(gen[k:k + args.shard], key=lambda p: len(p["prompt"]))]
    run_gen_shards(data, model, tok, gen, "gen", args.shard, args.batch, args.max_new, t_end_gen, generate_batch)
    t_end_tf = time.time() + args.tf_minutes * 60
    tf = [p for k in range(0, len(tf), args.shard) for p in
          sorted(tf[k:k + args.shard], key=lambda p: len(p["prompt"]) + len(p["answer"]))]
    tf_fn = lambda m, t, part, mx: teacher_force_batch(m, t, part)  # noqa: E731
    run_gen_shards(data, model, tok, tf, "tf", args.shard, 8, 0, t_end_tf, tf_fn)


def load_training_samples(data: Path) -> list[dict]:
    """Every target-labelled shard (generated, then teacher-forced)."""
    out = []
    for path in sorted(data.glob("gen-*.safetensors")) + sorted(data.glob("tf-*.safetensors")):
        out += load_shard(path)
    return out


def text_samples(tok, limit: int, seed: int = 1) -> list[dict]:
    """ShareGPT's own answers as free extra training text (no target compute): labels are the real
    next tokens. It teaches a general chat-LM prior; target-written data then pulls it to the target."""
    _, pairs = build_training_prompts(0)
    random.Random(seed).shuffle(pairs)
    out = []
    for p in pairs[-limit:]:  # the tail: the teacher-forced shards use the head of this list
        ids = chat_ids(tok, p["prompt"], p["answer"])[:MAX_SEQ]
        start = len(chat_ids(tok, p["prompt"]))
        if start > MAX_PROMPT or len(ids) - start < 16:
            continue
        nxt = torch.tensor(ids[start:]).unsqueeze(1)
        out.append({"ids": torch.tensor(ids), "start": start, "kind": "text", "topi": nxt.repeat(1, TOPK),
                    "topv": torch.tensor([0.0] + [-1e4] * (TOPK - 1)).repeat(len(ids) - start, 1)})
    return out


def cached_text_samples(data: Path, limit: int, target: str = "default") -> list[dict]:
    """Building the free-text pool takes a minute of tokenising; every resumed segment reuses it."""
    if limit <= 0:
        return []
    path = data / f"text-pool-{limit}.safetensors"
    if not path.exists():
        save_shard(path, [s | {"topi": s["topi"].to(torch.int32), "topv": s["topv"].half()}
                          for s in text_samples(load_tokenizer(target), limit)])
    return load_shard(path)

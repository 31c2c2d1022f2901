"""The target's tokens ranked by how often they occur in training text: the rows a drafter's cut head
keeps (treegraft.vocab, `--draft-vocab K`).

Counted over ShareGPT answers outside the held-out slice (treegraft.distill.sources), tokenised with
the target's tokenizer; the end-of-turn tokens head the ranking, since every answer ends with one.
Written to assets/vocab/<trio>.json with the coverage of the top K: the share of the counted tokens
that a head of K rows can propose at all.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..models import load_tokenizer
from ..trios import trio_spec
from ..vocab import VOCAB_DIR
from .sources import first_exchange, is_heldout_sharegpt, sharegpt_records

KEEP = 32768          # ids written: the largest head worth cutting to
COVERAGE_AT = (2048, 4096, 8192, 16384, 32768)


def end_tokens(tok) -> list[int]:
    names = ["<|im_end|>", "<|endoftext|>", "<|im_start|>", tok.eos_token]
    ids = [tok.convert_tokens_to_ids(n) for n in names if n]
    return list(dict.fromkeys(i for i in ids if isinstance(i, int) and i >= 0 and i != tok.unk_token_id))


def rank(trio: str, records: int) -> dict:
    spec = trio_spec(trio)
    tok = load_tokenizer(spec.target)
    counts, used = Counter(), 0
    for rec in sharegpt_records():
        if used >= records:
            break
        ex = first_exchange(rec)
        if ex is None or is_heldout_sharegpt(rec.get("id", "")):
            continue
        counts.update(tok(ex[1], add_special_tokens=False)["input_ids"])
        used += 1
    total = sum(counts.values())
    ends = end_tokens(tok)
    ids = ends + [i for i, _ in counts.most_common() if i not in ends]
    ids = ids[:KEEP]
    cum, covered = {}, 0
    for k, i in enumerate(ids, 1):
        covered += counts.get(i, 0)
        if k in COVERAGE_AT:
            cum[str(k)] = round(covered / total, 5)
    return {"trio": trio, "target": spec.target, "source": f"ShareGPT first answers, {used} records outside "
            "the held-out slice (treegraft.distill.sources)", "tokens": total, "distinct": len(counts),
            "coverage": cum, "ids": ids}


def phase_vocab(args) -> None:
    out = Path(args.out) if args.out else VOCAB_DIR / f"{args.trio}.json"
    r = rank(args.trio, args.records)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(r, separators=(",", ":")))
    tmp.replace(out)
    print(json.dumps({k: v for k, v in r.items() if k != "ids"}, indent=2), flush=True)

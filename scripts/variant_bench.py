"""Variants of a trio's drafters side by side in one run: one target loaded once, the drafters
loaded once per variant, the same prompts and methods, interleaved prompt by prompt with the
variants taking turns to go first, greedy, `--budget auto`. Variants, the baseline first:
`fp32` (full heads, whatever the trio's default cut), `int8` (the strong drafter by
treegraft.quantize), `vocabK` (each drafter's full head cut to the target's K most frequent tokens,
plus each prompt's own tokens, treegraft.vocab), `vocabK-fixed` (the K tokens alone). Each variant
but the baseline loads its drafters again (a 0.5B per variant, so qwen-coder fits two in 24 GB),
except vocabK beside vocabK-fixed, which share one copy. Variants loaded again are packed without
the one-row layout the baseline may get (treegraft.fastpath), which can cost them a little. Prints
tokens/s over `ar` of each, tau, the strong drafter's seconds per target forward, and checks every
output equals `ar`'s (the target's own greedy decoding).

    TREEGRAFT_THREADS=2 .venv/bin/python scripts/variant_bench.py --trio qwen-coder --weak ngram \\
        --strong qwen-coder-0.5b --limit 2 --max-new-tokens 32 --out runs/int8/side_by_side.jsonl
    TREEGRAFT_THREADS=2 .venv/bin/python scripts/variant_bench.py --trio smollm2 --weak default \\
        --strong default --variants fp32,vocab8192 --out runs/vocab/smollm2.jsonl

Rows are appended to --out as each (prompt, method, variant) finishes; rerunning the same command
skips the rows already there (an interrupted run resumes), then prints the table from the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.bench.prompts import SUITES, load_suite
from treegraft.engine import Engine, GenConfig
from treegraft.fastpath import pack_models
from treegraft.models import load_drafter, load_trio
from treegraft.options import encode_prompt
from treegraft.quantize import quantize_drafter
from treegraft.vocab import CutHead, cut_head, ranking

METHODS = ("ar", "tree-strong", "treegraft:always", "treegraft:learned")


def config(method: str, max_new: int, depth: int) -> GenConfig:
    name, _, policy = method.partition(":")
    return GenConfig(method=name, policy=policy or "always", max_new_tokens=max_new, budget=64,
                     auto_budget=True, depth=depth, record_stages=False)


def admits(trio, prompt: bool) -> None:
    for model in (trio.weak, trio.strong):
        head = getattr(model, "lm_head", None)
        if isinstance(head, CutHead):
            head.prompt = prompt


def run_one(trio, ids: list[int], method: str, max_new: int, depth: int) -> dict:
    engine = Engine(trio, config(method, max_new, depth))
    t = time.perf_counter()
    records = list(engine.generate(ids))
    wall = time.perf_counter() - t
    strong_s = sum(r.times.get("draft_strong", 0.0) for r in records)
    return {"new_tokens": len(engine.new_tokens), "target_forwards": len(records), "wall_s": wall,
            "strong_s": strong_s, "strong_calls": sum(r.strong_called for r in records),
            "output": engine.new_tokens}


def table(rows: list[dict], methods: list[str], variants=("fp32", "int8")) -> str:
    ar = {r["prompt"]: r for r in rows if r["method"] == "ar"}
    lines = ["| method | drafters | prompts | tokens/s over ar (pooled) | tau | strong s per target forward "
             "| strong calls | outputs equal ar's |", "|---|---|---|---|---|---|---|---|"]
    for m in methods[1:]:
        for kind in variants:
            rs = [r for r in rows if r["method"] == m and r["drafter"] == kind and r["prompt"] in ar]
            if not rs:
                continue
            ar_tok = sum(ar[r["prompt"]]["new_tokens"] for r in rs) / sum(ar[r["prompt"]]["wall_s"] for r in rs)
            tok = sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)
            fwd = sum(r["target_forwards"] for r in rs)
            same = sum(r["output"] == ar[r["prompt"]]["output"] for r in rs)
            lines.append(f"| {m} | {kind} | {len(rs)} | {tok / ar_tok:.3f} | {sum(r['new_tokens'] for r in rs) / fwd:.2f} "
                         f"| {sum(r['strong_s'] for r in rs) / fwd:.3f} "
                         f"| {'every step' if m == 'tree-strong' else format(sum(r['strong_calls'] for r in rs) / fwd, '.0%')} "
                         f"| {same}/{len(rs)} |")
    base = variants[0]
    for m in methods[1:]:
        by = {k: {r["prompt"]: r for r in rows if r["method"] == m and r["drafter"] == k} for k in variants}
        for kind in variants[1:]:
            both = sorted(set(by[base]) & set(by[kind]))
            if both:
                ratio = (sum(by[base][p]["wall_s"] for p in both) / sum(by[kind][p]["wall_s"] for p in both))
                lines.append(f"\n{m}: {kind} / {base} tokens/s = {ratio:.3f} over {len(both)} prompts")
    return "\n".join(lines)


def cut_of(name: str) -> tuple[int, bool] | None:
    """vocabK -> (K, True), vocabK-fixed -> (K, False), anything else None."""
    k = name[5:].removesuffix("-fixed")
    return (int(k), not name.endswith("-fixed")) if name.startswith("vocab") and k.isdigit() else None


def variant(trio, name: str, weak: str, strong: str, base: str):
    """The trio with this variant's drafters (the baseline: the trio itself). vocabK and vocabK-fixed
    beside each other share one loaded copy: only the prompt rows differ (set per run, `admits`),
    so the kernels and memory layout are the same on both sides."""
    if name == base or cut_of(name) and cut_of(base) and cut_of(name)[0] == cut_of(base)[0]:
        return trio
    if name == "int8":
        drafters = {"strong": load_drafter(strong, "strong", trio.target, trio.device, trio.dtype)}
        quantize_drafter(drafters["strong"], trio.target, "strong")
    elif cut_of(name):
        (keep, prompt), drafters = cut_of(name), {}
        for role, spec in (("weak", weak), ("strong", strong)):
            if spec == "ngram":
                continue
            model = load_drafter(spec, role, trio.target, trio.device, trio.dtype)
            if cut_head(model, ranking(trio.trio), keep, trio.target.config.vocab_size, prompt=prompt):
                drafters[role] = model
    else:
        raise SystemExit(f"unknown variant {name!r}: fp32, int8, vocabK or vocabK-fixed (e.g. vocab8192)")
    if trio.kernels == "packed":
        pack_models(list(drafters.values()))  # their fp32 Linears, like the first variant's
    return dataclasses.replace(trio, **drafters,
                               names=trio.names | {r: f"{trio.names[r]} ({name})" for r in drafters})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trio", default="qwen-coder")
    ap.add_argument("--weak", default="ngram")
    ap.add_argument("--strong", default="qwen-coder-0.5b")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated; ar first")
    ap.add_argument("--variants", default="fp32,int8",
                    help="comma-separated, the baseline first: fp32 (full heads), int8, vocabK, vocabK-fixed")
    ap.add_argument("--limit", type=int, default=2, help="prompts per set (all six sets)")
    ap.add_argument("--offset", type=int, default=0,
                    help="skip this many prompts of each set (70: the validation prompts the arms are chosen on)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--out", required=True, help="JSONL of finished rows (resumable)")
    a = ap.parse_args()
    methods = a.methods.split(",")
    if methods[0] != "ar":
        raise SystemExit("--methods must start with ar (every output is checked against it)")
    if os.environ.get("TREEGRAFT_THREADS"):
        torch.set_num_threads(int(os.environ["TREEGRAFT_THREADS"]))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    keys = {(r["prompt"], r["method"], r["drafter"]) for r in done}
    if a.limit < 1 or a.offset < 0:
        raise SystemExit(f"--limit must be >= 1 and --offset >= 0, got {a.limit} and {a.offset}")
    prompts = [p for s in SUITES for p in load_suite(s, a.offset + a.limit)[a.offset:]]
    if not prompts:
        raise SystemExit(f"no prompts from offset {a.offset}: every set is shorter")
    variants = a.variants.split(",")
    if variants[0] != "fp32" and not cut_of(variants[0]) or len(variants) < 2:
        raise SystemExit("--variants must start with the baseline (fp32 or a vocab variant) and name at least one more")
    keep = (cut_of(variants[0]) or (0, True))[0]
    # Loaded able to admit a prompt's rows; each vocab variant's run switches them on or off (admits).
    base = load_trio(trio=a.trio, weak=a.weak, strong=a.strong, dtype="float32", device="cpu", draft_vocab=keep)
    trios = {v: variant(base, v, a.weak, a.strong, variants[0]) for v in variants}
    print(f"{len(prompts)} prompts x {methods}: {base.names}, kernels {base.kernels}, "
          f"{torch.get_num_threads()} threads", file=sys.stderr)
    with out.open("a") as f:
        for i, p in enumerate(prompts):
            ids = encode_prompt(base.tokenizer, p.text, raw=False)
            for m in methods:
                # the variants take turns to go first, so a drifting machine slows all alike
                for kind in variants[i % len(variants):] + variants[:i % len(variants)]:
                    if m == "ar" and kind != variants[0] or (p.id, m, kind) in keys:
                        continue
                    if cut_of(kind):
                        admits(trios[kind], cut_of(kind)[1])
                    row = {"prompt": p.id, "method": m, "drafter": kind} | run_one(trios[kind], ids, m, a.max_new_tokens, a.depth)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    done.append(row)
                    print(f"{p.id} {m} {kind}: {row['new_tokens'] / row['wall_s']:.2f} tokens/s", file=sys.stderr)
    print(f"{a.trio}: weak {a.weak}, strong {a.strong}; fp32, {len(prompts)} prompts x {a.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, kernels {base.kernels}")
    print(table(done, methods, variants))


if __name__ == "__main__":
    main()

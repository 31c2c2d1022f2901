"""How much of the target's own output a cut drafter head can propose, from finished `bench` runs: per
prompt set, the share of `ar`'s output tokens outside the target's K most frequent tokens (the cut head
alone), outside those and the prompt's own tokens (the head with `--draft-vocab-prompt`, the default),
and outside those and the tokens already generated. No model runs: the tokenizer re-encodes each prompt.

  .venv/bin/python scripts/head_coverage.py --trio smollm2 --keep 8192 docs/bench/avx512-vocab/smollm2__ngram_weak
  .venv/bin/python scripts/head_coverage.py --trio qwen-coder --keep 16384 docs/bench/avx512-vocab/qwen-coder__ngram_qwen-0.5b
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.bench.prompts import SUITES, load_suite
from treegraft.models import load_tokenizer
from treegraft.options import encode_prompt
from treegraft.trios import TRIOS
from treegraft.vocab import ranking

COLUMNS = ("outside the head", "outside head + prompt", "outside head + prompt + generated")


def misses(ranked: set[int], prompt: list[int], output: list[int]) -> tuple[int, int, int]:
    seen, counts = set(prompt), [0, 0, 0]
    for t in output:
        counts[0] += t not in ranked
        counts[1] += t not in ranked and t not in prompt
        counts[2] += t not in ranked and t not in seen
        seen.add(t)
    return tuple(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="bench run directories (their outputs.jsonl and config.json)")
    ap.add_argument("--trio", required=True, choices=sorted(TRIOS))
    ap.add_argument("--keep", type=int, required=True, help="K, the head's size")
    a = ap.parse_args()
    ranked = set(ranking(a.trio)[:a.keep])
    tok = load_tokenizer(TRIOS[a.trio].target)
    tokens, out, target = defaultdict(int), defaultdict(lambda: [0, 0, 0]), None
    for run in map(Path, a.runs):
        config = json.loads((run / "config.json").read_text())
        target = target or config["models"]["target"]
        if config["models"]["target"] != target:
            raise SystemExit(f"{run}: another target than {a.runs[0]}'s")
        prompts = {p.id: p for s in SUITES for p in load_suite(s, config["limit"])}
        for line in (run / "outputs.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row["method"] != "ar":
                continue
            p = prompts[row["prompt_id"]]
            suite = p.category.split("/")[0]
            tokens[suite] += len(row["token_ids"])
            for i, n in enumerate(misses(ranked, encode_prompt(tok, p.text, raw=False), row["token_ids"])):
                out[suite][i] += n
    if not tokens:
        raise SystemExit("no `ar` rows in these runs")
    print(f"| set | target tokens | " + " | ".join(COLUMNS) + " |\n|---|---|---|---|---|")
    for suite in list(tokens) + ["all"]:
        n = sum(tokens.values()) if suite == "all" else tokens[suite]
        m = [sum(v[i] for v in out.values()) for i in range(3)] if suite == "all" else out[suite]
        print(f"| {suite} | {n} | " + " | ".join(f"{x / n:.1%}" for x in m) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Every shipped pair, every method of a pair interleaved in one bench run (tau and tokens/s side by
# side), one pair at a time; resumable (the same command skips finished rows). Each pair's `learned`
# is its own scheduler (assets/scheduler/<trio>/<weak>+<strong>/). Then the tables:
#   scripts/bench_pairs.sh OUT [LIMIT]  &&  .venv/bin/python scripts/ablation_table.py OUT
# METHODS="ar,tree-weak,..." replaces the method list (then no pair gets `assisted` added);
# REPEATS=3 runs each prompt's methods in 3 round-robin rounds and keeps each method's median round.
# ONLY="qwen-coder__ngram_qwen-0.5b smollm2__weak_strong" runs those pairs (their OUT names) alone.
# INT8=strong runs the strong drafter in int8 (--int8; with ONLY the pairs whose 0.5B is standalone).
# DRAFT_VOCAB=8192 cuts every drafter's full head to the target's 8192 most frequent tokens (--draft-vocab;
# unset: the trio's default, 0: full heads); DRAFT_VOCAB_PROMPT=0 leaves each prompt's own tokens out of the cut heads.
# DTYPE=bfloat16 runs every model in bf16 (default float32, the dtype lossless is asserted in; auto: the machine's).
# TEMPERATURE=0.7 samples (default 0, greedy; top-p 1, seed 0): matches_ar is then empty, each method draws its own sample.
set -euo pipefail
root=${1:?usage: bench_pairs.sh OUT [prompts per set]}; limit=${2:-1}
py=${PYTHON:-.venv/bin/python}
fixed_heads=(); [ "${DRAFT_VOCAB_PROMPT:-1}" != 0 ] || fixed_heads=(--no-draft-vocab-prompt)
B="treegraft:always[budget=8],treegraft:always[budget=16],treegraft:always[budget=32],treegraft:always[budget=64]"
M="${METHODS:-ar,tree-weak,tree-strong,treegraft:never,treegraft:always,treegraft:learned,treegraft:oracle,$B}"
run() {  # trio weak strong dir extra-methods
  local extra=$5; [ -z "${METHODS:-}" ] || extra=""
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $4 "* ]] || return 0
  echo "== $4 $(date -u +%H:%M:%S)"
  "$py" -m treegraft bench --trio "$1" --weak "$2" --strong "$3" --int8 "${INT8:-none}" ${DRAFT_VOCAB:+--draft-vocab "$DRAFT_VOCAB"} ${fixed_heads[@]+"${fixed_heads[@]}"} --suite all --limit "$limit" \
    --max-new-tokens 32 --dtype "${DTYPE:-float32}" --temperature "${TEMPERATURE:-0}" --threads 2 --budget auto --depth 10 --methods "$M$extra" \
    --repeats "${REPEATS:-1}" --out "$root/$4"
}
run qwen-coder ngram qwen-coder-0.5b qwen-coder__ngram_qwen-0.5b ",assisted"
run qwen-coder asset:qwen-coder-weak qwen-coder-0.5b qwen-coder__qwen-skip_qwen-0.5b ",assisted"
run qwen-coder ngram asset:qwen-coder-weak qwen-coder__ngram_qwen-skip ""
run smollm2 asset:weak asset:strong smollm2__weak_strong ""
run smollm2 ngram asset:strong smollm2__ngram_strong ""
run smollm2 ngram asset:weak smollm2__ngram_weak ""
run smollm2 asset:weak ngram smollm2__weak_ngram ""
echo "== done $(date -u +%H:%M:%S)"

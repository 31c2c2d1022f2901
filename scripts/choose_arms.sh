#!/usr/bin/env bash
# Choose each shipped pair's arm on validation prompts (PER_SUITE per set, default 1, from offset 70:
# disjoint from the training prompts at 40-42 and the benchmark's first ones): tree-strong, never, always, when-empty,
# when-matched (where the strong drafter is prompt lookup), when-unsure (at its default threshold, plus any in
# EXTRA_ARMS, e.g. EXTRA_ARMS="treegraft:when-unsure[unsure=1.5]";
# for a pair whose strong drafter is cheaper than its weak one, "treegraft:strong-first[sure=3,unsure=1.5]") and the gain rule
# run interleaved (REPEATS rounds, median kept), then `scheduler choose` writes the fastest into the
# pair's scheduler.json and REPORT.md. INT8=strong runs the strong drafter in int8 (--int8): its arm is kept
# beside the fp32 one (arm_int8 in scheduler.json), since a cheaper drafter may pay where the fp32 one did not.
# HARDWARE=cpu-avx512 (this machine's class: treegraft.fastpath.hardware_class) keeps the arm for that
# class of machine only (arm_hardware), since what a tree costs to verify, and so the fastest arm, moves with it.
# ARCHIVE=docs/bench/arms-X copies each validation run to ARCHIVE/<trio>__<pair> and records that path as
# the arm's source (scheduler choose --archive; runs/ is never committed).
# DRAFT_VOCAB=K cuts the drafters' heads to K tokens (--draft-vocab; unset: the trio's default, 0: full heads);
# DRAFT_VOCAB_PROMPT=0 leaves each prompt's own tokens out of the cut heads (--no-draft-vocab-prompt).
# Resumable (each compare run is). One pair at a time.
#   scripts/choose_arms.sh OUT [trio/weak+strong ...]
set -euo pipefail
root=${1:?usage: choose_arms.sh OUT [trio/weak+strong ...]}; shift
pairs=("$@")
source "$(dirname "$0")/pairs.sh"
[ ${#pairs[@]} -gt 0 ] || pairs=("${SHIPPED_PAIRS[@]}")
py=${PYTHON:-.venv/bin/python}
fixed_heads=(); [ "${DRAFT_VOCAB_PROMPT:-1}" != 0 ] || fixed_heads=(--no-draft-vocab-prompt)
for p in "${pairs[@]}"; do
  trio=${p%%/*}; pair=${p#*/}; weak=${pair%%+*}; strong=${pair#*+}
  mkdir -p "$root/$p"
  # prompt lookup as the strong drafter can be read before the call: when-matched is an arm too
  matched=""; [ "$strong" != ngram ] || matched=",treegraft:when-matched"
  # The gain rule alone (no arm yet): what `learned` is before this choice.
  "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("arm",None); d.pop("arm_int8",None); d.pop("arm_hardware",None); json.dump(d,open(sys.argv[2],"w"))' \
    "assets/scheduler/$p/scheduler.json" "$root/$p/gain.json"
  echo "== $p $(date -u +%H:%M:%S)"
  TREEGRAFT_THREADS=2 "$py" -m treegraft scheduler compare --trio "$trio" --weak "$(role "$weak")" \
    --strong "$(role "$strong")" --int8 "${INT8:-none}" ${DRAFT_VOCAB:+--draft-vocab "$DRAFT_VOCAB"} ${fixed_heads[@]+"${fixed_heads[@]}"} --dtype float32 --per-suite "${PER_SUITE:-1}" --offset 70 --max-new-tokens 32 --budget auto \
    --depth 10 --methods "tree-strong,treegraft:never,treegraft:always,treegraft:when-empty,treegraft:when-unsure$matched${EXTRA_ARMS:+,$EXTRA_ARMS},treegraft:learned" \
    --scheduler "$root/$p/gain.json" --repeats "${REPEATS:-2}" --out "$root/$p/compare"
  "$py" -m treegraft scheduler choose --compare "$root/$p/compare" --scheduler "assets/scheduler/$p" \
    ${HARDWARE:+--hardware "$HARDWARE"} ${ARCHIVE:+--archive "$ARCHIVE/${p/\//__}"}
done
echo "== done $(date -u +%H:%M:%S)"

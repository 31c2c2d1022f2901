#!/usr/bin/env bash
# Collect oracle steps for every shipped pair (18 training prompts: 3 per set from offset 40), one
# pair at a time (never two models' worth of memory at once). Resumable: the same command skips the
# prompts already in each file. Usage: scripts/collect_schedulers.sh OUT_ROOT [trio/weak+strong ...]
set -euo pipefail
root=${1:?usage: collect_schedulers.sh OUT_ROOT [trio/weak+strong ...]}; shift
pairs=("$@")
source "$(dirname "$0")/pairs.sh"
[ ${#pairs[@]} -gt 0 ] || pairs=("${SHIPPED_PAIRS[@]}")
py=${PYTHON:-.venv/bin/python}
for p in "${pairs[@]}"; do
  trio=${p%%/*}; pair=${p#*/}; weak=${pair%%+*}; strong=${pair#*+}
  mkdir -p "$root/$p"
  echo "== $p $(date -u +%H:%M:%S)"
  TREEGRAFT_THREADS=2 "$py" -m treegraft scheduler collect --trio "$trio" --weak "$(role "$weak")" \
    --strong "$(role "$strong")" --dtype float32 --per-suite 3 --max-new-tokens 32 --budget auto \
    --depth 10 --out "$root/$p/oracle-steps.jsonl"
done
echo "== done $(date -u +%H:%M:%S)"

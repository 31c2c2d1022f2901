#!/usr/bin/env bash
# On a machine with CUDA: the test suite on the GPU (tiny models: nothing to download), then a
# side-by-side measurement of ar vs tree-* with randomly initialised ~1B / ~100M models.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" || exit 1
TREEGRAFT_TEST_DEVICE=cuda $PY -m pytest -q -x -p no:cacheprovider \
  tests/test_tree.py tests/test_mask.py tests/test_lossless.py tests/test_graft.py tests/test_sampling.py \
  -k "not default_trio"
PYTHONPATH=. $PY scripts/gpu_bench.py --dtype float32 --max-new-tokens 64
PYTHONPATH=. $PY scripts/gpu_bench.py --dtype bfloat16 --max-new-tokens 96

"""The dense cost grid against the old one, side by side in one bench run: every engine method whose
label ends in `[depth=10]` (the same settings as without it under `--depth 10`, so a second label for
the same method) sizes its trees and weighs its strong calls on the curve the old grid would have
measured, the current profile read at q = 1, 2, 4, 8, 16, 32, 64 only and interpolated between; the
plain label reads every measured q (treegraft.costs.QS). Everything else is `python -m treegraft
bench`, arguments and all: methods interleaved per prompt, outputs checked against `ar`, resumable.

    PYTHONPATH=. .venv/bin/python scripts/grid_ab.py --trio qwen-coder --weak ngram --strong qwen-coder-0.5b \
        --suite all --limit 2 --max-new-tokens 32 --dtype float32 --threads 2 --budget auto --depth 10 \
        --methods "ar,tree-strong,tree-strong[depth=10],treegraft:always,treegraft:always[depth=10],treegraft:learned,treegraft:learned[depth=10]" \
        --out runs/grid-ab/qwen-coder__ngram_qwen-0.5b
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a clone

from treegraft.bench import main
from treegraft.bench import methods
from treegraft.budget import LiveCurve

OLD_GRID = (1, 2, 4, 8, 16, 32, 64)
_init = methods.EngineRunner.__init__


def coarse(curve: LiveCurve) -> LiveCurve:
    return LiveCurve({q: ms for q, ms in curve.base.items() if q in OLD_GRID})


def init(self, trio, cfg, method) -> None:
    _init(self, trio, cfg, method)
    e = self.engine
    if not method.label.endswith("[depth=10]"):
        return
    if e.curve is not None:                 # the engine's scheduler reads the same object then
        e.curve = e.cost_curve = coarse(e.curve)
    elif e.cost_curve is not None:
        e.cost_curve = coarse(e.cost_curve)


methods.EngineRunner.__init__ = init

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

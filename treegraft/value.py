"""The offline value system and the scheduler distilled from it (see ALGORITHM.md)."""

from __future__ import annotations

import json
from pathlib import Path

from .models import ASSETS

DEFAULT_SCHEDULER = ASSETS / "scheduler" / "scheduler.json"


def default_policy() -> str:
    """`learned` once a distilled scheduler ships, `always` until then."""
    return "learned" if DEFAULT_SCHEDULER.exists() else "always"


class LearnedPolicy:
    @classmethod
    def load(cls, path: str | None = None):
        p = Path(path) if path else DEFAULT_SCHEDULER
        if not p.exists():
            raise FileNotFoundError(f"no learned scheduler at {p}; train one with `python -m treegraft scheduler train`")
        raise NotImplementedError(json.loads(p.read_text()))

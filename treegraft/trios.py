"""Trios by name: (target, weak drafter, strong drafter), each a model spec that models.load_trio takes.

  * ``smollm2``     SmolLM2-135M-Instruct + the drafters distilled here (assets/drafters/)
  * ``qwen-coder``  Qwen2.5-Coder-1.5B-Instruct (target) + the prompt-lookup drafter (weak: zero model
                    cost, the best cheap drafter this target has until a distilled one ships) +
                    Qwen2.5-Coder-0.5B-Instruct (strong: a real LLM at ~0.35x the target's per-token cost)
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelLoadError


@dataclass(frozen=True)
class TrioSpec:
    target: str
    weak: str
    strong: str
    note: str
    # Drafter heads cut to the target's K most frequent tokens by default (treegraft.vocab; 0: full heads).
    draft_vocab: int = 0


TRIOS = {
    # 8192 rows (91.5% of training text's tokens): on AVX-512 the weak+strong pair's `learned` ran 1.17x
    # `ar` against 1.08x with full heads, same prompts, same session, the same tau (README "Cut drafter heads").
    "smollm2": TrioSpec("default", "default", "default",
                        "SmolLM2-135M-Instruct with the weak and strong drafters distilled here", draft_vocab=8192),
    # 16384 of 151936 rows (94.2%): the 0.5B's tied head is a quarter of its weights; side by side on the
    # trio's pair, tree-strong +5%, always +4%, learned +6% tokens/s at the same or higher tau (docs/bench/vocab/).
    "qwen-coder": TrioSpec("qwen-coder-1.5b", "ngram", "qwen-coder-0.5b",
                           "Qwen2.5-Coder-1.5B-Instruct; weak: prompt lookup (n-gram, zero model cost; "
                           "the best cheap drafter this target has so far); strong: Qwen2.5-Coder-0.5B-Instruct",
                           draft_vocab=16384),
}


def draft_vocab_defaults() -> str:
    """Each trio's default cut, for help texts: "smollm2 8192, qwen-coder 16384"."""
    return ", ".join(f"{name} {spec.draft_vocab or 'full'}" for name, spec in TRIOS.items())


def trio_spec(name: str) -> TrioSpec:
    if name not in TRIOS:
        raise ModelLoadError(f"unknown trio {name!r}; choose one of {', '.join(TRIOS)}")
    return TRIOS[name]

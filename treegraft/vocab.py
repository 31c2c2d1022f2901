"""A drafter's output head cut to the target's K most frequent tokens (`--draft-vocab K`; FR-Spec's idea).

Why: a small drafter's head is most of its forward. SmolLM2's feature drafter runs one 576-wide
decoder layer (3.9M weights) and then the target's 49152 x 576 head (28.3M); on a CPU a forward
mostly reads weights, so the head sets the price of every level drafted and every strong call.

A cut head computes only the kept rows (its own copy of them, so the target's head is untouched) and
gives every other token one low logit, the row's floor. Tokens at a row's floor are no
proposal and no opinion throughout the engine (draft.add_children, graft), so a cut drafter never
proposes an unkept token and never rescores one it cannot see. The target still verifies every
token over its full vocabulary: output is unchanged, only acceptance can move.

A prompt copies rare words (names, terms, code identifiers) that the answer repeats, and a ranking of
training text cannot know them: on held-out prompts a third to a half of the target's tokens outside a
cut head occur in the prompt. So by default a cut head also gets the prompt's tokens' rows for the
length of one generation (`admit`, from Engine.start; `--no-draft-vocab-prompt` turns it off).

The ranking comes from training text (treegraft.distill.vocab), shipped as assets/vocab/<trio>.json.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .errors import ModelLoadError

VOCAB_DIR = Path(__file__).resolve().parent.parent / "assets" / "vocab"
FLOOR = -1e4  # logit of a token outside a cut head: finite (no inf - inf in later arithmetic), never chosen


class CutHead(nn.Module):
    """Logits over the full vocabulary from the kept rows only; the rest sit at the row's floor."""

    def __init__(self, head: nn.Linear, ids: torch.Tensor, prompt: bool = True):
        super().__init__()
        w = head.weight
        self.vocab, self.prompt = w.shape[0], prompt
        # The full rows the prompt's tokens are read from: a tuple, so neither a parameter to pack or
        # quantize nor a copy. A tied head's rows are the embedding, kept anyway; an untied one (the
        # 0.5B's: 545 MB in fp32) stays in memory only for this.
        self.source = (w, head.bias) if prompt else None
        self.proj = nn.Linear(w.shape[1], len(ids), bias=head.bias is not None, device=w.device, dtype=w.dtype)
        ids = ids.to(w.device)
        with torch.no_grad():
            self.proj.weight.copy_(w[ids])
            if head.bias is not None:
                self.proj.bias.copy_(head.bias[ids])
        self.register_buffer("ids", ids, persistent=False)
        kept = torch.zeros(self.vocab, dtype=torch.bool, device=w.device)
        self.register_buffer("kept", kept.index_fill_(0, ids, True), persistent=False)
        self.extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None  # (ids, rows, bias)

    def admit(self, token_ids: list[int]) -> int:
        """Give these tokens (a prompt's) their full rows beside the kept ones, replacing what an earlier
        call admitted; a no-op with prompt=False. Returns how many rows were added."""
        self.extra = None
        if not self.prompt or self.source is None or not token_ids:
            return 0
        w, b = self.source
        ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=w.device)
        ids = ids[(ids < self.vocab) & (ids >= 0)]
        ids = ids[~self.kept[ids]]
        if len(ids):
            self.extra = (ids, w[ids], None if b is None else b[ids])
        return len(ids)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = hidden.new_full((*hidden.shape[:-1], self.vocab), FLOOR)
        out.index_copy_(-1, self.ids, self.proj(hidden))
        if self.extra is not None:
            ids, rows, bias = self.extra
            out.index_copy_(-1, ids, F.linear(hidden, rows, bias))
        return out


def admit(model: nn.Module, token_ids: list[int]) -> int:
    """Admit a generation's prompt into this drafter's cut head, if it has one (else 0, nothing done)."""
    head = getattr(model, "lm_head", None)
    return head.admit(token_ids) if isinstance(head, CutHead) else 0


@lru_cache(maxsize=4)
def ranking(trio: str) -> tuple[int, ...]:
    path = VOCAB_DIR / f"{trio}.json"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in VOCAB_DIR.glob("*.json"))) or "none"
        raise ModelLoadError(f"--draft-vocab needs the target's token ranking, assets/vocab/{trio}.json, which "
                             f"does not exist (shipped for: {have}); build it with `python -m treegraft distill "
                             "vocab`, or use --draft-vocab 0")
    return tuple(json.loads(path.read_text())["ids"])


def full_head(model: nn.Module, vocab: int) -> nn.Linear | None:
    """The drafter's output head if it is an uncut Linear over the whole vocabulary, else None
    (prompt lookup has none; a layer-skip drafter ships its own cut head)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if get is not None else getattr(model, "lm_head", None)
    return head if isinstance(head, nn.Linear) and head.weight.shape[0] == vocab else None


def cut_head(model: nn.Module, ids: tuple[int, ...], keep: int, vocab: int, prompt: bool = True) -> bool:
    """Give this drafter a head of the first `keep` ranked ids (and, with `prompt`, each generation's
    prompt tokens), in place. False if it has no full head."""
    head = full_head(model, vocab)
    if head is None:
        return False
    if not 1 <= keep <= len(ids):
        raise ModelLoadError(f"--draft-vocab must be in [1, {len(ids)}] (the ranked tokens shipped) or 0, got {keep}")
    chosen = torch.tensor(sorted(ids[:keep]), dtype=torch.long)
    if int(chosen.max()) >= vocab:
        raise ModelLoadError(f"the token ranking has ids up to {int(chosen.max())} but the vocabulary has {vocab}: "
                             "it was built for another tokenizer")
    model.lm_head = CutHead(head, chosen, prompt)  # FeatureDrafter and HF causal LMs both call self.lm_head
    return True

"""Prompt lookup as a tree drafter (``ngram``): zero model cost, usable as the weak or the strong role.

For a context (the accepted sequence plus a node's tree path) it finds earlier occurrences of the
context's last n tokens (n = max_n .. 1) and proposes the tokens that followed them. Several
occurrences that continue differently become sibling branches. A token's score grows with the
length of the n-gram it continues (a longer match is stronger evidence) and with how often it did.
The mass given to all proposals is the chance that a match of that length continues correctly,
calibrated online on this very generation: after every step the drafter checks what its top proposal
would have been at each newly accepted position, per longest match n, and blends that hit rate with a
prior of 1 - 2^-n worth two observations (chat text rarely continues a 1-token match; code often
continues a 4-token one, and `--budget auto` then sends long chains only where they pay). The rest of
the mass is spread over the vocabulary as a flat floor. Tokens at the floor are "no opinion": draft.add_children never proposes
them, and graft never rescores with a row that has no proposal at all.

It plugs into the engine as a Runner whose "cache" is the token ids per slot: catch_up, forward_nodes,
commit and restore work unchanged, and each query reads exactly the tokens its tree mask lets it see.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers import PretrainedConfig

from .kv import Runner


class NgramDrafter(nn.Module):
    """Holds settings only; LookupRunner does the work (there are no weights)."""

    needs_features = False
    calibrated = True  # its scores are hit rates measured on this generation (LookupRunner.calibrate)

    def __init__(self, vocab_size: int, eos_token_id=None, max_n: int = 4, min_n: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = PretrainedConfig(vocab_size=vocab_size, eos_token_id=eos_token_id)
        self.max_n, self.min_n = max_n, min_n
        # Runner reads device and dtype from the first parameter; this one holds nothing.
        self.anchor = nn.Parameter(torch.empty(0, device=device, dtype=dtype), requires_grad=False)
        self.runner_cls = LookupRunner
        self.treegraft_label = f"ngram (prompt lookup, n={min_n}..{max_n})"


def propose(ctx: np.ndarray, max_n: int, min_n: int = 1) -> tuple[dict[int, float], int]:
    """Candidate next tokens for a context -> (score per token, longest matched n; 0 = none).
    An earlier occurrence that matches the context's last n tokens scores 4^j for every j <= n it
    matches (one longer match outweighs many shorter ones)."""
    scores: dict[int, float] = {}
    longest, last = 0, len(ctx) - 1
    seq = ctx.tolist()
    for i in np.flatnonzero(ctx[:-1] == ctx[-1]).tolist():   # occurrences of the last token, with a next token
        n = 1
        while n < max_n and i - n >= 0 and seq[i - n] == seq[last - n]:
            n += 1
        if n < min_n:
            continue
        longest = max(longest, n)
        tok = seq[i + 1]
        scores[tok] = scores.get(tok, 0.0) + sum(4.0 ** j for j in range(min_n, n + 1))
    return scores, longest


PRIOR_WEIGHT = 2.0  # observations the prior 1 - 2^-n is worth


def prior_mass(n: int) -> float:
    return 1.0 - 0.5 ** n


def lookup_logp(ctx: np.ndarray, vocab: int, max_n: int, min_n: int = 1,
                mass_by_n: dict[int, float] | None = None) -> torch.Tensor:
    """Log-probabilities over the vocabulary for the token after ctx; `mass_by_n` (calibrated) is the
    probability that a longest match of n continues correctly (default: the prior)."""
    return lookup_logps([ctx], vocab, max_n, min_n, mass_by_n)[0]


def lookup_logps(ctxs: list[np.ndarray], vocab: int, max_n: int, min_n: int = 1,
                 mass_by_n: dict[int, float] | None = None) -> torch.Tensor:
    """lookup_logp for several contexts at once, [len(ctxs), vocab]: one tensor filled in two writes,
    not a row each (a tree's rows cost ~50 us apiece that way, most of a strong call by prompt lookup)."""
    floors, rows, cols, probs = [], [], [], []
    for r, ctx in enumerate(ctxs):
        scores, longest = propose(ctx, max_n, min_n)
        if not scores:
            floors.append(-float(np.log(vocab)))
            continue
        mass = min(1.0 - 1e-6, max(1e-6, (mass_by_n or {}).get(longest, prior_mass(longest))))
        floors.append(float(np.log((1.0 - mass) / max(1, vocab - len(scores)))))
        total = sum(scores.values())
        rows += [r] * len(scores)
        cols += list(scores)
        probs += [v / total * mass for v in scores.values()]
    out = torch.tensor(floors)[:, None].repeat(1, vocab)
    if rows:
        out[rows, cols] = torch.log(torch.tensor(probs))
    return out


class LookupRunner(Runner):
    """A Runner whose cache holds token ids: a query sees the tokens of the slots its mask allows."""

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.n = 0
        self.slot: dict[int, int] = {}
        self.hidden = None
        self.scored = None                 # positions before this are calibrated (None: prompt not seen)
        self.hits: dict[int, int] = {}     # longest match n -> top proposal was the accepted token
        self.tries: dict[int, int] = {}

    def mass_by_n(self) -> dict[int, float]:
        return {n: (self.hits.get(n, 0) + PRIOR_WEIGHT * prior_mass(n)) / (self.tries.get(n, 0) + PRIOR_WEIGHT)
                for n in range(self.model.min_n, self.model.max_n + 1)}

    def calibrate(self, seq: list[int]) -> None:
        """Score what the top proposal would have been at each accepted position since the last call
        (the prompt itself is not scored: it is not what the target writes)."""
        if self.scored is None:
            self.scored = len(seq)
            return
        arr = np.asarray(seq, dtype=np.int64)
        for p in range(self.scored, len(seq)):
            scores, n = propose(arr[:p], self.model.max_n, self.model.min_n)
            if n:
                self.tries[n] = self.tries.get(n, 0) + 1
                self.hits[n] = self.hits.get(n, 0) + int(max(scores, key=scores.get) == seq[p])
        self.scored = len(seq)

    def root_match(self, seq: list[int]) -> int:
        """The longest n-gram the root's context matches earlier in it (0: none, so a call adds no
        proposal at the root); a lookup, no model time."""
        return propose(np.asarray(seq, dtype=np.int64), self.model.max_n, self.model.min_n)[1]

    def limit_context(self, tokens: int) -> None:
        """No window: looking up the whole context costs no model time, and the prompt is what it copies."""

    def catch_up(self, seq: list[int], nodes=(), tree=None) -> torch.Tensor:
        self.calibrate(seq)
        return super().catch_up(seq, nodes, tree)

    @property
    def cache_len(self) -> int:
        return len(self.tokens)

    def _forward(self, ids, positions, mask, feats=None, keep: int = 0) -> torch.Tensor:
        self.forwards += 1
        start = len(self.tokens)
        self.tokens += list(ids)
        every = np.asarray(self.tokens, dtype=np.int64)
        if mask is None:  # causal over the new tokens
            visible = [np.arange(start + r + 1) for r in range(len(ids))]
        else:
            seen = (mask[0, 0] == 0).cpu().numpy()
            visible = [np.flatnonzero(row) for row in seen]
        m, mass = self.model, self.mass_by_n()
        return lookup_logps([every[v] for v in visible[-keep:]], m.config.vocab_size, m.max_n, m.min_n, mass).to(self.device)

    def commit(self, path: list[int]) -> None:
        keep = list(range(self.n))
        for i in path:
            if i not in self.slot:
                break
            keep.append(self.slot[i])
        self.tokens = [self.tokens[k] for k in keep]
        self.n = len(keep)
        self.slot = {}

    def restore(self, n: int) -> None:
        self.tokens = self.tokens[:n]
        self.n = min(self.n, n)
        self.slot = {}

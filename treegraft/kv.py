"""Model plumbing for trees: one model, its KV cache, tree attention masks, keep-accepted-path.

Cache layout of a Runner during a step:  [ committed tokens (n) | tree slots of this step ... ]
``committed`` always ends just before the current root (the last accepted token, whose logits are
not known yet). ``catch_up`` feeds the missing accepted tokens including the root; ``forward_nodes``
appends tree nodes that attend to the committed prefix and to their own ancestors only;
``commit`` keeps the accepted path's slots and drops the rest.

A drafter's window (``limit_context``): a drafter may read only the last W tokens of the sequence it
first sees. Its cache then starts ``offset`` tokens in, and its positions count from there (RoPE only
sees relative positions, so the window reads as a shorter prompt). Its prefill, the one-time cost that
makes a first strong call dear, shrinks to W tokens; the target never has a window (it decides).

Features (treegraft.eagle): a Runner can keep its model's post-norm last hidden states, one row per
cache slot (``hidden``). The target keeps them when a drafter reads them; a feature drafter reads the
target's rows for committed tokens and its own predicted rows for tree nodes (a node reads its
parent's), so it runs a tree one level per forward and re-reads accepted tokens with real features.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .tree import ROOT, DraftTree


def tree_mask(prefix: list[int], tails: list[list[int]], kv_len: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Float additive mask [1, 1, q, kv_len]: row r may look at columns [0, prefix[r]) and at
    tails[r] (its tree ancestors' slots and its own), finfo.min elsewhere. Built in two tensor ops,
    not row by row: a few hundred prefix columns per row made the row loop ~0.4 ms a call on a CPU
    (a kernel launch per row on a GPU). Float, not bool: transformers' eager attention silently
    misreads a bool 4D mask."""
    cols = torch.arange(kv_len, device=device)
    see = cols[None, :] < torch.tensor(prefix, device=device)[:, None]
    rows = [r for r, tail in enumerate(tails) for _ in tail]
    if rows:
        see[rows, [c for tail in tails for c in tail]] = True
    zero, low = torch.zeros((), dtype=dtype, device=device), torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(see, zero, low)[None, None]


def make_runner(model: torch.nn.Module, name: str, features_from: "Runner | None" = None) -> "Runner":
    """A model may bring its own Runner class (the prompt-lookup drafter keeps token ids, not a KV cache)."""
    return getattr(model, "runner_cls", Runner)(model, name, features_from)


class Runner:
    """A causal LM plus the state needed to run it over a growing sequence and draft trees."""

    def __init__(self, model: torch.nn.Module, name: str = "model", features_from: "Runner | None" = None):
        self.model = model
        self.name = name
        self.needs_features = bool(getattr(model, "needs_features", False))
        if self.needs_features and features_from is None:
            raise ValueError(f"{name}: a feature drafter needs the target's Runner (features_from)")
        self.source = features_from if self.needs_features else None
        if self.source is not None:
            self.source.keep_features = True
        self.keep_features = self.needs_features  # a feature drafter keeps its own predicted rows
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.forwards = 0          # model calls: lets tests prove a decision costs no forward
        self.score_temperature = 1.0  # a drafter's logits are divided by it before scoring (GenConfig.temper)
        self.context = 0           # the most tokens of the first sequence it reads (0: all): limit_context
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.n = 0                  # committed tokens in the cache
        self.slot: dict[int, int] = {}  # tree node id -> cache index, this step only
        self.hidden: torch.Tensor | None = None  # [cache_len, H] when keep_features
        self.offset = 0             # sequence tokens before the cache's first one (a drafter's window)

    def limit_context(self, tokens: int) -> None:
        """Read at most the last `tokens` tokens of the sequence at the first catch-up (0: all)."""
        if tokens and self.needs_features:
            raise ValueError(f"{self.name}: a feature drafter reads the target's features at every "
                             "position and cannot take a context window")
        self.context = tokens

    def root_match(self, seq: list[int]) -> int | None:
        """What this drafter knows of the step's root without running: None for a model (it must run a
        forward to have an opinion). Prompt lookup overrides it (the n-gram it matches there)."""
        return None

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def _forward(self, ids: list[int], positions: list[int], mask: torch.Tensor | None,
                 feats: torch.Tensor | None = None, keep: int = 0) -> torch.Tensor:
        """Logits of the last `keep` rows (0: all). A prefill or a catch-up reads one row: the head over
        the others would be wasted (the 0.5B's 152k-wide head is a quarter of its per-token cost)."""
        self.forwards += 1
        kw = dict(position_ids=torch.tensor([positions], device=self.device), attention_mask=mask,
                  cache=self.cache, use_cache=True)
        input_ids = torch.tensor([ids], device=self.device)
        if self.needs_features:
            out = self.model(input_ids, feats[None], logits_to_keep=keep, **kw)
            logits, hidden = out.logits, out.hidden
        elif self.keep_features:
            out = self.model.get_decoder()(input_ids=input_ids, **kw)
            hidden = out.last_hidden_state
            logits = self.model.get_output_embeddings()(hidden[:, -keep:])
        else:
            out = self.model(input_ids=input_ids, logits_to_keep=keep, **kw)
            logits, hidden = out.logits, None
        self.cache = out.cache
        if hidden is not None:
            self.hidden = hidden[0] if self.hidden is None else torch.cat([self.hidden, hidden[0]])
        return logits[0].float()

    def features_for(self, start: int, count: int) -> torch.Tensor:
        """The source's (target's) features of positions start-1 .. start+count-2: what tokens at
        start .. start+count-1 read (zeros before position 0)."""
        src, need = self.source.hidden, start + count - 2
        have = 0 if src is None else src.shape[0]
        if need >= have:
            raise RuntimeError(f"{self.name}: the target has no feature for position {need} yet; "
                               "it must verify (or prefill) before its drafter reads it")
        rows = src[max(0, start - 1):need + 1].to(self.dtype) if need >= 0 else None
        if start > 0:
            return rows
        zero = torch.zeros(1, self.model.config.hidden_size, device=self.device, dtype=self.dtype)
        return zero if rows is None else torch.cat([zero, rows])

    def parent_features(self, tree: DraftTree, nodes: list[int]) -> torch.Tensor:
        """A tree node reads what this drafter predicted at its parent (the root: slot n-1)."""
        slots = [self.n - 1 if tree.nodes[i].parent == ROOT else self.slot[tree.nodes[i].parent] for i in nodes]
        return self.hidden[slots]

    def catch_up(self, seq: list[int], nodes: list[int] = (), tree: DraftTree | None = None) -> torch.Tensor:
        """Feed seq[n:] (at least the root) and, optionally, tree nodes in the same forward.
        Returns logits: row 0 is the root's (the last token of seq), then one row per node."""
        assert self.cache_len == self.n and not self.slot, "catch_up must start a step"
        if self.n == 0:
            self.offset = max(0, len(seq) - self.context) if self.context else 0
        seq = seq[self.offset:]
        new = list(seq[self.n:])
        if not new:
            raise RuntimeError(f"{self.name}: cache already holds the root token")
        base, q = self.n, len(new)
        if not nodes or self.needs_features:
            feats = self.features_for(base, q) if self.needs_features else None
            logits = self._forward(new, list(range(base, base + q)), None, feats, keep=1)  # plain causal
            self.n = len(seq)
            if not nodes:
                return logits[-1:]
            return torch.cat([logits[-1:], self.forward_levels(tree, nodes, self.offset + len(seq) - 1)])
        prefix, tails = [base + r + 1 for r in range(q)], [[] for _ in range(q)]  # causal over the catch-up tokens
        ids, positions = list(new), list(range(base, base + q))
        root_pos = len(seq) - 1
        for j, i in enumerate(nodes):
            self.slot[i] = len(seq) + j
        for i in nodes:
            node = tree.nodes[i]
            ids.append(node.token)
            positions.append(root_pos + node.depth)
            prefix.append(len(seq))
            tails.append([self.slot[a] for a in tree.path(i)])
        mask = tree_mask(prefix, tails, len(seq) + len(nodes), self.dtype, self.device)
        logits = self._forward(ids, positions, mask, keep=len(nodes) + 1)
        self.n = len(seq)
        return logits

    def forward_levels(self, tree: DraftTree, nodes: list[int], root_pos: int) -> torch.Tensor:
        """forward_nodes one depth at a time (a feature drafter's node needs its parent's output);
        logits rows in the order of `nodes`."""
        rows = {}
        for d in sorted({tree.nodes[i].depth for i in nodes}):
            level = [i for i in nodes if tree.nodes[i].depth == d]
            rows |= dict(zip(level, self.forward_nodes(tree, level, root_pos)))
        return torch.stack([rows[i] for i in nodes])

    def forward_nodes(self, tree: DraftTree, nodes: list[int], root_pos: int) -> torch.Tensor:
        """Append tree nodes whose ancestors are already cached (or in this batch; for a feature
        drafter, in an earlier forward); logits per node."""
        start, root_pos = self.cache_len, root_pos - self.offset
        for j, i in enumerate(nodes):
            self.slot[i] = start + j
        tails, ids, positions = [], [], []
        for i in nodes:
            node = tree.nodes[i]
            ids.append(node.token)
            positions.append(root_pos + node.depth)
            tails.append([self.slot[a] for a in tree.path(i)])
        mask = tree_mask([self.n] * len(nodes), tails, start + len(nodes), self.dtype, self.device)
        feats = self.parent_features(tree, nodes) if self.needs_features else None
        return self._forward(ids, positions, mask, feats)

    def commit(self, path: list[int]) -> None:
        """Keep the committed prefix plus the cached prefix of the accepted path, drop the rest.
        Nodes the drafter never ran on are simply not kept; the next catch_up feeds them. A feature
        drafter keeps none: its tree slots read predicted features, the real ones are known now."""
        tail = []
        for i in ([] if self.needs_features else path):
            if i not in self.slot:
                break
            tail.append(self.slot[i])
        if self.n + len(tail) < self.cache_len:
            for layer in self.cache.layers:
                # RoPE is applied before caching, so a kept slot's position stays valid.
                layer.keys = keep_rows(layer.keys, self.n, tail, -2)
                layer.values = keep_rows(layer.values, self.n, tail, -2)
            if self.hidden is not None:
                self.hidden = keep_rows(self.hidden, self.n, tail, 0)
        self.n += len(tail)
        self.slot = {}

    def mark(self) -> int:
        return self.n

    def restore(self, n: int) -> None:
        """Return to an earlier committed length: lets a step be replayed another way from the
        same state (the oracle policy, the app's what-if)."""
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys[..., :n, :]
                layer.values = layer.values[..., :n, :]
        if self.hidden is not None:
            self.hidden = self.hidden[:n]
        self.n = min(self.n, n)
        self.slot = {}


@torch.inference_mode()
def keep_rows(x: torch.Tensor, n: int, tail: list[int], dim: int) -> torch.Tensor:
    """x's first n rows along `dim`, then its rows `tail` (slots past n, increasing: an accepted path).
    The prefix stays where it is: only the tail moves into rows n.., in place, and the rest is sliced
    off. A gather of the whole cache (index_select) cost ~2 ms a step on SmolLM2's 30 layers."""
    if tail != list(range(n, n + len(tail))):
        moved = x.index_select(dim, torch.tensor(tail, device=x.device))  # a copy: reads before the write
        x.narrow(dim, n, len(tail)).copy_(moved)
    return x.narrow(dim, 0, n + len(tail))

"""A layer-skip drafter: a few decoder layers of a smaller LM of the target's family: model plumbing only.

A base LM that shares the target's tokenizer (Qwen2.5-Coder-0.5B for the 1.5B target) keeps its first
`bottom` and last `top` decoder layers; what lies between is skipped. A trained square `bridge` maps the
early residual stream to where the late layers expect it (a "tuned lens"), low-rank corrections (LoRA,
merged into copies of the late layers' weights at load time) adapt those layers to their new input, and
the output head is cut to the base's tied embedding rows of the most frequent tokens plus a trained
per-row bias. So the drafter costs a few of the base's layers plus a fraction of its head, and the
target still verifies over its full vocabulary: a token outside the head is never proposed, nothing
else changes (losslessness is untouched).

On disk (treegraft_drafter.json {"kind": "skip", "base": <model spec>, "bottom", "top", "rank"}):
model.safetensors with `bridge`, the LoRA factors `lora.<layer>.<proj>.a|b`, the kept layers' norms,
the final norm, `head.ids` and `head.bias`. Every other tensor is the base's, read at load time.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from .vocab import FLOOR

PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class RowsHead(nn.Module):
    """The tied head restricted to `ids`; full-vocabulary logits with FLOOR elsewhere."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor, vocab: int):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(len(ids), dtype=weight.dtype))
        self.register_buffer("ids", ids.long())
        self.vocab = vocab

    def small(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight.T + self.bias

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = h.new_full((*h.shape[:-1], self.vocab), FLOOR)
        return out.index_copy_(-1, self.ids, self.small(h))


class Bridged(nn.Module):
    """The first late layer, reading the early residual stream through the trained bridge."""

    def __init__(self, layer: nn.Module, hidden: int):
        super().__init__()
        self.layer = layer
        self.bridge = nn.Linear(hidden, hidden, bias=False)
        with torch.no_grad():
            self.bridge.weight.copy_(torch.eye(hidden))

    def forward(self, hidden_states, *args, **kw):
        return self.layer(self.bridge(hidden_states), *args, **kw)


class Lora(nn.Module):
    """A frozen linear plus a trainable low-rank correction (b starts at zero: training starts from the base)."""

    def __init__(self, base: nn.Linear, rank: int):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features, dtype=base.weight.dtype) / base.in_features ** 0.5)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))

    def forward(self, x):
        return self.base(x) + (x @ self.a.T) @ self.b.T

    def merged(self) -> nn.Linear:
        out = copy.deepcopy(self.base)
        with torch.no_grad():
            out.weight += self.b @ self.a
        return out


def _get(module: nn.Module, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _set(module: nn.Module, dotted: str, value: nn.Module) -> None:
    parent, _, name = dotted.rpartition(".")
    setattr(_get(module, parent) if parent else module, name, value)


def kept_layers(n_base: int, bottom: int, top: int) -> list[int]:
    if bottom < 1 or top < 1 or bottom + top > n_base:
        raise ValueError(f"a skip drafter keeps at least one early and one late layer of the base's {n_base}; "
                         f"got bottom={bottom}, top={top}")
    return list(range(bottom)) + list(range(n_base - top, n_base))


def build(base: nn.Module, bottom: int, top: int, ids: torch.Tensor, rank: int = 0) -> nn.Module:
    """A causal LM of copies of the base's kept layers (layer indices renumbered), the bridge before the first
    late layer, LoRA (rank > 0: trainable) on the late layers' projections, and the truncated head."""
    cfg = copy.deepcopy(base.config)
    keep = kept_layers(cfg.num_hidden_layers, bottom, top)
    vocab = cfg.vocab_size
    ids = ids.long()
    cfg.num_hidden_layers = len(keep)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"] * len(keep)
    for attr in ("quantization_config", "use_sliding_window"):
        if hasattr(cfg, attr):
            setattr(cfg, attr, None if attr == "quantization_config" else False)
    cfg.tie_word_embeddings = False
    # The real embedding is assigned below: no throwaway 150k-row tensors (and no padding row in them).
    cfg.vocab_size, pad, cfg.pad_token_id = 1, cfg.pad_token_id, None
    model = AutoModelForCausalLM.from_config(cfg, dtype=base.dtype)
    model.config.vocab_size, model.config.pad_token_id = vocab, pad
    src = base.get_decoder()
    dec = model.get_decoder()
    dec.embed_tokens = copy.deepcopy(src.embed_tokens).requires_grad_(False)
    for i, j in enumerate(keep):
        dec.layers[i].load_state_dict(src.layers[j].state_dict())
    dec.norm.load_state_dict(src.norm.state_dict())
    model.lm_head = RowsHead(src.embed_tokens.weight.detach()[ids].clone(), ids, vocab)
    for p in model.parameters():
        p.requires_grad_(False)
    if rank > 0:
        for i in range(bottom, len(keep)):
            for name in PROJ:
                _set(dec.layers[i], name, Lora(_get(dec.layers[i], name), rank))
    dec.layers[bottom] = Bridged(dec.layers[bottom], cfg.hidden_size)
    model.skip_bottom = bottom
    return model.eval()


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """What training changes and the asset stores: bridge, LoRA factors, the kept layers' norms, final norm,
    head bias."""
    out = {}
    for n, p in model.named_parameters():
        late = n.startswith("model.layers.") and int(n.split(".")[2]) >= model.skip_bottom
        if n in ("model.norm.weight", "lm_head.bias") or late and n.endswith((".a", ".b", "bridge.weight",
                                                                               "layernorm.weight")):
            out[n] = p.requires_grad_(True)
    return out


def merge(model: nn.Module) -> nn.Module:
    """Fold every LoRA into a plain Linear (inference: no extra matmuls)."""
    for name, mod in list(model.named_modules()):
        if isinstance(mod, Lora):
            _set(model, name, mod.merged())
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def load(stored: dict[str, torch.Tensor], info: dict, base: nn.Module) -> nn.Module:
    """A skip drafter from its stored tensors and the loaded base model."""
    model = build(base, info["bottom"], info["top"], stored["lm_head.ids"], info.get("rank", 0))
    own = trainable(model)
    missing = [n for n in own if n not in stored]
    if missing:
        raise ValueError(f"a skip drafter lacks tensors: {missing[:5]}")
    with torch.no_grad():
        for n, p in own.items():
            p.copy_(stored[n].to(p.dtype))
    return merge(model)

"""A drafter that reads the target's features (EAGLE-style): model plumbing only.

The target's *feature* at position j is its last hidden state after the final norm, the vector its LM
head turns into the logits for token j+1. A feature drafter sees, at position j, the embedding of token
j and the feature of position j-1, fuses them with one linear layer, runs a small Llama decoder, and
predicts the feature of position j; the target's own LM head turns that into next-token logits.

Inside a draft tree there is no target feature yet: a node at depth d reads the feature its drafter
predicted at its parent. So a feature drafter runs a tree level by level (kv.Runner does that), and
after verification it re-reads the accepted tokens with the target's real features (kv.Runner.commit
drops its tree slots).

On disk: config.json (the decoder's LlamaConfig), model.safetensors (fc + decoder layers + norm only)
and treegraft_drafter.json {"kind": "features", "share_target_embeddings": true}: the embedding and the
head are the target's tensors, shared in memory at load time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel


@dataclass
class FeatureOutput:
    logits: torch.Tensor   # [b, q, vocab]
    hidden: torch.Tensor   # [b, q, H]: the predicted target features
    cache: object


class FeatureDrafter(nn.Module):
    needs_features = True

    def __init__(self, config: LlamaConfig, target: nn.Module):
        super().__init__()
        h = config.hidden_size
        if h != target.config.hidden_size:
            raise ValueError(f"a feature drafter's hidden size must equal the target's ({target.config.hidden_size}), "
                             f"got {h}")
        self.config = config
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.model = LlamaModel(config)
        # Shared, not copied: the target's embedding and head (frozen while training).
        self.model.embed_tokens = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()

    def trainable(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.named_parameters()
                if not n.startswith(("model.embed_tokens.", "lm_head."))}

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, position_ids=None, attention_mask=None,
                cache=None, use_cache: bool = False, logits: bool = True, logits_to_keep: int = 0) -> FeatureOutput:
        """features[:, j] is the target's (or this drafter's predicted) feature of the position before
        input_ids[:, j]; zeros where there is none (the first token)."""
        x = self.fc(torch.cat([self.model.embed_tokens(input_ids), features.to(self.fc.weight.dtype)], -1))
        out = self.model(inputs_embeds=x, position_ids=position_ids, attention_mask=attention_mask,
                         cache=cache, use_cache=use_cache)
        h = out.last_hidden_state
        return FeatureOutput(self.lm_head(h[:, -logits_to_keep:]) if logits else None, h, out.cache)


def target_features(target: nn.Module, input_ids: torch.Tensor, **kw) -> tuple[torch.Tensor, object]:
    """The target's post-norm last hidden states (what its head reads) and the model output."""
    out = target.get_decoder()(input_ids=input_ids, **kw)
    return out.last_hidden_state, out


def target_config(target: nn.Module, **over) -> LlamaConfig:
    """The target's LlamaConfig without what ties it to its files, with `over` applied: the base
    every drafter design built on the target's vocabulary starts from."""
    cfg = target.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
              "dtype", "layer_types", "architectures"):
        cfg.pop(k, None)
    cfg.update(over)
    return LlamaConfig(**cfg)


def feature_config(target: nn.Module, layers: int = 1) -> LlamaConfig:
    return target_config(target, num_hidden_layers=layers, tie_word_embeddings=False)


def build(target: nn.Module, layers: int = 1, seed: int = 0) -> FeatureDrafter:
    """A fresh feature drafter for `target`; its final norm starts as the target's (same feature scale)."""
    torch.manual_seed(seed)
    model = FeatureDrafter(feature_config(target, layers), target)
    with torch.no_grad():
        model.model.norm.weight.copy_(target.get_decoder().norm.weight)
    return model.to(next(target.parameters()).dtype)

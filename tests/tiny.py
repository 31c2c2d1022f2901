"""Tiny randomly initialised Llama trios built from configs: pure logic, milliseconds per forward."""

import copy
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from treegraft import eagle
from treegraft.fastpath import pack_models
from treegraft.lookup import NgramDrafter
from treegraft.models import Trio

# scripts/gpu_check.sh runs the suite with TREEGRAFT_TEST_DEVICE=cuda: same tests, GPU path.
DEVICE = torch.device(os.environ.get("TREEGRAFT_TEST_DEVICE", "cpu"))


def ids(tokens) -> torch.Tensor:
    return torch.tensor([list(tokens)], device=DEVICE)


def tiny_llama(seed: int, vocab: int = 96, hidden: int = 32, layers: int = 2, heads: int = 4, kv: int = 2,
               ctx: int = 256, sharpen: float = 8.0) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                      max_position_embeddings=ctx, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                      attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval().to(DEVICE)
    # Sharpen the output so greedy paths are long and agreement among relatives is meaningful.
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def perturbed(model, scale: float, seed: int):
    """A drafter that agrees with `model` often but not always."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device) * scale * p.std().clamp_min(1e-3))
    return other


def tiny_trio(weak="perturbed", strong="copy", vocab=96, seed=0, ctx=256, sharpen=8.0, kernels="stock") -> Trio:
    target = tiny_llama(seed, vocab=vocab, ctx=ctx, sharpen=sharpen)
    makers = {"copy": lambda s: copy.deepcopy(target),
              "perturbed": lambda s: perturbed(target, 0.5, s),
              "random": lambda s: tiny_llama(100 + s, vocab=vocab, hidden=16, layers=1, ctx=ctx),
              # reads the target's hidden states (treegraft.eagle); random weights, same logic
              "features": lambda s: eagle.build(target, layers=1, seed=200 + s).to(DEVICE).eval(),
              "ngram": lambda s: NgramDrafter(vocab, device=DEVICE)}  # prompt lookup, no weights
    trio = Trio(target, makers[weak](1), makers[strong](2), None, DEVICE, torch.float32,
                {"target": "tiny", "weak": weak, "strong": strong}, kernels=kernels)
    if kernels == "packed":
        pack_models([trio.target, trio.weak, trio.strong])
    return trio

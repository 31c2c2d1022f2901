"""int8 drafters on CPU: a drafter's Linear layers run as dynamically quantized int8 products (fbgemm).

Why: on a CPU a drafter's forward is bound by reading its weights, and int8 weights are a quarter of
fp32's. With Qwen2.5-Coder-0.5B as the 1.5B's strong drafter on a 2-core AVX2 machine, its seconds
per target forward fell 36-48% at the same tau (scripts/variant_bench.py, README). A drafter
only proposes tokens; the target, which decides every one, is never quantized, so output stays
token-identical to the target's own greedy decoding. What int8 can cost is acceptance.

The MLP's down projection stays fp32: its input (after the gated activation) carries the few huge
activations LLMs are known for, and the fbgemm kernel quantizes a whole activation row with one
scale, which flattens everything else in that row. On 800 tokens of code and prose, the 0.5B's top-1
agreement with the 1.5B target is 0.788 in fp32, 0.721 with every Linear in int8, 0.770 with all but
the down projections, 0.735 with the down projections alone (scripts/int8_agreement.py). Weights are
quantized per output channel.

Only a standalone drafter can be quantized: one that shares a module with the target (a layer-skip
drafter runs the target's own layers; a distilled drafter shares its head) would quantize the target
too. CPU only: fbgemm has no CUDA kernels, and on a GPU the drafters run in bf16 anyway.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .errors import ModelLoadError

# Linear layers left in fp32 (by name suffix): see the module docstring.
KEEP_FP32 = ("down_proj",)


def int8_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines or "x86" in torch.backends.quantized.supported_engines


def shares_weights(model: nn.Module, other: nn.Module) -> bool:
    mine = {id(p) for p in model.parameters()} | {id(b) for b in model.buffers()}
    return any(id(p) in mine for p in other.parameters())


def quantize_drafter(model: nn.Module, target: nn.Module, role: str) -> int:
    """Quantize this drafter's Linears (all but KEEP_FP32) to dynamic int8, in place. Returns the count."""
    if not int8_available():
        raise ModelLoadError("int8 drafters need PyTorch's fbgemm/x86 quantized engine, which this build lacks")
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu" or first.dtype != torch.float32:
        where = "no weights" if first is None else f"{first.device.type} {str(first.dtype).replace('torch.', '')}"
        raise ModelLoadError(f"--int8 quantizes fp32 drafters on the CPU only; the {role} drafter is {where} "
                             "(on a GPU use --dtype bfloat16)")
    if shares_weights(model, target):
        raise ModelLoadError(f"the {role} drafter shares weights with the target (a layer-skip or distilled "
                             "drafter): quantizing it would change the target's own layers or copy the shared "
                             "ones; --int8 takes a standalone drafter such as qwen-coder-0.5b")
    names = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and not n.endswith(KEEP_FP32)}
    if not names:
        raise ModelLoadError(f"the {role} drafter has no Linear layer to quantize")
    quantize_linears(model, names)
    model.treegraft_int8 = len(names)
    return len(names)


def quantize_linears(model: nn.Module, names) -> None:
    """These named Linears of the model become dynamic int8 (per-channel weights), in place; no checks."""
    engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
    torch.backends.quantized.engine = engine
    spec = {n: torch.ao.quantization.per_channel_dynamic_qconfig for n in names}
    with warnings.catch_warnings():
        # torch.ao.quantization is marked deprecated in favour of torchao, which is not installed here;
        # its dynamic int8 Linear is still PyTorch's own CPU kernel.
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)

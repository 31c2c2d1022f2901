"""int8 drafters (treegraft.quantize): the drafter's Linears but the MLP's down projection become
dynamic int8, the target is untouched so every method stays token-identical to its greedy decoding,
and drafters that share weights with the target, or that are not fp32 on the CPU, are refused."""

import copy

import pytest
import torch
from torch import nn

from tiny import DEVICE, ids, tiny_llama, tiny_trio
from treegraft import quantize
from treegraft.engine import Engine, GenConfig
from treegraft.errors import ModelLoadError
from treegraft.fastpath import pack_models, packing_available

pytestmark = [pytest.mark.skipif(not quantize.int8_available(), reason="this torch has no fbgemm/x86 engine"),
              pytest.mark.skipif(DEVICE.type != "cpu", reason="int8 drafters run on the CPU only")]


def linears(model):
    return {n: type(m) for n, m in model.named_modules() if n.endswith(("_proj", "lm_head"))}


def test_all_linears_but_down_proj_become_int8_and_the_drafter_still_agrees():
    target = tiny_llama(0)
    drafter = copy.deepcopy(target)
    x = ids([5, 17, 33, 2, 9, 40, 41])
    with torch.inference_mode():
        ref = drafter(x).logits
    count = quantize.quantize_drafter(drafter, target, "strong")
    kinds = linears(drafter)
    assert count == sum(not n.endswith("down_proj") for n in kinds) and drafter.treegraft_int8 == count
    assert all((k is nn.Linear) == n.endswith("down_proj") for n, k in kinds.items()), kinds
    assert all(k is nn.Linear for k in linears(target).values())      # the target is not touched
    with torch.inference_mode():
        out = drafter(x).logits
    assert out.shape == ref.shape and not torch.equal(out, ref)       # really another kernel
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.7   # and still nearly the same model


@pytest.mark.parametrize("kernels", ["stock", "packed"])
def test_int8_strong_drafter_keeps_greedy_token_identical(kernels):
    if kernels == "packed" and not packing_available():
        pytest.skip("this torch has no oneDNN")
    trio = tiny_trio("ngram", "perturbed")
    quantize.quantize_drafter(trio.strong, trio.target, "strong")
    if kernels == "packed":
        pack_models([trio.target, trio.strong])                       # down_proj is packed, the int8 ones kept
        trio.kernels = "packed"
    for prompt in ([5, 17, 33, 2, 9], [40, 41, 42, 43, 44, 40, 41]):
        with torch.inference_mode():
            ref = trio.target.generate(ids(prompt), max_new_tokens=20, do_sample=False, min_new_tokens=0)
        ref = ref[0, len(prompt):].tolist()
        for method, policy in (("tree-strong", "always"), ("treegraft", "always"), ("treegraft", "when-empty")):
            engine = Engine(trio, GenConfig(method=method, policy=policy, max_new_tokens=20, budget=16, depth=5))
            records = list(engine.generate(prompt))
            assert engine.new_tokens == ref, (method, policy)
            if method == "tree-strong":
                assert sum(r.forwards["strong"] for r in records) > 0    # the int8 drafter really drafted


def test_a_drafter_sharing_the_targets_weights_is_refused():
    trio = tiny_trio("perturbed", "features")                          # shares the target's head
    with pytest.raises(ModelLoadError, match="shares weights with the target"):
        quantize.quantize_drafter(trio.strong, trio.target, "strong")
    assert all(k is nn.Linear for k in linears(trio.target).values())


def test_only_fp32_cpu_drafters_are_quantized():
    target = tiny_llama(0)
    half = copy.deepcopy(target).to(torch.bfloat16)
    with pytest.raises(ModelLoadError, match="fp32 drafters on the CPU only.*bfloat16"):
        quantize.quantize_drafter(half, target, "weak")
    with pytest.raises(ModelLoadError, match="no Linear"):
        quantize.quantize_drafter(nn.Sequential(nn.LayerNorm(4)), target, "weak")


def test_load_trio_checks_its_int8_argument_before_loading():
    from treegraft.models import load_trio
    with pytest.raises(ModelLoadError, match="int8 must be one of none, weak, strong, both"):
        load_trio(int8="target")


def test_prompt_lookup_has_nothing_to_quantize():
    from treegraft.models import load_trio
    with pytest.raises(ModelLoadError, match="prompt lookup, which has no weights"):
        load_trio(weak="ngram", int8="weak", dtype="float32", device="cpu")
    with pytest.raises(ModelLoadError, match="shares weights with the target"):
        load_trio(int8="strong", dtype="float32", device="cpu")                   # the shipped distilled drafter shares the head


def test_variant_bench_table_pools_against_the_same_prompts_ar():
    """scripts/variant_bench.py: tokens/s over ar pooled over the prompts each drafter ran, outputs checked
    against ar's, and the int8 / fp32 ratio over the prompts both ran."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("variant_bench", "scripts/variant_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    def row(p, m, d, wall, out=(1, 2, 3, 4), forwards=4, strong=0.0, calls=0):
        return {"prompt": p, "method": m, "drafter": d, "new_tokens": 4, "target_forwards": forwards,
                "wall_s": wall, "strong_s": strong, "strong_calls": calls, "output": list(out)}
    rows = [row("a", "ar", "fp32", 4.0), row("b", "ar", "fp32", 4.0),
            row("a", "treegraft:always", "fp32", 2.0, forwards=2, strong=1.0, calls=2),
            row("b", "treegraft:always", "fp32", 2.0, forwards=2, strong=1.0, calls=2),
            row("a", "treegraft:always", "int8", 1.0, forwards=2, strong=0.5, calls=2),
            row("b", "treegraft:always", "int8", 1.0, out=(9,), forwards=2, strong=0.5, calls=1)]
    text = mod.table(rows, ["ar", "treegraft:always"])
    assert "| treegraft:always | fp32 | 2 | 2.000 | 2.00 | 0.500 | 100% | 2/2 |" in text
    assert "| treegraft:always | int8 | 2 | 4.000 | 2.00 | 0.250 | 75% | 1/2 |" in text
    assert "int8 / fp32 tokens/s = 2.000 over 2 prompts" in text


def test_a_trio_with_an_int8_strong_drafter_plays_the_arm_chosen_for_it(tmp_path):
    """`scheduler choose` on an int8 validation run keeps its arm beside the fp32 drafters' one: the
    engine plays the int8 arm only when its strong drafter is int8, and stays greedy either way."""
    import json
    from treegraft.schedule import ASSETS
    art = json.loads((ASSETS / "scheduler" / "qwen-coder" / "ngram+qwen-coder-0.5b" / "scheduler.json").read_text())
    art.pop("arm_hardware", None)  # a machine-class arm would come before the default one on this class
    arm = lambda name: {"arm": name, "rates": {"gain": 1.0, name: 2.0}, "prompts": 1}
    (tmp_path / "s.json").write_text(json.dumps(art | {"arm": arm("never"), "arm_int8": {"strong": arm("always")}}))
    trio = tiny_trio("ngram", "perturbed")
    prompt = [40, 41, 42, 43, 44, 40, 41]
    with torch.inference_mode():
        ref = trio.target.generate(ids(prompt), max_new_tokens=20, do_sample=False, min_new_tokens=0)[0, len(prompt):].tolist()
    cfg = GenConfig(method="treegraft", policy="learned", scheduler_path=str(tmp_path / "s.json"), max_new_tokens=20,
                    budget=16, depth=5)
    for int8, played in (("none", "never"), ("strong", "always")):
        if int8 == "strong":
            quantize.quantize_drafter(trio.strong, trio.target, "strong")
            trio.int8 = "strong"
        engine = Engine(trio, copy.deepcopy(cfg))
        records = list(engine.generate(prompt))
        assert engine.policy.arm == played and engine.new_tokens == ref
        assert all(f"arm '{played}'" in r.decision["reason"] for r in records if r.decision)
        assert (sum(r.forwards["strong"] for r in records) > 0) == (played == "always")

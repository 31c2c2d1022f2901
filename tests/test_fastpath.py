"""The CPU fast path: prepacked fp32 Linear layers give the same logits (within float noise) and
token-identical greedy decoding, drop the dense copy, and are chosen only where they can run."""

import json

import pytest
import torch
from torch import nn

from tiny import ids, tiny_trio
from treegraft import fastpath
from treegraft.engine import Engine, GenConfig

pytestmark = pytest.mark.skipif(not fastpath.packing_available(), reason="this torch has no oneDNN")


def test_packed_linear_matches_stock_and_drops_the_dense_weight():
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    x = torch.randn(1, 7, 64)
    with torch.inference_mode():
        ref = lin(x)
        fastpath.pack_linear(lin)
        out = lin(x)
    assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-4)
    assert lin.weight.numel() == 0 and lin.weight.dtype == torch.float32
    with pytest.raises(RuntimeError, match="inference only"):
        lin(x)  # grad mode: packed weights do not train


def test_dual_layout_matches_stock_one_row_and_many():
    torch.manual_seed(1)
    lin = nn.Linear(64, 96)
    xs = [torch.randn(1, 1, 64), torch.randn(1, 5, 64), torch.randn(3, 64)]
    with torch.inference_mode():
        refs = [lin(x) for x in xs]
        general, row = fastpath.pack_linear(lin, dual=True)
        assert row is not None and general is not None
        for x, ref in zip(xs, refs):
            assert torch.allclose(lin(x), ref, atol=1e-4)


def test_tied_weights_stay_dense_and_shared_linears_pack_once():
    trio = tiny_trio("copy", "perturbed")
    emb = trio.target.model.embed_tokens
    trio.target.lm_head.weight = emb.weight           # tie, like SmolLM2
    twin = nn.Linear(32, 64, bias=False)
    other = nn.Linear(32, 64, bias=False)
    other.weight = twin.weight                        # two Linears, one tensor
    fastpath.pack_models([trio.target, trio.weak, twin, other])
    assert emb.weight.numel() > 0 and trio.target.lm_head.treegraft_packed
    assert twin.packed_weight is other.packed_weight
    assert twin.packed_weight[1] is None               # no one-row copy unless asked


@pytest.mark.parametrize("roles", [("perturbed", "copy"), ("random", "features"), ("ngram", "perturbed")])
def test_packed_kernels_keep_greedy_token_identical(roles):
    stock, packed = tiny_trio(*roles), tiny_trio(*roles, kernels="packed")
    for prompt in ([5, 17, 33, 2, 9], [40, 41, 42, 43, 44]):
        ref = stock.target.generate(ids(prompt), max_new_tokens=25, do_sample=False, min_new_tokens=0)
        ref = ref[0, len(prompt):].tolist()
        for method in ("ar", "tree-weak", "tree-strong", "treegraft"):
            engine = Engine(packed, GenConfig(method=method, policy="always", max_new_tokens=25, budget=16, depth=5))
            list(engine.generate(prompt))
            assert engine.new_tokens == ref, method


def test_padded_rows_give_the_unpadded_outputs():
    """A Linear told to run 1-3 rows at more rows returns exactly the rows it was given, with
    their values, whatever the input's leading shape."""
    torch.manual_seed(3)
    lin = nn.Linear(64, 96)
    xs = [torch.randn(1, 1, 64), torch.randn(1, 2, 64), torch.randn(3, 64), torch.randn(2, 1, 64), torch.randn(1, 7, 64)]
    with torch.inference_mode():
        refs = [lin(x) for x in xs]
        fastpath.pack_linear(lin, dual=True)
        lin.treegraft_pad = {1: 4, 2: 6, 3: 5}
        for x, ref in zip(xs, refs):
            out = lin(x)
            assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-4)


def test_pads_from_takes_the_fastest_padded_count_only_past_the_margin():
    us = 1e-6
    seconds = {"1": 100 * us, "1 row": 70 * us, "2": 120 * us, "3": 85 * us, "4": 80 * us, "5": 81 * us, "6": 60 * us}
    for m in range(1, 6):
        for p in range(m + 1, 7):
            seconds[f"pad {m}>{p}"] = 5 * us
    # 1 row: the one-row layout's 70 beats 60 + 5 by less than 10%; 2, 3, 4, 5 -> 6 (65 against 120, 85, 80, 81)
    assert fastpath.pads_from(seconds) == {2: 6, 3: 6, 4: 6, 5: 6}
    seconds["pad 2>6"] = 60 * us       # padding that costs more than it saves is not taken
    assert fastpath.pads_from(seconds)[2] == 4  # 80 + 5 against 6 rows at 60 + 60
    assert fastpath.pads_from({"1": 1.0, "2": 1.0}) == {}  # nothing measured for padding: rows run as they come


def test_row_pads_are_measured_once_per_shape_and_keep_greedy_token_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))
    trio = tiny_trio("perturbed", "copy", kernels="packed")
    pads = fastpath.set_row_pads([trio.target, trio.weak, trio.strong], torch.float32)
    cached = json.loads((tmp_path / "kernels.json").read_text())
    assert len(cached) == len(pads) and all(k.endswith("|row pads") for k in cached)
    assert all(set(e["seconds"]) >= {"1", "1 row", "8", "pad 1>2"} for e in cached.values())
    for e in cached.values():
        e["pads"] = {"1": 4, "2": 6, "3": 5}   # a cached verdict is read, not remeasured: force padding
    (tmp_path / "kernels.json").write_text(json.dumps(cached))
    fastpath.set_row_pads([trio.target, trio.weak, trio.strong], torch.float32)
    assert trio.target.lm_head.treegraft_pad == {1: 4, 2: 6, 3: 5}
    stock = tiny_trio("perturbed", "copy")
    for prompt in ([5, 17, 33, 2, 9], [40, 41, 42, 43, 44]):
        ref = stock.target.generate(ids(prompt), max_new_tokens=25, do_sample=False, min_new_tokens=0)
        ref = ref[0, len(prompt):].tolist()
        for method in ("ar", "tree-weak", "treegraft"):
            engine = Engine(trio, GenConfig(method=method, policy="always", max_new_tokens=25, budget=16, depth=5))
            list(engine.generate(prompt))
            assert engine.new_tokens == ref, method


def test_kernel_choice_is_validated_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="unknown kernels"):
        fastpath.choose_kernels("fast", cpu, torch.float32, (64, 64))
    monkeypatch.setattr(fastpath, "cpu_has_bf16", lambda: False)
    with pytest.raises(ValueError, match="native bf16"):
        fastpath.choose_kernels("packed", cpu, torch.bfloat16, (64, 64))
    with pytest.raises(ValueError, match="float16"):
        fastpath.choose_kernels("packed", cpu, torch.float16, (64, 64))
    assert fastpath.choose_kernels("auto", cpu, torch.bfloat16, (64, 64)) == "stock"  # emulated bf16: never packed
    assert not (tmp_path / "kernels.json").exists()
    choice = fastpath.choose_kernels("auto", cpu, torch.float32, (256, 128))
    cached = json.loads((tmp_path / "kernels.json").read_text())
    (entry,) = cached.values()
    assert choice == entry["choice"] in ("stock", "packed") and entry["stock_s"] > 0 and entry["packed_s"] > 0
    entry["choice"] = "stock" if choice == "packed" else "packed"   # a cached verdict is reused, not remeasured
    (tmp_path / "kernels.json").write_text(json.dumps({k: entry for k in cached}))
    assert fastpath.choose_kernels("auto", cpu, torch.float32, (256, 128)) == entry["choice"]


def test_default_trio_packed_matches_stock_greedy(default_trio, chat_ids):
    """The real default trio with the fast path on: every method token-identical to the target's
    own greedy decoding (HF generate on the stock fp32 model)."""
    from treegraft.models import load_trio
    packed = load_trio(dtype="float32", kernels="packed")
    assert packed.kernels == "packed"
    for text in ["What is the capital of France?", "Write a Python function that reverses a string."]:
        prompt = chat_ids(text)
        ref = default_trio.target.generate(ids(prompt), max_new_tokens=20, do_sample=False, min_new_tokens=0)
        ref = ref[0, len(prompt):].tolist()
        for method in ("ar", "tree-weak", "treegraft"):
            engine = Engine(packed, GenConfig(method=method, policy="always", max_new_tokens=20))
            list(engine.generate(prompt))
            assert engine.new_tokens == ref, (method, text)


needs_bf16 = pytest.mark.skipif(not fastpath.cpu_has_bf16(), reason="this CPU has no native bf16")


@needs_bf16
def test_bf16_packed_linear_matches_stock_bf16():
    torch.manual_seed(2)
    lin = nn.Linear(64, 96, dtype=torch.bfloat16)
    xs = [torch.randn(1, 1, 64, dtype=torch.bfloat16), torch.randn(1, 6, 64, dtype=torch.bfloat16)]
    with torch.inference_mode():
        refs = [lin(x).float() for x in xs]
        fastpath.pack_linear(lin, dual=True)
        for x, ref in zip(xs, refs):
            out = lin(x)
            assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), ref, atol=3e-2, rtol=2e-2)
        with pytest.raises(RuntimeError, match="bfloat16 CPU inference only"):
            lin(xs[0].float())  # a packed bf16 Linear never silently casts fp32 input


@needs_bf16
def test_bf16_kernel_choice_is_measured_and_cached_apart_from_fp32(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRAFT_HOME", str(tmp_path))
    cpu = torch.device("cpu")
    assert fastpath.choose_kernels("packed", cpu, torch.bfloat16, (64, 64)) == "packed"
    fastpath.choose_kernels("auto", cpu, torch.float32, (256, 128))
    choice = fastpath.choose_kernels("auto", cpu, torch.bfloat16, (256, 128))
    cached = json.loads((tmp_path / "kernels.json").read_text())
    keys = sorted(cached)
    assert len(keys) == 2 and sum(k.endswith("|bfloat16") for k in keys) == 1
    assert cached[next(k for k in keys if k.endswith("|bfloat16"))]["choice"] == choice


@needs_bf16
def test_bf16_packed_tiny_target_decodes_like_stock_bf16():
    """Packing changes only the kernels: a sharpened tiny target in bf16 decodes greedily to the same
    tokens packed and stock (bf16 is not bit-exact against fp32, so the comparison stays in bf16)."""
    stock = tiny_trio("perturbed", "copy")
    stock.target.to(torch.bfloat16)
    packed = tiny_trio("perturbed", "copy")
    packed.target.to(torch.bfloat16)
    fastpath.pack_models([packed.target])
    for prompt in ([5, 17, 33, 2, 9], [40, 41, 42, 43, 44]):
        ref = stock.target.generate(ids(prompt), max_new_tokens=20, do_sample=False, min_new_tokens=0)
        out = packed.target.generate(ids(prompt), max_new_tokens=20, do_sample=False, min_new_tokens=0)
        assert out.tolist() == ref.tolist()

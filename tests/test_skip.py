"""The layer-skip drafter's plumbing (treegraft.skip) on a tiny random Qwen2: a cut that keeps every layer
with an identity bridge and the full head is the base itself; LoRA merges exactly; the truncated head
never proposes a token outside it."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from treegraft import skip


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).eval()


IDS = torch.tensor([[3, 50, 7, 7, 99, 12, 0, 64]])


@torch.no_grad()
def test_keeping_every_layer_is_the_base(base):
    cut = skip.build(base, 2, 2, torch.arange(120), rank=4)
    torch.testing.assert_close(cut(input_ids=IDS).logits, base(input_ids=IDS).logits)


@torch.no_grad()
def test_lora_merges_exactly_and_only_late_layers_train(base):
    cut = skip.build(base, 1, 2, torch.arange(120), rank=4)
    params = skip.trainable(cut)
    assert params and all(n.startswith(("model.layers.1.", "model.layers.2.", "model.norm", "lm_head.bias"))
                          for n in params)
    for n, p in params.items():
        p.add_(torch.randn_like(p) * 0.1)
    before = cut(input_ids=IDS).logits
    after = skip.merge(cut)(input_ids=IDS).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    assert not (before - base(input_ids=IDS).logits).abs().max() < 1e-3  # it is a different model now


@torch.no_grad()
def test_truncated_head_proposes_only_its_rows(base):
    rows = torch.tensor([4, 9, 30, 77])
    logits = skip.build(base, 1, 1, rows)(input_ids=IDS).logits
    assert set(logits.argmax(-1).flatten().tolist()) <= set(rows.tolist())
    outside = torch.ones(120, dtype=torch.bool)
    outside[rows] = False
    assert (logits[..., outside] == skip.FLOOR).all()


def test_a_cut_keeps_at_least_one_early_and_one_late_layer(base):
    with pytest.raises(ValueError, match="at least one early and one late"):
        skip.build(base, 0, 2, torch.arange(120))
    with pytest.raises(ValueError, match="at least one early and one late"):
        skip.build(base, 3, 2, torch.arange(120))

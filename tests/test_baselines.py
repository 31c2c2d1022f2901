"""Hugging Face baselines in the benchmark: prompt-lookup decoding (`pld`) and assisted generation
give the target's own greedy output; a drafter HF cannot drive is refused by name."""

import pytest

from tiny import tiny_trio
from treegraft.bench.methods import make_runner, parse_method
from treegraft.engine import ConfigError, GenConfig

PROMPT = [1, 2, 3, 1, 2, 3, 1, 2, 4, 5, 1, 2]


@pytest.mark.parametrize("weak", ["perturbed", "ngram"])
def test_pld_and_assisted_match_ar(weak):
    trio = tiny_trio(weak, "perturbed")
    cfg = GenConfig(max_new_tokens=20)
    ar = make_runner(trio, cfg, parse_method("ar", "always")).run(PROMPT)
    for name in ("pld", "assisted"):
        stats = make_runner(trio, cfg, parse_method(name, "always")).run(PROMPT)
        assert stats["token_ids"] == ar["token_ids"], name
        assert stats["target_forwards"] <= ar["target_forwards"]
        assert sum(stats["accept_lens"]) == len(ar["token_ids"])
    pld = make_runner(trio, cfg, parse_method("pld", "always")).run(PROMPT)
    assert pld["weak_forwards"] == pld["strong_forwards"] == 0


def test_assisted_refuses_a_prompt_lookup_drafter():
    trio = tiny_trio("ngram", "perturbed")
    with pytest.raises(ConfigError, match="prompt lookup.*pld"):
        make_runner(trio, GenConfig(), parse_method("assisted-weak", "always"))

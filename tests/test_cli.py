"""Bad input: a specific message and exit code 2, nothing else. Good input: the JSON contract."""

import json
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from treegraft.cli import main
from treegraft.models import ModelLoadError, check_vocab, default_target_dir, load_tokenizer


def run_cli(capsys, *args):
    rc = main(["generate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("args,message", [
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt", "hi", "--budget", "0"], "budget must be an integer in [1, 512]"),
    (["--prompt", "hi", "--budget", "100000"], "budget must be an integer in [1, 512]"),
    (["--prompt", "hi", "--depth", "0"], "depth must be an integer in [1, 32]"),
    (["--prompt", "hi", "--topk", "65"], "topk must be an integer in [1, 64]"),
    (["--prompt", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature must be in [0, 100]"),
    (["--prompt", "hi", "--target", "/no/such/model"], "model path not found: /no/such/model"),
    (["--prompt", "hi", "--weak", "./missing-drafter"], "model path not found: ./missing-drafter"),
    (["--prompt", "hi", "--strong", "no-such-org/no-such-model"], "not in the local Hugging Face cache"),
])
def test_bad_input_exits_2_with_a_specific_message(capsys, args, message):
    rc, out, err = run_cli(capsys, *args)
    assert rc == 2
    assert message in err and "Traceback" not in err and out == ""


def test_prompt_longer_than_the_context_window(capsys):
    rc, out, err = run_cli(capsys, "--prompt", "word " * 9000, "--raw", "--max-new-tokens", "4")
    assert rc == 2 and "context window is 8192" in err


@pytest.fixture(scope="module")
def mismatched_dir(tmp_path_factory):
    """A drafter whose tokenizer swaps two ids of the target's vocabulary."""
    d = tmp_path_factory.mktemp("mismatch")
    src = default_target_dir()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / f).exists():
            shutil.copy(src / f, d / f)
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    inv = {i: t for t, i in vocab.items()}
    a, b = inv[300], inv[301]
    vocab[a], vocab[b] = 301, 300
    (d / "tokenizer.json").write_text(json.dumps(tok))
    cfg = LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    return d, a, b


def test_mismatched_tokenizer_names_the_first_mismatching_token(capsys, mismatched_dir):
    d, a, b = mismatched_dir
    rc, out, err = run_cli(capsys, "--prompt", "hi", "--weak", str(d))
    assert rc == 2
    assert "first mismatch at token id 300" in err and repr(a) in err and repr(b) in err


def test_check_vocab_accepts_itself():
    tok = load_tokenizer("default")
    check_vocab(tok, tok, "self")
    with pytest.raises(ModelLoadError):
        check_vocab(tok, type("T", (), {"get_vocab": lambda self: {"x": 0}})(), "other")


def test_generate_json_contract(capsys):
    rc, out, err = run_cli(capsys, "--prompt", "What is 2 + 2?", "--method", "tree-weak", "--max-new-tokens", "12",
                           "--dtype", "float32", "--json")
    assert rc == 0
    row = json.loads(out.strip().splitlines()[-1])
    for key in ("text", "token_ids", "new_tokens", "target_forwards", "tau", "wall_s", "tokens_per_s"):
        assert key in row
    assert row["new_tokens"] == len(row["token_ids"]) <= 12
    assert row["tau"] == pytest.approx(row["new_tokens"] / row["target_forwards"])
    assert row["text"]


@pytest.mark.parametrize("argv,message", [
    (["bench", "--suite", "nq", "--methods", "ar,treegraft:always[blend=2]"], "blend must be in [0, 1]"),
    (["scheduler", "compare", "--methods", "tree-weak,treegraft[graft_q=1]"], "unknown knob 'graft_q'"),
])
def test_bad_method_specs_exit_2_before_loading_models(capsys, argv, message):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


def test_library_defaults_are_the_cli_defaults():
    """`treegraft.generate` and `GenConfig.defaults()` run what `python -m treegraft generate` runs
    with no options (auto budget, the shipped policy), and a number given as the budget fixes it."""
    from treegraft.cli import build_parser
    from treegraft.engine import GenConfig
    from treegraft.options import gen_config
    a = build_parser().parse_args(["generate", "--prompt", "hi"])
    assert GenConfig.defaults() == gen_config(a, "treegraft")
    assert GenConfig.defaults().auto_budget and not GenConfig().auto_budget
    a = build_parser().parse_args(["generate", "--prompt", "hi", "--budget", "16", "--policy", "never"])
    assert GenConfig.defaults(budget=16, policy="never") == gen_config(a, "treegraft")

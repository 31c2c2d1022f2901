"""Distillation smoke tests on tiny random models (seconds): for each drafter design a training segment
runs, a second segment resumes from its checkpoint, the export writes a drafter that the normal loader
loads, and decoding with it stays lossless; `distill eval` reads both back."""

import json

import pytest
import torch

from tiny import tiny_llama
from treegraft.distill import main
from treegraft.distill.loop import read_log
from treegraft.distill.shards import HELDOUT, TOPK, load_shard, save_shard
from treegraft.engine import Engine, GenConfig
from treegraft.models import Trio, load_drafter, load_model

CPU = torch.device("cpu")


@torch.no_grad()
def labelled(target, n: int, kinds: list[str], seed: int) -> list[dict]:
    """Samples as `distill data` writes them: ids, answer start, the target's top-k at answer tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, target.config.vocab_size, (int(torch.randint(12, 24, (1,), generator=g)),), generator=g)
        start = 6
        lp = torch.log_softmax(target(ids[None]).logits[0, start - 1:-1].float(), -1)
        v, k = lp.topk(TOPK, -1)
        out.append({"ids": ids, "start": start, "kind": kinds[i % len(kinds)], "topi": k.to(torch.int32),
                    "topv": v.half()})
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    target_dir, data = root / "target", root / "data"
    tiny_llama(0).cpu().save_pretrained(target_dir, safe_serialization=True)
    target = load_model(str(target_dir), CPU, torch.float32)
    data.mkdir()
    save_shard(data / "gen-00000.safetensors", labelled(target, 24, ["chat", "math"], 1))
    save_shard(data / HELDOUT, labelled(target, 6, ["coding", "math", "sharegpt"], 2))
    common = ["--target", str(target_dir), "--data-dir", str(data), "--ckpt-dir", str(root / "ckpt"), "--threads", "1"]
    return {"root": root, "target": target, "common": common, "data": data}


def segment(setup, phase: str, name: str, steps: int, *extra) -> dict:
    assert main([phase, *setup["common"], "--minutes", "5", "--plan-minutes", "1", "--steps", str(steps),
                 "--eval-minutes", "0", "--checkpoint-minutes", "5", *extra]) == 0
    return read_log(setup["root"] / "ckpt" / name / "log.jsonl")


def lossless(target, weak, strong, method: str) -> None:
    trio = Trio(target, weak, strong, None, CPU, torch.float32, {})
    prompt = [5, 17, 33, 2, 9]
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
    engine = Engine(trio, GenConfig(method=method, policy="always", max_new_tokens=16, budget=12, depth=4, topk=3))
    list(engine.generate(prompt))
    assert engine.new_tokens == ref


LM = ["--role", "weak", "--hidden", "16", "--layers", "1", "--frequent", "0", "--text-ratio", "0",
      "--batch-tokens", "128"]
FEATURES = ["--text-pool", "0", "--frequent", "16", "--negatives", "16", "--batch-tokens", "128", "--replay", "1"]


@pytest.fixture(scope="module")
def weak_dir(setup):
    log = segment(setup, "train", "weak", 3, *LM)
    assert [s["step"] for s in log["starts"]] == [0] and log["evals"][-1]["step"] == 3
    log = segment(setup, "train", "weak", 2, *LM)  # a second segment resumes where the first stopped
    assert [s["step"] for s in log["starts"]] == [0, 3] and log["evals"][-1]["step"] == 5
    assert "benchmark_macro" in log["evals"][-1]["heldout"]
    out = setup["root"] / "drafters" / "weak"
    assert main(["export", *setup["common"], "--role", "weak", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def strong_dir(setup):
    log = segment(setup, "eagle-train", "feat", 2, "--name", "feat", *FEATURES)
    log = segment(setup, "eagle-train", "feat", 1, "--name", "feat", *FEATURES)
    assert [s["step"] for s in log["starts"]] == [0, 2] and log["evals"][-1]["step"] == 3
    assert "depth2_benchmark_macro" in log["evals"][-1]["heldout"]
    out = setup["root"] / "drafters" / "strong"
    assert main(["eagle-export", *setup["common"], "--name", "feat", "--out", str(out)]) == 0
    return out


def test_lm_design_trains_resumes_exports_and_stays_lossless(setup, weak_dir):
    target = setup["target"]
    assert (weak_dir / "README.md").read_text().startswith("# TreeGraft default weak drafter")
    weak = load_drafter(str(weak_dir), "weak", target, CPU, torch.float32)
    assert weak.config.hidden_size == 16 and not getattr(weak, "needs_features", False)
    ck = torch.load(setup["root"] / "ckpt" / "weak" / "state.pt", weights_only=True)
    for name, p in weak.named_parameters():  # the export holds the checkpoint's weights (fp16 on disk)
        if name in ck["trainable"]:
            torch.testing.assert_close(p, ck["trainable"][name].half().float())
    lossless(target, weak, target, "tree-weak")


def test_feature_design_trains_resumes_exports_and_stays_lossless(setup, weak_dir, strong_dir):
    target = setup["target"]
    meta = json.loads((strong_dir / "treegraft_drafter.json").read_text())
    assert meta["kind"] == "features" and "depth 2" in (strong_dir / "README.md").read_text()
    strong = load_drafter(str(strong_dir), "strong", target, CPU, torch.float32)
    assert strong.needs_features and strong.lm_head is target.get_output_embeddings()
    weak = load_drafter(str(weak_dir), "weak", target, CPU, torch.float32)
    lossless(target, weak, strong, "treegraft")


def test_eval_reads_both_designs_back(setup, weak_dir, strong_dir):
    assert main(["eval", *setup["common"], "--drafters", str(weak_dir.parent)]) == 0
    report = json.loads((setup["data"] / "eval.json").read_text())
    assert set(report["weak"]["heldout"]) >= {"coding", "math", "sharegpt", "benchmark_macro"}
    assert "depth2_benchmark_macro" in report["strong"]["heldout"]
    assert report["weak"]["cost_ratio"] > 0 and report["strong"]["cost_ratio"] > 0
    held = load_shard(setup["data"] / HELDOUT)
    assert len(held) == 6


SKIP = ["--text-pool", "0", "--bottom", "1", "--top", "1", "--rank", "2", "--head", "40", "--batch-tokens", "128",
        "--replay", "2"]


@pytest.fixture(scope="module")
def skip_dir(setup):
    """A layer-skip drafter cut from another tiny model of the target's vocabulary (the base)."""
    base_dir = setup["root"] / "base"
    tiny_llama(3, layers=3).cpu().save_pretrained(base_dir, safe_serialization=True)
    extra = ["--name", "skip", "--base", str(base_dir), *SKIP]
    segment(setup, "skip-train", "skip", 2, *extra)
    log = segment(setup, "skip-train", "skip", 2, *extra)  # each labelled batch makes --replay (2) steps
    assert [s["step"] for s in log["starts"]] == [0, 2] and log["evals"][-1]["step"] == 4
    out = setup["root"] / "drafters" / "skip"
    assert main(["skip-export", *setup["common"], "--name", "skip", "--out", str(out)]) == 0
    return out


def test_skip_design_trains_resumes_exports_and_stays_lossless(setup, skip_dir):
    from safetensors.torch import load_file
    target = setup["target"]
    meta = json.loads((skip_dir / "treegraft_drafter.json").read_text())
    assert meta["kind"] == "skip" and meta["bottom"] == 1 and meta["top"] == 1
    stored = load_file(str(skip_dir / "model.safetensors"))
    assert not any("embed_tokens" in n or "proj.weight" in n for n in stored)  # the base's tensors stay in the base
    weak = load_drafter(str(skip_dir), "weak", target, CPU, torch.float32)
    assert weak.config.num_hidden_layers == 2
    head = set(weak.lm_head.ids.tolist())
    assert len(head) <= 40 + 1
    with torch.no_grad():
        top = weak(input_ids=torch.tensor([[5, 17, 33, 2, 9]])).logits[0].topk(3, -1).indices
    assert set(top.flatten().tolist()) <= head     # a token outside the head is never proposed
    lossless(target, weak, target, "tree-weak")
    lossless(target, weak, load_drafter(str(skip_dir), "strong", target, CPU, torch.float32), "treegraft")

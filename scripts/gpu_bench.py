"""GPU path check: randomly initialised models of realistic size (no weights can travel to the
device machine), ar vs tree-weak vs tree-strong vs treegraft side by side in one run.

Random drafters agree with a random target about 1/vocab of the time, so tau stays near 1: this
measures the cost side of the GPU path (tree forward vs decode step, drafter overhead) and that
greedy output is unchanged in fp32. Usage: python scripts/gpu_bench.py [--dtype bfloat16]"""

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from treegraft.engine import Engine, GenConfig
from treegraft.models import Trio, sync


def llama(hidden, layers, heads, kv, inter, seed, device, dtype):
    cfg = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                      tie_word_embeddings=True, eos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        return LlamaForCausalLM(cfg).to(dtype).eval()


def tree_forward_cost(model, device, dtype, prefix=256):
    """ms per target forward with `prefix` cached tokens and q new tokens (tree-sized chunks)."""
    from treegraft.kv import Runner, tree_mask
    r = Runner(model, "target")
    r.catch_up(list(range(1, prefix + 1)))
    out = {}
    for q in (1, 8, 16, 32, 64):
        ts = []
        for _ in range(7):
            n = r.n
            sync(device)
            t = time.perf_counter()
            mask = tree_mask([n + 1 + j for j in range(q)], [[] for _ in range(q)], n + q, dtype, device)
            r._forward(list(range(q)), list(range(n, n + q)), mask)
            sync(device)
            ts.append(time.perf_counter() - t)
            r.restore(n)
        out[q] = round(sorted(ts)[3] * 1e3, 2)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    a = ap.parse_args()
    device, dtype = torch.device("cuda"), getattr(torch, a.dtype)
    target = llama(2048, 16, 32, 8, 5632, 0, device, dtype)            # ~1.1B
    weak = llama(512, 2, 8, 8, 1536, 1, device, dtype)                 # ~30M
    strong = llama(768, 6, 12, 12, 2048, 2, device, dtype)             # ~90M
    trio = Trio(target, weak, strong, None, device, dtype, {"target": "random 1.1B", "weak": "random 30M",
                                                             "strong": "random 90M"})
    print("params (M):", {k: round(sum(p.numel() for p in m.parameters()) / 1e6) for k, m in
                          (("target", target), ("weak", weak), ("strong", strong))})
    print("target forward ms by new tokens (256 cached):", tree_forward_cost(target, device, dtype))
    prompt = list(range(100, 164))
    ref = None
    for method in ("ar", "tree-weak", "tree-strong", "treegraft"):
        engine = Engine(trio, GenConfig(method=method, max_new_tokens=a.max_new_tokens, budget=32, depth=6, topk=4,
                                        policy="always", record_stages=False))
        list(Engine(trio, GenConfig(method=method, max_new_tokens=8, record_stages=False,
                                    policy="always")).generate(prompt))  # warm-up
        sync(device)
        t = time.perf_counter()
        recs = list(engine.generate(prompt))
        sync(device)
        wall = time.perf_counter() - t
        ref = ref or engine.new_tokens
        split = {k: round(sum(r.times.get(k, 0) for r in recs), 3) for k in sorted({k for r in recs for k in r.times})}
        print(json.dumps({"method": method, "dtype": a.dtype, "new_tokens": len(engine.new_tokens),
                          "target_forwards": len(recs), "tau": round(len(engine.new_tokens) / len(recs), 3),
                          "tokens_per_s": round(len(engine.new_tokens) / wall, 1),
                          "same_as_ar": engine.new_tokens == ref, "time_split_s": split}))


if __name__ == "__main__":
    main()

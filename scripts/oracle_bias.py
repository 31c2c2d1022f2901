"""Why `--policy oracle` refuses to sample: the first token the oracle emits, over N seeds, against
the target's own distribution (chi-square), beside another policy run the same way.

    .venv/bin/python scripts/oracle_bias.py [N] [POLICY ...]     # default: 4000 oracle always

The oracle samples both branches (with and without the strong drafter) from one random stream and
keeps the one that accepted more tokens per second: which branch it keeps depends on the draw, so
what it emits is not a draw from the target. GenConfig.check refuses it at temperature > 0; this
script lifts that check to show the reason. Tiny random trio from tests/tiny.py: a random weak
drafter, the target's copy as the strong one, output sharpened 1.5x (spread out), temperature 1."""
import sys
import time
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "tests")]
torch.set_num_threads(2)
from test_sampling import chi2_pvalue  # noqa: E402
from tiny import ids, tiny_trio  # noqa: E402
from treegraft.engine import Engine, GenConfig  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
if n < 1000:  # 96 tokens spread out: fewer draws leave too few cells with 5 expected for the test
    sys.exit(f"oracle_bias.py: N must be at least 1000, got {n}")
policies = sys.argv[2:] or ["oracle", "always"]
GenConfig.check = lambda self: None  # the refusal under test; nothing else is changed
trio = tiny_trio("random", "copy", sharpen=1.5)
prompt = [1, 4, 2, 7, 1, 4]
with torch.inference_mode():
    p = torch.softmax(trio.target(input_ids=ids(prompt)).logits[0, -1].double(), -1)
expected = {(t,): float(p[t]) for t in range(len(p))}
for policy in policies:
    counts, t0 = {}, time.perf_counter()
    for seed in range(n):
        engine = Engine(trio, GenConfig(method="treegraft", policy=policy, max_new_tokens=2, budget=8, depth=3,
                                        topk=3, temperature=1.0, seed=seed, record_stages=False))
        list(engine.generate(prompt))
        key = tuple(engine.new_tokens[:1])
        counts[key] = counts.get(key, 0) + 1
    print(f"{policy}: {n} first tokens, chi-square p = {chi2_pvalue(counts, expected, n):.2g} "
          f"against the target's distribution ({time.perf_counter() - t0:.0f} s)")

"""Time one step's sampled acceptance (rows x vocabulary logits -> accepted path + bonus), at
temperature 0.7, with and without top-p, on SmolLM2's and Qwen's vocabulary sizes.

    .venv/bin/python scripts/accept_cost.py [REPO]     # REPO: a checkout to time (default: this one)

Give another checkout (e.g. `git worktree add /tmp/before d5e1484~1`) to time its verify.py the
same way; both the old accept_sample(tree, selected, probs, g) and the current
accept_sample(tree, selected, logits, g, temperature, top_p) are understood."""
import inspect
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1]))
torch.set_num_threads(2)
from treegraft import verify  # noqa: E402
from treegraft.tree import ROOT, DraftTree  # noqa: E402


def chain_tree(n, logits):
    # a binary tree whose first child carries its parent row's argmax: the walk goes deep, as in real steps
    t, row_of = DraftTree(), {ROOT: 0}
    for i in range(n):
        parent = ROOT if i < 2 else (i - 2) // 2
        r = logits[row_of[parent]]
        tok = int(r.argmax()) if i % 2 == 0 else int(r.topk(2).indices[1])
        nid, _ = t.add(parent, tok, -0.1 * i, "weak")
        row_of[nid] = 1 + nid
    return t


new_api = "temperature" in inspect.signature(verify.accept_sample).parameters
for V in (49152, 151936):
    for n in (3, 16, 64):
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(n + 1, V, generator=g) * 3
        tree = chain_tree(n, logits)
        sel = list(range(len(tree)))
        for top_p in (1.0, 0.9):
            def once():
                if new_api:
                    return verify.accept_sample(tree, sel, logits, g, 0.7, top_p)
                return verify.accept_sample(tree, sel, verify.target_probs(logits, 0.7, top_p), g)
            once()
            reps, t = 20, time.perf_counter()
            for _ in range(reps):
                once()
            print(f"V={V} rows={n+1} top_p={top_p}: {1000*(time.perf_counter()-t)/reps:.2f} ms/step")

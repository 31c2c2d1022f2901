"""Which of the strong drafter's Linears can run in int8: top-1 agreement with the target, teacher-forced
over a fixed text (this repo's engine.py and README), for the fp32 drafter and for int8 variants that
quantize every Linear, every Linear but a family, or one family alone. The numbers behind
treegraft.quantize.KEEP_FP32.

    .venv/bin/python scripts/int8_agreement.py --target qwen-coder-1.5b --drafter qwen-coder-0.5b
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a clone

from treegraft.models import load_model, load_tokenizer  # noqa: E402
from treegraft.quantize import quantize_linears  # noqa: E402

VARIANTS = {
    "every Linear": lambda n: True,
    "all but down_proj (shipped)": lambda n: not n.endswith("down_proj"),
    "all but down_proj and the head": lambda n: not n.endswith("down_proj") and n != "lm_head",
    "attention only": lambda n: ".self_attn." in n,
    "gate_proj + up_proj only": lambda n: n.endswith(("gate_proj", "up_proj")),
    "down_proj only": lambda n: n.endswith("down_proj"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen-coder-1.5b")
    ap.add_argument("--drafter", default="qwen-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=800)
    a = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cpu = torch.device("cpu")
    tok = load_tokenizer(a.drafter)
    text = (ROOT / "treegraft" / "engine.py").read_text()[:3000] + (ROOT / "README.md").read_text()[3000:6000]
    ids = tok(text, return_tensors="pt").input_ids[:, :a.tokens]
    with torch.inference_mode():
        target = load_model(a.target, cpu, torch.float32).eval()
        want = target(ids).logits[0].argmax(-1)
        del target
        base = load_model(a.drafter, cpu, torch.float32).eval()
        names = [n for n, m in base.named_modules() if isinstance(m, nn.Linear)]
        print(f"top-1 agreement with {a.target} over {ids.shape[1]} tokens (teacher-forced), drafter {a.drafter}")
        print(f"  fp32: {(base(ids).logits[0].argmax(-1) == want).float().mean():.3f}")
        for label, keep in VARIANTS.items():
            model = copy.deepcopy(base)
            quantize_linears(model, [n for n in names if keep(n)])
            print(f"  int8, {label}: {(model(ids).logits[0].argmax(-1) == want).float().mean():.3f}")
            del model


if __name__ == "__main__":
    main()

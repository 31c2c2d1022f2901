"""The budget curve (issue 12): what a fixed tree budget N buys against `--budget auto`, beside the
target's measured forward cost per number of tree tokens. Reads finished `bench` runs and `profile`
caches; draws docs/bench/budget-curve.svg (matplotlib: requirements-docs.txt).

  .venv/bin/python scripts/budget_curve.py --bench qwen-coder=docs/bench/qwen-coder-auto \
      --bench smollm2=docs/bench/smollm2-auto --out docs/bench/budget-curve.svg
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

FIXED = re.compile(r"^treegraft:always\[budget=(\d+)\]$")


def budget_points(run: Path) -> tuple[dict[int, float], float]:
    """Pooled tokens/s over `ar` per fixed budget N, and for auto (plain treegraft:always)."""
    s = pd.read_csv(run / "summary.csv")
    s = s[(s.level == "all") & (s.group == "all")].set_index("method")
    ar = s.loc["ar", "tokens_per_s_pooled"]
    fixed = {int(m.group(1)): s.loc[name, "tokens_per_s_pooled"] / ar
             for name in s.index if (m := FIXED.match(name))}
    if not fixed or "treegraft:always" not in s.index:
        raise SystemExit(f"{run}: needs treegraft:always and treegraft:always[budget=N] rows")
    return dict(sorted(fixed.items())), s.loc["treegraft:always", "tokens_per_s_pooled"] / ar


def profile_for(run: Path, profiles: Path) -> dict[int, float] | None:
    """The target's cost curve from the profile cache whose target and kernels match the run's."""
    cfg = json.loads((run / "config.json").read_text())
    found = [json.loads(f.read_text()) for f in sorted(profiles.glob("*.json"))]
    found = [p for p in found if p["models"]["target"] == cfg["models"]["target"]
             and p.get("kernels") == cfg.get("kernels") and p.get("threads") == 2]
    found.sort(key=lambda p: p["models"] != cfg["models"])  # the run's own trio first
    return {int(q): ms for q, ms in found[0]["target"].items()} if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", action="append", required=True, help="NAME=bench run directory")
    ap.add_argument("--profiles", default=str(Path.home() / ".cache" / "treegraft" / "profiles"))
    ap.add_argument("--out", default="docs/bench/budget-curve.svg")
    args = ap.parse_args()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for item in args.bench:
        name, _, where = item.partition("=")
        run = Path(where)
        fixed, auto = budget_points(run)
        line, = right.plot(list(fixed), list(fixed.values()), "o-", label=f"{name}: fixed budget N")
        right.axhline(auto, ls="--", color=line.get_color(), label=f"{name}: --budget auto ({auto:.2f}x)")
        curve = profile_for(run, Path(args.profiles))
        if curve:
            left.plot(list(curve), [ms / curve[1] for ms in curve.values()], "o-", color=line.get_color(),
                      label=f"{name} target ({curve[1]:.0f} ms at 1 token)")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set(xscale="log", xlabel="tree budget N (nodes, log scale)", ylabel="tokens/s over ar (pooled, x)",
              title="treegraft:always: fixed N vs auto")
    right.set_xticks([8, 16, 32, 64], labels=["8", "16", "32", "64"])
    left.set(xscale="log", xlabel="tree tokens verified in one forward (log scale)",
             ylabel="forward time / one-token forward (x)", title="the target's verification cost")
    left.set_xticks([1, 2, 4, 8, 16, 32, 64, 128], labels=["1", "2", "4", "8", "16", "32", "64", "128"])
    for ax in (left, right):
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""One colour per method and per provenance, defined once for every chart and page.

Presentation only (no plotly, no Streamlit). The two palettes share meaning on purpose: the weak
drafter is blue wherever it appears (its proposals in a tree, the `tree-weak` endpoint, a step where
only it ran), the strong drafter red (`tree-strong`, a step where it ran), and TreeGraft, which
combines them, teal. Provenance colours mark who put a node into the shared tree.
"""

from __future__ import annotations

WEAK = "#4C78A8"     # blue
STRONG = "#E45756"   # red
TREEGRAFT = "#1B9E9A"  # teal
AR = "#595959"       # dark grey: the baseline everything is divided by
BONUS = "#E3B505"    # gold: the target's own token (the star)
ACCEPTED = "#2CA02C"  # green rings
REJECTED = "#D62728"  # red x
PRUNED = "#BBBBBB"

METHOD = {
    "ar": AR,
    "tree-weak": WEAK,
    "tree-strong": STRONG,
    "treegraft": TREEGRAFT,
    "assisted": "#9D755D",       # brown: Hugging Face assisted generation with the strong drafter
    "assisted-weak": "#C9A66B",  # tan: the same with the weak drafter
}
# treegraft under an explicit policy ("treegraft:always", ...): shades of teal, the default policy darkest.
TREEGRAFT_POLICY = {"learned": "#0B6E6A", "always": "#1B9E9A", "every-k": "#5CC8C2", "never": "#8FD9D3",
                    "when-empty": "#3FB3AC", "when-unsure": "#2E9C8F", "when-matched": "#6FB8A0",
                    "strong-first": "#4A8F7A", "oracle": "#2A5C8A"}

# Provenance -> (legend label, colour, marker symbol). Labels are written for a newcomer.
PROVENANCE = {
    "weak": ("weak drafter's proposal", WEAK, "circle"),
    "rescored": ("weak proposal, rescored by strong", "#F58518", "diamond"),
    "graft": ("grafted by strong (new subtree)", "#54A24B", "triangle-right"),
    "recovered": ("recovered by strong (weak missed it)", "#B279A2", "square"),
    "strong": ("strong drafter's proposal", STRONG, "hexagon"),
}
PROVENANCE_COLOR = {k: v[1] for k, v in PROVENANCE.items()}

_FALLBACK = ["#72B7B2", "#FF9DA6", "#9D755D", "#BAB0AC", "#EECA3B", "#79706E"]


def method_color(method: str) -> str:
    """The colour of a method name as the app and the bench spell it ("treegraft:learned" too).
    Unknown names get a stable colour from a spare palette (same name, same colour, every page)."""
    method = str(method)
    if method in METHOD:
        return METHOD[method]
    base, _, policy = method.partition(":")
    if base == "treegraft" and policy:
        return TREEGRAFT_POLICY.get(policy, TREEGRAFT)
    if base in METHOD:
        return METHOD[base]
    return _FALLBACK[sum(map(ord, method)) % len(_FALLBACK)]

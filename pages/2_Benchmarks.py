"""Benchmarks: open a results directory of `python -m treegraft bench` and compare methods per category."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st

from pages.common import ui
from treegraft import viz

st.set_page_config(page_title="TreeGraft - benchmarks", layout="wide")
ROOT = Path(__file__).resolve().parents[1]


SHIPPED = ROOT / "docs" / "bench" / "current"  # the committed benchmark of the shipped trio


def latest_results() -> str:
    """The newest directory under runs/ holding a results.csv, else the committed benchmark."""
    found = sorted((ROOT / "runs").glob("**/results.csv"), key=lambda p: p.stat().st_mtime)
    if found:
        return str(found[-1].parent)
    return str(SHIPPED) if (SHIPPED / "results.csv").is_file() else ""


def committed() -> list[str]:
    """Every benchmark committed under docs/bench (the shipped trio's first), as paths from the repo root:
    the runs the README's tables quote, one pair of drafters per directory."""
    found = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "docs" / "bench").glob("**/results.csv"))
    shipped = str(SHIPPED.relative_to(ROOT))
    return sorted(found, key=lambda d: d != shipped)


def pick_committed() -> None:
    """A committed run picked from the list goes into the directory box (which stays free to edit)."""
    picked = st.session_state["bench_pick"]
    if picked != NONE:
        st.session_state["saved_bench_dir"] = str(ROOT / picked)


def typed() -> None:
    ui.save("bench_dir")
    st.session_state["bench_pick"] = NONE  # the list no longer names what is shown


NONE = "(the directory typed below)"


def show(path: str) -> None:
    results, summary = viz.read_bench_dir(path)
    st.success(f"{len(results)} result rows: {results['method'].nunique()} methods, "
               f"{results['category'].nunique()} categories")
    line = viz.bench_config_line(path)
    st.caption(f"Measured with: {line}." if line else "No config.json here: the models and settings are not recorded.")
    if summary is not None:
        st.subheader("summary.csv")
        st.dataframe(summary, hide_index=True)
    st.caption("Speedup = the method's tokens/s over ar's on the same prompt (for greedy runs, ar's wall time over "
               "the method's), methods interleaved prompt by prompt; under sampling there is no identity with ar to "
               "check, so that chart is left out; tau (tokens per target forward) does not depend on the machine or its load. Colours match "
               "the Step through page: one colour per method everywhere.")
    st.subheader("Mean per category and method")
    st.dataframe(viz.bench_table(results), hide_index=True)
    for i, fig in enumerate(viz.bench_figures(results)):
        st.plotly_chart(fig, key=f"bench_{i}")
    with st.expander("results.csv (every prompt x method)"):
        st.dataframe(results, hide_index=True)


def run_small(s: dict) -> None:
    """Run (or resume) a small real benchmark with the sidebar's models and tree settings."""
    from treegraft.bench.prompts import SUITES, load_suite
    from treegraft.bench.run import run_bench
    with st.expander("Run a small benchmark now (real runs; minutes on a CPU)"):
        c = st.columns(4)
        suite = c[0].selectbox("Prompt set", ["all", *SUITES], key="bench_suite")
        limit = int(c[1].number_input("Prompts per set", min_value=1, max_value=50, value=1, key="bench_limit"))
        tokens = int(c[2].number_input("Max new tokens", min_value=1, max_value=512, value=32, key="bench_tokens"))
        out = c[3].text_input("Output directory", value=str(ROOT / "runs" / "app-bench"), key="bench_out",
                              help="resumed if it exists with the same configuration")
        methods = st.multiselect("Methods", ["ar", "tree-weak", "tree-strong", "treegraft", "assisted-weak"],
                                 default=["ar", "tree-weak", "tree-strong", "treegraft"], key="bench_methods")
        if not st.button("Run benchmark", key="bench_run"):
            return
        with ui.guard("run the benchmark"):
            if not methods:
                raise ValueError("choose at least one method")
            cfg = ui.make_config(s, max_new_tokens=tokens)
            prompts = load_suite(suite, limit)
            trio = ui.trio_for(s)
            bar = st.progress(0.0, text="warming up")

            def progress(done, total, row):
                bar.progress(done / total, text=f"{done} of {total}: {row['prompt_id']} {row['method']} "
                                                f"{row['tokens_per_s']:.1f} tokens/s")
            run_bench(trio, prompts, methods, cfg, out, progress=progress,
                      meta={"source": f"app:suite:{suite}", "limit": limit})
            bar.empty()
            st.session_state["saved_bench_dir"] = out  # show what was just measured


def main() -> None:
    st.title("Benchmarks")
    st.write("Produce a results directory with `python -m treegraft bench ...` (prompts from MT-Bench, "
             "HumanEval, Natural Questions, XSum, translation and math word problems), then open it here.")
    s = ui.settings_sidebar("bench")
    run_small(s)
    st.selectbox("Committed benchmarks (the runs the README quotes; type to search, e.g. 'epyc-fast')",
                 [NONE, *committed()], key="bench_pick", on_change=pick_committed,
                 help="docs/bench/<run>/<trio>__<weak>_<strong>: each directory is one pair of drafters")
    path = st.text_input("Results directory (holds results.csv and, optionally, summary.csv)",
                         **(ui.bind("bench_dir", latest_results()) | {"on_change": typed, "args": ()}))
    if not path.strip():
        st.info("Enter a results directory to see its tables and charts.")
        return
    with ui.guard("open the results"):
        show(path)


main()

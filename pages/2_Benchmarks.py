"""Benchmarks: open a results directory of `python -m treegraft bench` and compare methods per category."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st

from pages.common import ui
from treegraft import viz

st.set_page_config(page_title="TreeGraft - benchmarks", layout="wide")
ROOT = Path(__file__).resolve().parents[1]


def latest_results() -> str:
    """The newest directory under runs/ holding a results.csv, as a starting suggestion."""
    found = sorted((ROOT / "runs").glob("**/results.csv"), key=lambda p: p.stat().st_mtime)
    return str(found[-1].parent) if found else ""


def show(path: str) -> None:
    results, summary = viz.read_bench_dir(path)
    st.success(f"{len(results)} result rows: {results['method'].nunique()} methods, "
               f"{results['category'].nunique()} categories")
    if summary is not None:
        st.subheader("summary.csv")
        st.dataframe(summary, hide_index=True)
    st.subheader("Mean per category and method")
    st.dataframe(viz.bench_table(results), hide_index=True)
    for i, fig in enumerate(viz.bench_figures(results)):
        st.plotly_chart(fig, key=f"bench_{i}")
    with st.expander("results.csv (every prompt x method)"):
        st.dataframe(results, hide_index=True)


def main() -> None:
    st.title("Benchmarks")
    st.write("Produce a results directory with `python -m treegraft bench ...` (prompts from MT-Bench, "
             "HumanEval, Natural Questions, XSum, translation and math word problems), then open it here.")
    ui.restore("bench_dir", latest_results())
    path = st.text_input("Results directory (holds results.csv and, optionally, summary.csv)", key="bench_dir")
    ui.save("bench_dir")
    if not path.strip():
        st.info("Enter a results directory to see its tables and charts.")
        return
    with ui.guard("open the results"):
        show(path)


main()

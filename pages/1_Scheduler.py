"""Scheduler: when did TreeGraft call the strong drafter, why, and what if it had decided otherwise."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st

from pages.common import ui
from treegraft import viz

st.set_page_config(page_title="TreeGraft - scheduler", layout="wide")


def ensure_records() -> ui.Run | None:
    run = ui.current_run()
    if run is not None and run.records:
        return run
    st.info("No steps yet. Step through on the main page, or run a few TreeGraft steps here with the "
            "sidebar settings and the main page's prompt.")
    if st.button("Run 4 steps here", key="sched_run"):
        with ui.guard("run the steps"):
            run = ui.new_run(ui.settings() | {"method": "treegraft"}, ui.prompt_text())
            ui.step(run, 4)
            st.rerun()
    return None


def timeline(run: ui.Run) -> None:
    st.subheader("Decision timeline")
    if run.cfg.method != "treegraft":
        st.warning(f"This run uses method {run.cfg.method!r}: only treegraft has a scheduler.")
    st.caption(f"Policy **{run.cfg.policy}**. Orange: the strong drafter was called. A score and threshold "
               "appear for the learned policy; the oracle's measured gain (tokens/s with minus without the "
               "strong drafter) appears where the oracle ran.")
    st.plotly_chart(viz.decision_figure(run.records), key="decision_chart")
    st.plotly_chart(viz.features_figure(run.records), key="features_chart")
    st.dataframe(viz.decisions_table(run.records), hide_index=True)


def show_branch(col, name: str, rec, decode) -> None:
    col.markdown(f"**{name}**: {len(rec.accepted)} accepted + bonus = **{rec.accept_len} tokens** "
                 f"({rec.text!r}) in {rec.wall_s * 1e3:.0f} ms = {rec.accept_len / rec.wall_s:.1f} tokens/s")
    col.plotly_chart(viz.tree_figure(rec, "verified", decode, show_pruned=False,
                                     title=f"{name}: {len(rec.selected)} nodes verified"),
                     key=f"whatif_{name.split()[0]}")


def what_if(run: ui.Run) -> None:
    st.subheader("What if the scheduler had decided the other way?")
    st.caption("Rebuilds the engine from the same prefix (prompt + tokens accepted before that step), then "
               "runs that one step with the strong drafter forced on and forced off. Real forwards, real times; "
               "with sampling both branches start from the run's seed.")
    k = st.selectbox("Step", options=list(range(len(run.records))), index=len(run.records) - 1, key="whatif_step")
    orig = run.records[k]
    st.write(f"Originally: strong drafter {'called' if orig.strong_called else 'skipped'}, "
             f"{orig.accept_len} tokens in {orig.wall_s * 1e3:.0f} ms.")
    if st.button("Rerun this step both ways", key="whatif_go"):
        with ui.guard("rerun the step"):
            with st.spinner("running the step twice ..."):
                st.session_state["what_if"] = (run.serial, k, ui.what_if(run, k))
    got = st.session_state.get("what_if")
    if got and got[0] == run.serial and got[1] == k:
        c = st.columns(2)
        show_branch(c[0], "with the strong drafter", got[2]["always"], run.decode)
        show_branch(c[1], "without the strong drafter", got[2]["never"], run.decode)


def main() -> None:
    st.title("Scheduler")
    ui.settings_sidebar("scheduler")
    run = ensure_records()
    if run is None:
        return
    st.caption(ui.model_caption(run))
    timeline(run)
    what_if(run)


main()

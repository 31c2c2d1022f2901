"""TreeGraft, "Step through": run the real engine one step at a time and watch the shared draft tree.

Thin by design: widgets -> engine (pages/common/ui.py) -> figures (treegraft/viz.py)."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `streamlit run` from anywhere

import streamlit as st

from pages.common import ui
from treegraft import viz

st.set_page_config(page_title="TreeGraft - step through", layout="wide")


def prompt_box() -> str:
    cols = st.columns([1, 3])
    ui.restore("example", next(iter(ui.EXAMPLES)))
    category = cols[0].selectbox("Example prompt", list(ui.EXAMPLES), key="example",
                                 help="one short prompt per benchmark category; edit it freely")
    if st.session_state.get("example_shown") != category:
        # A new example replaces the text; typed text stays until the example changes.
        st.session_state["prompt"] = ui.EXAMPLES[category]
        st.session_state["example_shown"] = category
    ui.restore("prompt", ui.EXAMPLES[category])
    text = cols[1].text_area("Prompt (sent through the target's chat template)", key="prompt", height=90)
    ui.save("example", "prompt")
    return text


def controls() -> dict:
    c = st.columns([1, 1, 1, 1, 1, 2])
    pressed = {"step": c[0].button("Step", key="step", type="primary", help="one target forward"),
           "run_n": c[1].button("Run N steps", key="run_n"),
           "play": c[2].button("Play / Pause", key="play", help="step until the end or until paused"),
           "reset": c[3].button("Reset", key="reset")}
    pressed["n"] = int(c[4].number_input("N", min_value=1, max_value=200, value=8, key="n_steps"))
    pressed["live"] = c[5].checkbox("Compare live", key="live",
                                help="after every Step, also run ar, tree-weak and tree-strong on this prompt to the "
                                     "same length (real runs, so each Step takes longer)")
    return pressed


def act(s: dict, prompt: str, a: dict) -> None:
    if a["reset"]:
        st.session_state.pop("run", None)
        st.session_state["playing"] = False
        return
    if a["play"]:
        st.session_state["playing"] = not st.session_state.get("playing", False)
    if a["step"] or st.session_state.get("playing"):
        n = 1  # Play takes one step per rerun, so Pause can land between steps
    elif a["run_n"]:
        n = a["n"]
    else:
        return
    ok = False
    with ui.guard("step"):
        run = ui.ensure_run(s, prompt)
        if run.engine.done:
            st.info("This run is finished (end of text or max new tokens). Press Reset to start again.")
            st.session_state["playing"] = False
        else:
            ui.step(run, n, live_baselines=a["live"])
        ok = True
    if not ok:
        st.session_state["playing"] = False


def summary(run: ui.Run) -> None:
    recs = run.records
    st.caption(ui.model_caption(run))
    tokens = sum(r.accept_len for r in recs)
    wall = sum(r.wall_s for r in recs)
    m = st.columns(5)
    m[0].metric("Steps (target forwards)", len(recs))
    m[1].metric("Tokens generated", tokens)
    m[2].metric("tau (tokens/forward)", f"{tokens / len(recs):.2f}" if recs else "-")
    m[3].metric("Throughput (tokens/s)", f"{tokens / wall:.1f}" if wall > 0 else "-")
    m[4].metric("Strong drafter calls", sum(r.strong_called for r in recs))


def tree_section(run: ui.Run):
    recs = run.records
    k = len(recs) - 1
    if len(recs) > 1:
        k = st.select_slider("Step to view", options=list(range(len(recs))), value=k,
                             key=f"view_{run.serial}_{len(recs)}")
    rec = recs[k]
    names = viz.stage_names(rec)
    c = st.columns([4, 1])
    stage = c[0].select_slider("Replay this step, stage by stage", options=names, value=names[-1],
                               key=f"stage_{run.serial}_{k}")
    pruned = c[1].checkbox("Show pruned candidates", value=True, key="show_pruned")
    st.caption(viz.STAGE_HELP.get(stage, ""))
    fig = viz.tree_figure(rec, stage, run.decode, show_pruned=pruned)
    st.plotly_chart(fig, key="tree_chart")
    st.markdown(ui.tree_help())
    verdict = (f"Step {rec.step}: {len(rec.selected)} nodes verified, {len(rec.accepted)} accepted + 1 bonus "
               f"= **{rec.accept_len} tokens** ({rec.text!r}); strong drafter "
               f"{'ran' if rec.strong_called else 'skipped'}; step time {rec.wall_s * 1e3:.0f} ms "
               "(" + ", ".join(f"{p} {t * 1e3:.0f} ms" for p, t in rec.times.items()) + ")")
    st.markdown(verdict)
    with st.expander(f"Nodes at stage '{stage}' (table)"):
        st.dataframe(viz.nodes_table(rec, stage, run.decode), hide_index=True)
    return rec, stage, fig


def text_section(run: ui.Run) -> None:
    st.subheader("Generated text")
    st.caption("Each shade is one step's tokens (accepted + bonus); an orange underline means the strong "
               "drafter ran in that step. Hover a span for its step.")
    st.markdown(viz.shaded_text_html(run.records), unsafe_allow_html=True)


def charts(run: ui.Run) -> list:
    st.subheader("Live charts")
    figs = [viz.accept_figure(run.records), viz.throughput_figure(run.runs()), viz.speedup_figure(run.runs())]
    c = st.columns(3)
    for col, fig, key in zip(c, figs, ("accept_chart", "throughput_chart", "speedup_chart")):
        with col:
            st.plotly_chart(fig, key=key)
    if st.button("Compare with baselines", key="baselines",
                 help="run ar, tree-weak and tree-strong (and treegraft if not the current method) on this "
                      "prompt with these settings up to the same number of tokens"):
        with ui.guard("run the baselines"):
            ui.catch_up_baselines(run)
            st.rerun()
    return figs


def exports(run: ui.Run, rec, stage: str, figs: list) -> None:
    st.subheader("Export")
    c = st.columns(3)
    c[0].download_button("Step trace (JSON)", data=run.trace, file_name="treegraft-trace.json",
                         mime="application/json", key="dl_trace")
    c[1].download_button(f"Tree of step {rec.step} (GraphML)", file_name=f"tree-step{rec.step}.graphml",
                         data=lambda: viz.tree_graphml(rec, stage, run.decode), mime="application/xml",
                         key="dl_graphml")

    def charts_html() -> str:
        # plotly.js embedded once, so the file opens offline.
        parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
        return "<html><head><meta charset='utf-8'></head><body>" + "".join(parts) + "</body></html>"
    c[2].download_button("Tree and charts (HTML)", data=charts_html, file_name="treegraft-charts.html",
                         mime="text/html", key="dl_html")


def main() -> None:
    st.title("TreeGraft: step through")
    st.write("A weak and a strong drafter grow one shared draft tree; the target model verifies it in a single "
             "forward pass. Everything below is computed live on real models.")
    s = ui.settings_sidebar("step")
    prompt = prompt_box()
    a = controls()
    act(s, prompt, a)
    run = ui.current_run()
    if run is None or not run.records:
        st.info("Press **Step** to load the models (once) and run the first step.")
        return
    summary(run)
    rec, stage, tree_fig = tree_section(run)
    text_section(run)
    figs = charts(run)
    exports(run, rec, stage, [tree_fig] + figs)
    if st.session_state.get("playing"):
        if run.engine.done:
            st.session_state["playing"] = False
        else:
            time.sleep(0.05)  # lets a Pause click land between steps
            st.rerun()


main()

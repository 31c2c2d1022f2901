"""TreeGraft, "Step through": run the real engine one step at a time and watch the shared draft tree.

Thin by design: widgets -> engine (pages/common/ui.py) -> figures (treegraft/viz.py). This file is
also the app's entry point: it names the pages (st.navigation), so the main page is listed as
"Step through" rather than "app"."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `streamlit run` from anywhere

import streamlit as st

from pages.common import ui
from treegraft import colors, viz

st.set_page_config(page_title="TreeGraft - step through", layout="wide")

PLAY_PAUSE = "Play / Pause"
BANNER_STEPS = 3  # after this many treegraft steps without a strong call, say why and what to try
HOT = 2.0         # temperature above which the page warns


def pick_example() -> None:
    """A new example replaces the text; typed text stays until the example changes."""
    ui.save("example")
    st.session_state["saved_prompt"] = ui.EXAMPLES[st.session_state["example"]]


def prompt_box(run) -> str:
    cols = st.columns([1, 3])
    first = next(iter(ui.EXAMPLES))
    ui.bind("example", first)
    category = cols[0].selectbox("Example prompt", list(ui.EXAMPLES), key="example", on_change=pick_example,
                                 help="one short prompt per benchmark category; edit it freely")
    text = cols[1].text_area("Prompt (sent through the target's chat template)", height=90,
                             **ui.bind("prompt", ui.EXAMPLES[category]))
    cols[1].caption(prompt_size(text, run))
    return text


def prompt_size(text: str, run) -> str:
    """Characters always; tokens once a tokenizer is loaded (the current run's)."""
    if run is None:
        return f"{len(text):,} characters; the token count shows once the models are loaded (first Step)."
    try:
        n = len(ui.encode_prompt(run.trio.tokenizer, text, raw=False)) if text.strip() else 0
    except Exception:  # a tokenizer hiccup must not break the page; the count is a courtesy
        return f"{len(text):,} characters"
    long = f" Prompts over {ui.LONG_PROMPT} tokens prefill with a progress bar." if n > ui.LONG_PROMPT else ""
    return (f"{len(text):,} characters = {n:,} tokens with the chat template "
            f"(context window {run.trio.context_len:,}).{long}")


def controls() -> dict:
    playing = st.session_state.get("playing", False)
    c = st.columns([1, 1, 1, 1, 1, 2])
    pressed = {"step": c[0].button("Step", key="step", type="primary", help="one target forward"),
               "run_n": c[1].button("Run N steps", key="run_n"),
               "play": c[2].button("Pause" if playing else PLAY_PAUSE, key="play",
                                   type="primary" if playing else "secondary",
                                   help="step until the end or until paused"),
               "reset": c[3].button("Reset", key="reset")}
    pressed["n"] = int(c[4].number_input("N", min_value=1, max_value=200, value=8, key="n_steps"))
    pressed["live"] = c[5].checkbox("Compare live", key="live",
                                    help="after every step, also step ar, tree-weak, tree-strong and a re-run of this "
                                         "method on this prompt to the same length, interleaved (real runs: each "
                                         "Step takes longer)")
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


def use_always() -> None:
    ui.settings()["policy"] = "always"  # the sidebar's widget is seeded from the settings on every run


def strong_banner(run: ui.Run) -> None:
    """Say plainly when the view this app exists for (the strong drafter's nodes) is not showing."""
    recs = run.records
    if run.cfg.method in ("ar", "tree-weak"):
        st.info(f"Method **{run.cfg.method}** never calls the strong drafter. Choose **treegraft** in the sidebar to "
                "see both drafters grow one tree.")
        return
    if run.cfg.method != "treegraft" or len(recs) < BANNER_STEPS or any(r.strong_called for r in recs):
        return
    scores = [r.decision.get("score") for r in recs if r.decision and r.decision.get("score") is not None]
    thr = next((r.decision.get("threshold") for r in recs if r.decision and r.decision.get("threshold")), None)
    why = (f"the scheduler's score stayed below its threshold (highest {max(scores):.3f} vs {thr:.3f})"
           if scores and thr is not None else f"policy **{run.cfg.policy}** did not call it")
    c = st.columns([5, 1])
    c[0].warning(f"**Strong drafter not called in {len(recs)} steps**: {why}. No rescored, recovered or grafted "
                 "nodes appear until it is. Try policy **always** to see its work on every step.")
    c[1].button("Use policy always", key="use_always", on_click=use_always,
                help="sets the sidebar's scheduler policy; the next Step starts a new run with it")


def summary(run: ui.Run) -> None:
    recs = run.records
    st.caption(ui.model_caption(run) + (f"; prompt prefilled in {run.prefill_s:.1f} s before step 0 "
                                        f"({len(run.prompt_ids)} tokens, not counted in any step)"
                                        if run.prefill_s >= 0.05 else ""))
    tokens = sum(r.accept_len for r in recs)
    wall = sum(r.wall_s for r in recs)
    calls = sum(r.strong_called for r in recs)
    m = st.columns(5)
    m[0].metric("Steps (target forwards)", len(recs))
    m[1].metric("Tokens generated", tokens)
    m[2].metric("tau (tokens/forward)", f"{tokens / len(recs):.2f}" if recs else "-",
                help="hardware-independent: tokens per target forward; plain decoding has 1.00")
    m[3].metric("Throughput (tokens/s)", f"{tokens / wall:.1f}" if wall > 0 else "-",
                help="measured wall time on this machine; other processes on a shared CPU move it")
    m[4].metric("Strong drafter ran", f"{calls} of {len(recs)} steps")


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
    pruned = c[1].checkbox("Show pruned candidates", value=True, key="show_pruned",
                           help="faded; a pruned subtree is drawn as its top node (hover it for the count)")
    st.caption(viz.STAGE_HELP.get(stage, ""))
    fig = viz.tree_figure(rec, stage, run.decode, show_pruned=pruned)
    st.plotly_chart(fig, key="tree_chart")
    st.markdown(ui.tree_help())
    verdict = (f"Step {rec.step}: {viz.plural(len(rec.selected), 'node')} verified, {viz.token_arithmetic(rec)} "
               f"({rec.text!r}); strong drafter {'ran' if rec.strong_called else 'skipped'}; step time "
               f"{rec.wall_s * 1e3:.0f} ms (" + ", ".join(f"{p} {t * 1e3:.0f} ms" for p, t in rec.times.items()) + ")")
    st.markdown(verdict)
    if rec.strong_called:
        st.markdown(viz.strong_changes(rec))
    elif rec.decision:
        st.caption(f"Scheduler: {rec.decision.get('reason', '')}")
    # A toggle, not an expander: a collapsed expander still builds and ships the table on every Step.
    if st.toggle(f"Show the nodes at stage '{stage}' as a table", key="node_table"):
        st.dataframe(viz.nodes_table(rec, stage, run.decode), hide_index=True)
    return rec, stage, fig


def text_section(run: ui.Run) -> None:
    st.subheader("Generated text")
    st.caption("Each shade is one step's tokens (accepted + bonus); a red underline means the strong drafter ran "
               "in that step. Hover a span for its step.")
    st.markdown(viz.shaded_text_html(run.records), unsafe_allow_html=True)


SPEED_NOTE = ("**Why wall times move.** This machine's CPU cores are shared: while another process runs, whichever "
              "method is stepping at that moment slows down, so two runs of the same method can differ by tens of "
              "percent. The comparison therefore re-runs every method (this one too) interleaved step by step on "
              "this prompt, so they share the same moments of load, and shows beside the wall-time speedup "
              "tokens per target forward (tau; ar's is 1), which load cannot move at all, and an estimate from "
              "the median step cost (tau x median ar step / median step of the method), which bursts of load "
              "barely move. On a small target on a "
              "CPU, drafting and tree verification cost more than they save, so wall-time speedups below 1x are "
              "real here; tau shows what the tree buys per target forward.")


def charts(run: ui.Run) -> list:
    st.subheader("Live charts")
    runs = run.runs()
    raced = bool(run.race)
    figs = [viz.accept_figure(run.records)]
    st.plotly_chart(figs[0], key="accept_chart")
    # A toggle, like the node table's: a collapsed expander would still build the table on every Step.
    if st.toggle("Show where the accepted tokens came from (this run, by provenance and depth)", key="provenance"):
        st.caption("Nodes sent to the target over every step so far, by who proposed them and their depth in the "
                   "tree; each cell: accepted / sent (acceptance rate). A node rescored by the strong drafter "
                   "counts as rescored, one only the strong drafter proposed as recovered or grafted.")
        table = viz.provenance_table(run.records)
        if table.empty:
            st.caption("No draft was sent to the target yet (ar drafts nothing).")
        else:
            st.dataframe(table, hide_index=True)
    behind = raced and run.race_tokens < len(run.engine.new_tokens)
    c = st.columns([1, 3])
    if c[0].button("Compare with baselines" if not raced else "Bring the comparison up to date",
                   key="baselines", disabled=raced and not behind,
                   help="re-run ar, tree-weak, tree-strong and treegraft (this method included) on this prompt with "
                        "these settings up to the same number of tokens, interleaved step by step"):
        with ui.guard("run the baselines"):
            ui.race(run)
            st.rerun()
    if not raced:
        # The speed charts appear once there is something to compare: a page that draws three charts of
        # one line each on every Step only makes each Step slower to render.
        c[1].caption("Speed charts (tokens vs wall time, running speedup vs ar, speedup three ways) appear once the "
                     "methods have been compared on this prompt. Tick **Compare live** to keep them in step.")
        st.markdown(SPEED_NOTE)
        return figs
    if behind:
        c[1].caption(f"The comparison covers the first {run.race_tokens} tokens; the run has "
                     f"{len(run.engine.new_tokens)}. Tick **Compare live** to keep it in step.")
    st.caption(f"**Interleaved race**: every method re-run on this prompt and these settings to "
               f"{run.race_tokens} tokens, the one furthest behind stepping next, so all share the same moments of "
               "load. Prefill excluded everywhere.")
    figs += [viz.throughput_figure(runs, title="Tokens vs wall time (race)"),
             viz.speedup_figure(runs, title="Running speedup vs ar (wall time)"),
             viz.speed_modes_figure(runs)]
    cols = st.columns(3)
    for col, fig, key in zip(cols, figs[1:], ("throughput_chart", "speedup_chart", "speed_modes_chart")):
        with col:
            st.plotly_chart(fig, key=key)
    st.dataframe(viz.speed_table(runs).round(3), hide_index=True)
    st.markdown(SPEED_NOTE)
    return figs


def exports(run: ui.Run, rec, stage: str, figs: list) -> None:
    st.subheader("Export")
    c = st.columns(3)
    c[0].download_button("Step trace (JSON)", data=run.trace, file_name="treegraft-trace.json",
                         mime="application/json", key="dl_trace", on_click="ignore")
    c[1].download_button(f"Tree of step {rec.step} (GraphML)", file_name=f"tree-step{rec.step}.graphml",
                         data=lambda: viz.tree_graphml(rec, stage, run.decode), mime="application/xml",
                         key="dl_graphml", on_click="ignore")

    def charts_html() -> str:
        # plotly.js embedded once, so the file opens offline.
        parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
        return "<html><head><meta charset='utf-8'></head><body>" + "".join(parts) + "</body></html>"
    c[2].download_button("Tree and charts (HTML)", data=charts_html, file_name="treegraft-charts.html",
                         mime="text/html", key="dl_html", on_click="ignore")


def step_through() -> None:
    st.title("TreeGraft: step through")
    st.write("A weak and a strong drafter grow one shared draft tree; the target model verifies it in a single "
             "forward pass. Everything below is computed live on real models.")
    s = ui.settings_sidebar("step")
    run = ui.current_run()
    prompt = prompt_box(run)
    if float(s["temperature"]) > HOT:
        st.warning(f"Temperature {float(s['temperature']):.2f} is above {HOT:g}: the target's distribution is nearly "
                   "flat, the text turns to noise and drafts are rarely accepted. Output stays lossless (it is what "
                   "the target would sample), it is just not useful text.")
    a = controls()
    try:  # every check that needs no model, on every rerun: bad input never meets a stale run
        ui.validate(s, prompt)
    except ui.USER_ERRORS as e:
        st.error(f"Cannot run with these settings: {e}")
        st.session_state["playing"] = False
        if run is not None:
            st.caption("The previous run is hidden until the settings are valid again (or press Reset).")
        return
    act(s, prompt, a)
    run = ui.current_run()
    if st.session_state.get("playing"):
        st.info(f"Playing: step {len(run.records) if run else 0} done; press **Pause** to stop between steps.",
                icon=":material/play_circle:")
    if run is None or not run.records:
        st.info("Press **Step** to load the models (once) and run the first step. The strong drafter runs on every "
                "step by default (policy **always**), so its rescored, recovered and grafted nodes show from the "
                "first step; pick **learned** in the sidebar for the distilled scheduler.")
        return
    stale = ui.changed_settings(run, s, prompt)
    if stale:
        st.warning("**These results belong to the previous settings** (changed: " + "; ".join(stale)[:400] +
                   "). Press **Step** to start a new run with the new settings.")
        # Greyed, not gone: the old run stays readable while it is clearly marked as old.
        st.markdown("<style>.st-key-results {opacity: 0.45; filter: grayscale(0.8);}</style>",
                    unsafe_allow_html=True)
    with st.container(key="results"):
        summary(run)
        strong_banner(run)
        rec, stage, tree_fig = tree_section(run)
        text_section(run)
        figs = charts(run)
        exports(run, rec, stage, [tree_fig] + figs)
    if st.session_state.get("playing"):
        if run.engine.done:
            st.session_state["playing"] = False
            st.rerun()  # redraw the controls: the button says Play again
        else:
            time.sleep(0.05)  # lets a Pause click land between steps
            st.rerun()


nav = st.navigation([st.Page(step_through, title="Step through", icon=":material/account_tree:", default=True),
                     st.Page("pages/1_Scheduler.py", title="Scheduler", icon=":material/schedule:"),
                     st.Page("pages/2_Benchmarks.py", title="Benchmarks", icon=":material/bar_chart:"),
                     st.Page("pages/3_How_it_works.py", title="How it works", icon=":material/school:")])
nav.run()

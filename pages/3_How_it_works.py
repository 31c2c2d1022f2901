"""How it works: one real TreeGraft step, replayed stage by stage, for teaching."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st

from pages.common import ui
from treegraft import viz

st.set_page_config(page_title="TreeGraft - how it works", layout="wide")

INTRO = """Speculative decoding makes a large **target** model emit several tokens per forward pass: cheap
**drafters** guess a *tree* of continuations, and the target checks the whole tree at once, keeping the longest
branch it agrees with. TreeGraft uses two drafters on one shared tree: a **weak** one that is nearly free and
always runs, and a **strong** one that is better but costs more, called only when the **scheduler** expects it
to pay off. The strong drafter never throws the weak tree away: it rescores it, recovers tokens the weak one
missed, and grafts new subtrees where the refined scores point."""


def teaching_value(r) -> tuple:
    """Prefer a step where the strong drafter ran and the target accepted some of its work, then
    one where it ran and anything was accepted, then the longest accepted path."""
    from treegraft.record import provenance_summary
    p = provenance_summary(r)
    return (r.strong_called, p["accepted_from_strong"] > 0, p["accepted_kept"], r.step)


def pick_step(run: ui.Run):
    recs = run.records
    # Teach on a step where the strong drafter ran (it has every stage) and something was accepted.
    default = max(recs, key=teaching_value).step
    k = st.selectbox("Step to explain", options=[r.step for r in recs], index=default, key="walk_step",
                     format_func=lambda i: f"step {i}" + (" (strong drafter ran)" if recs[i].strong_called else ""))
    rec = recs[k]
    if not any(r.strong_called for r in recs):
        st.info(f"No step of this run called the strong drafter (method {run.cfg.method}, policy {run.cfg.policy}), "
                "so the rescore / recover / graft stages are missing below.")
        if st.button("Rerun this step with the strong drafter", key="walk_strong",
                     help="the same prefix, policy always; the run itself is not changed"):
            with ui.guard("rerun the step"):
                st.session_state["walk_extra"] = (run.serial, k, ui.what_if(run, k)["always"])
        got = st.session_state.get("walk_extra")
        if got and got[:2] == (run.serial, k):
            st.caption(f"Showing step {k} rerun with the strong drafter (policy always), from the same prefix.")
            return got[2]
    return rec


def explain(rec, stage: str) -> str:
    d = viz.stage_diff(rec, stage)
    added = ", ".join(f"{n} {p}" for p, n in d["added_by_provenance"].items() if n)
    facts = [f"{d['nodes']} nodes in the pool"]
    if d["added"]:
        facts.append(f"{d['added']} new ({added})")
    if d["newly_rescored"]:
        facts.append(f"{d['newly_rescored']} newly scored by the strong drafter")
    if stage == "grafted":
        facts.append(f"{d['graft_points']} graft points")
    if stage in viz.FINAL_STAGES:
        facts.append(f"{d['selected']} selected for the target")
    if stage == "verified":
        facts.append(f"{viz.token_arithmetic(rec)}: {rec.text!r}")
        if rec.strong_called:
            facts.append(viz.strong_changes(rec).rstrip("."))
    t = {"rescored": "rescore", "recovered": "recover", "grafted": "graft"}.get(stage)
    if t and t in rec.stage_times:
        facts.append(f"took {rec.stage_times[t] * 1e3:.0f} ms")
    return "; ".join(facts) + "."


def walkthrough(run: ui.Run) -> None:
    rec = pick_step(run)
    names = viz.stage_names(rec)
    key = f"walk_stage_{run.serial}_{rec.step}"
    c = st.columns([1, 1, 5])
    # Buttons come before the slider: its state may only be changed before it is drawn.
    for col, label, move in ((c[0], "< Previous", -1), (c[1], "Next >", 1)):
        if col.button(label, key=f"walk_{move}"):
            i = names.index(st.session_state.get(key, names[0]))
            st.session_state[key] = names[max(0, min(len(names) - 1, i + move))]
    stage = st.select_slider("Stage", options=names, key=key)  # starts at the first stage
    i = names.index(stage)
    st.subheader(f"{i + 1}/{len(names)}. {stage}")
    st.write(viz.STAGE_HELP.get(stage, ""))
    st.info(explain(rec, stage))
    if rec.decision and stage == names[0]:
        d = rec.decision
        verdict = {"call": "**call** the strong drafter",
                   "solo": "**verify the strong drafter's tree alone**, no weak pool",
                   "skip": "**skip** the strong drafter"}[viz.step_kind(rec)]
        st.write(f"Next, the **scheduler** ({d['policy']}) looks at cheap features of this pool and decides: "
                 f"{verdict} ({d['reason']}).")
    st.plotly_chart(viz.tree_figure(rec, stage, run.decode, show_pruned=stage in viz.FINAL_STAGES),
                    key="walk_tree")
    st.markdown(ui.tree_help())
    times = ", ".join(f"{p} {t * 1e3:.0f} ms" for p, t in rec.times.items())
    st.caption(f"Measured time of this step by phase: {times} (total {rec.wall_s * 1e3:.0f} ms).")


def main() -> None:
    st.title("How it works")
    st.markdown(INTRO)
    ui.settings_sidebar("how")
    run = ui.current_run()
    if run is None or not run.records:
        st.info("This page explains a real step. Run one now (TreeGraft, sidebar settings, the main page's prompt).")
        if st.button("Run one real step", key="walk_run"):
            with ui.guard("run a step"):
                ui.one_step_run(ui.settings(), ui.prompt_text())
                st.rerun()
        return
    st.caption(ui.model_caption(run))
    walkthrough(run)


main()

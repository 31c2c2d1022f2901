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


def learned_verdicts(run: ui.Run) -> list[dict] | None:
    """What the distilled scheduler would have said on each step, from the recorded features: pure
    arithmetic, no forward. Lets a run under `always` show where `learned` would have called."""
    try:
        from treegraft.fastpath import hardware_class
        from treegraft.schedule import make_policy, scheduler_for
        pol = make_policy("learned", path=run.cfg.scheduler_path or scheduler_for(run.trio.trio, run.trio.pair),
                          int8=run.trio.int8, hardware=hardware_class(run.trio.device))
    except Exception:  # no scheduler shipped (or moved): the page simply omits the comparison
        return None
    if getattr(pol, "arm", "gain") != "gain":  # a fixed arm for this pair: nothing per step to ask
        return [{"arm": pol.why()}]
    out = []
    for r in run.records:
        feats = (r.decision or {}).get("features")
        if not feats:
            return None
        d = pol.decide(feats, r.step)
        out.append({"step": r.step, "score": d.score, "threshold": d.threshold, "call": d.call})
    return out


def timeline(run: ui.Run) -> None:
    st.subheader("Decision timeline")
    if run.cfg.method != "treegraft":
        st.warning(f"This run uses method {run.cfg.method!r}: only treegraft has a scheduler.")
        return
    st.caption(f"Policy **{run.cfg.policy}**. Red: the strong drafter was called; grey: skipped; a red star: a "
               "solo step, the strong drafter's tree verified alone (no weak pool, so its features were read on "
               "the strong tree). A score and "
               "threshold appear for the learned policy; the oracle's measured gain (tokens/s with minus without "
               "the strong drafter) appears where the oracle ran.")
    st.plotly_chart(viz.decision_figure(run.records), key="decision_chart")
    shadow = learned_verdicts(run) if run.cfg.policy != "learned" else None
    if shadow and "arm" in shadow[0]:
        st.info(f"Under policy **learned** this pair plays one {shadow[0]['arm']}.")
    elif shadow:
        calls = sum(v["call"] for v in shadow)
        st.info(f"Under policy **learned** (the distilled scheduler, same features, no forward needed to ask it) the "
                f"strong drafter would have been called on {calls} of {len(shadow)} of these steps "
                f"(score {min(v['score'] for v in shadow):.3f} to {max(v['score'] for v in shadow):.3f}, "
                f"threshold {shadow[0]['threshold']:.3f}).")
    st.plotly_chart(viz.features_figure(run.records), key="features_chart")
    st.dataframe(viz.decisions_table(run.records), hide_index=True)


def show_branch(col, name: str, rec, decode) -> None:
    col.markdown(f"**{name}**: {viz.token_arithmetic(rec)} ({rec.text!r}) in {rec.wall_s * 1e3:.0f} ms = "
                 f"{rec.accept_len / rec.wall_s:.1f} tokens/s")
    if rec.strong_called:
        col.caption(viz.strong_changes(rec))
    col.plotly_chart(viz.tree_figure(rec, "verified", decode, show_pruned=False,
                                     title=f"{name}: {viz.plural(len(rec.selected), 'node')} verified"),
                     key=f"whatif_{name.split()[0]}")


def what_if(run: ui.Run) -> None:
    st.subheader("What if the scheduler had decided the other way?")
    st.caption("Rebuilds the engine from the same prefix (prompt + tokens accepted before that step) and prefills it "
               "outside the timed step, as the live run was, then runs that one step with the strong drafter forced "
               "on and forced off. Real forwards, real times; with sampling both branches start from the run's seed. "
               "**What differs from the live step**: the strong drafter starts fully caught up (live, it re-reads the "
               "previous step's tokens, and after skipped steps every token it missed), and the two branches run at "
               "another moment of a shared CPU, so compare the two branches with each other first.")
    k = st.selectbox("Step", options=list(range(len(run.records))), index=len(run.records) - 1, key="whatif_step")
    orig = run.records[k]
    st.write(f"Originally: strong drafter {'called' if orig.strong_called else 'skipped'}, "
             f"{viz.plural(orig.accept_len, 'token')} in {orig.wall_s * 1e3:.0f} ms "
             f"(phases: " + ", ".join(f"{p} {t * 1e3:.0f} ms" for p, t in orig.times.items()) + ").")
    if st.button("Rerun this step both ways", key="whatif_go"):
        with ui.guard("rerun the step"):
            with st.spinner("running the step twice ..."):
                st.session_state["what_if"] = (run.serial, k, ui.what_if(run, k))
    got = st.session_state.get("what_if")
    if got and got[0] == run.serial and got[1] == k:
        same = got[2]["always" if orig.strong_called else "never"]
        if run.cfg.temperature == 0:
            st.caption(f"The branch that decides as the live step did produced "
                       f"{'the same' if same.new_tokens == orig.new_tokens else 'DIFFERENT'} tokens "
                       f"({same.wall_s * 1e3:.0f} ms here vs {orig.wall_s * 1e3:.0f} ms live).")
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

"""Streamlit glue shared by the app's pages: settings, cached model loading, the live run, and
error handling. Thin on purpose: the engine computes, treegraft.viz draws, this only wires them.

Lives in pages/common/ (a sub-folder) so Streamlit does not list it as a page."""

from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache

import streamlit as st

from treegraft import viz
from treegraft.options import encode_prompt
from treegraft.engine import METHODS, ConfigError, Engine, GenConfig
from treegraft.graft import GraftConfig
from treegraft.models import INT8_ROLES, ModelLoadError, load_trio
from treegraft.trios import TRIOS, draft_vocab_defaults
from treegraft.record import StepRecord, dumps_trace

# Errors a user can cause with their input: shown as st.error with the engine's own message.
USER_ERRORS = (ConfigError, ModelLoadError, FileNotFoundError, NotImplementedError, ValueError)

EXAMPLES = {
    "writing": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "coding": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "math": "A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? Explain step by step.",
    "qa": "What is the capital of Australia, and why was it chosen?",
    "summarization": "Summarize in one sentence: The city council voted on Tuesday to expand the bike lane "
                     "network by 40 kilometres over the next three years, citing a rise in cycling commuters "
                     "and fewer traffic injuries on streets that already have protected lanes.",
    "translation": "Translate to French: The weather is nice today, so we will have lunch in the park.",
}
BASELINES = ("ar", "tree-weak", "tree-strong", "treegraft")
APP_POLICY = "always"
PREFILL_CHUNK = 256      # prompt tokens per prefill forward (a progress bar moves between chunks)
LONG_PROMPT = 512        # from this many prompt tokens on, the prefill shows progress
MAX_PROMPT_CHARS = 200_000


# ---------------------------------------------------------------- errors

@contextmanager
def guard(what: str):
    """Show bad input as st.error with its specific message; never a traceback in the page.
    Streamlit's own control flow (rerun, stop) derives from BaseException and passes through."""
    try:
        yield
    except USER_ERRORS as e:
        st.error(f"Cannot {what}: {e}")
    except Exception as e:  # a bug, not the user's fault: short message here, details in the log
        traceback.print_exc(file=sys.stderr)
        st.error(f"Unexpected error while trying to {what} ({type(e).__name__}): {e}. "
                 "Details are in the server log.")


# ---------------------------------------------------------------- settings

# The "Drafter heads" choices: the load_trio draft_vocab each stands for (None: the trio's default).
DRAFT_VOCABS = {"trio default": None, "full": 0, "4096": 4096, "8192": 8192, "16384": 16384, "32768": 32768}

def policies() -> list[str]:
    from treegraft.schedule import default_policy
    names = ["always", "never", "every-k", "when-empty", "when-unsure", "when-matched", "strong-first", "oracle"]
    return (["learned"] + names) if default_policy() == "learned" else names


def defaults() -> dict:
    from treegraft.schedule import default_policy
    g = GraftConfig()
    return {"trio": "smollm2", "target": "default", "weak": "default", "strong": "default",
            # Env overrides let tests and headless runs pin device/dtype without clicking.
            "device": os.environ.get("TREEGRAFT_DEVICE", "auto"),
            "dtype": os.environ.get("TREEGRAFT_DTYPE", "auto"), "int8": "none",
            "draft_vocab": "trio default",
            # The app teaches: its default policy calls the strong drafter on every step, so its work
            # (rescored, recovered, grafted nodes) is on screen from the first Step. The distilled
            # scheduler (`learned`, the CLI's default) is one click away in the sidebar.
            "method": "treegraft", "policy": APP_POLICY, "every_k": 2, "unsure": 2.0, "sure": 3.0,
            "budget": 16, "auto_budget": False, "depth": 6, "topk": 4, "max_new_tokens": 64,
            "temperature": 0.0, "top_p": 1.0, "seed": 0,
            "rescore_m": g.rescore_m, "recover_k": g.recover_k, "graft_g": g.graft_g, "graft_h": g.graft_h,
            "graft_k": g.graft_k, "blend": g.blend, "strong_context": g.strong_context}


def restore(key: str, default) -> None:
    """Streamlit drops a widget's state on another page; seed it back from our saved copy."""
    if key not in st.session_state:
        st.session_state[key] = st.session_state.get(f"saved_{key}", default)


def save(*keys: str) -> None:
    for key in keys:
        st.session_state[f"saved_{key}"] = st.session_state[key]


def bind(key: str, default) -> dict:
    """Keep a widget's value in our own copy (saved_<key>) and seed the widget from it on EVERY run:
    Streamlit may reset a widget to its default when a page is (re)entered, even the page it is on
    (st.navigation), and a seed only on page changes misses that. Returns the widget's keyword
    arguments (key, on_change) that store each user change before the script runs."""
    saved = f"saved_{key}"
    if saved not in st.session_state:
        st.session_state[saved] = st.session_state.get(key, default)
    st.session_state[key] = st.session_state[saved]
    return {"key": key, "on_change": save, "args": (key,)}


def prompt_text() -> str:
    """The prompt typed on the main page (or the first example), for pages that start a run."""
    return st.session_state.get("saved_prompt") or next(iter(EXAMPLES.values()))


def settings() -> dict:
    if "settings" not in st.session_state:
        st.session_state["settings"] = defaults()
    return st.session_state["settings"]


def _widget(kind, label: str, name: str, seed: bool, **kw):
    """A sidebar widget bound to settings[name]. A widget on another page is another widget to
    Streamlit (its state does not carry over), so the value lives in st.session_state["settings"]
    and seeds the widget on every run (`seed` is kept for callers; every run seeds now)."""
    s, key = settings(), f"w_{name}"
    # Seeded on every run, not only on page changes (see bind); a change is stored by the callback
    # before the script runs, so the seed is always the user's latest value.
    st.session_state[key] = s[name]
    s[name] = kind(label, key=key, on_change=_store, args=(name,), **kw)
    return s[name]


def _store(name: str) -> None:
    settings()[name] = st.session_state[f"w_{name}"]


def settings_sidebar(page: str) -> dict:
    seed = st.session_state.get("settings_page") != page
    st.session_state["settings_page"] = page
    sb = st.sidebar
    with sb.expander("Models", expanded=False):
        _widget(st.selectbox, "Trio", "trio", seed, options=sorted(TRIOS),
                help="; ".join(f"{name}: {spec.note}" for name, spec in sorted(TRIOS.items())) +
                ". qwen-coder needs ~11 GB of memory and its first load builds a cache (minutes).")
        _widget(st.text_input, "Target", "target", seed, help="'default' (the trio's target), a named model "
                "(qwen-coder-1.5b), a local directory, a .gguf file, or a Hugging Face id already in the local cache")
        _widget(st.text_input, "Weak drafter", "weak", seed, help="'default' = the trio's weak drafter "
                "(smollm2: assets/drafters/weak; qwen-coder: ngram), or ngram, asset:strong, a directory, ...")
        _widget(st.text_input, "Strong drafter", "strong", seed, help="'default' = the trio's strong drafter "
                "(smollm2: assets/drafters/strong; qwen-coder: qwen-coder-0.5b), or ngram, a directory, ...")
        _widget(st.selectbox, "Device", "device", seed, options=["auto", "cpu", "cuda"])
        _widget(st.selectbox, "Dtype", "dtype", seed, options=["auto", "float32", "bfloat16"],
                help="auto = bfloat16 where the CPU/GPU has it; exactness checks want float32")
        _widget(st.selectbox, "int8 drafters (CPU)", "int8", seed, options=list(INT8_ROLES),
                help="run these standalone drafters (e.g. qwen-coder-0.5b) in int8 on the CPU: faster drafting, "
                     "maybe fewer accepted tokens; the target is never quantized, so the output is unchanged")
        _widget(st.selectbox, "Drafter heads", "draft_vocab", seed, options=list(DRAFT_VOCABS),
                help="cut each drafter's output head to the target's K most frequent tokens, plus each prompt's "
                     "own tokens for its generation: a cheaper drafter forward; the target still checks every "
                     "token, so the output is unchanged. 'trio default': "
                     + draft_vocab_defaults())
    with sb.expander("Tree and decoding", expanded=True):
        _widget(st.selectbox, "Method", "method", seed, options=list(METHODS))
        _widget(st.selectbox, "Scheduler policy", "policy", seed, options=policies(),
                help="when TreeGraft calls the strong drafter; when-matched (for prompt lookup as the strong "
                     "drafter) calls it only where the context at the root matches an earlier n-gram")
        _widget(st.number_input, "every k (for every-k)", "every_k", seed, step=1, min_value=1)
        _widget(st.number_input, "tokens (for when-unsure)", "unsure", seed, step=0.25,
                help="when-unsure calls the strong drafter where the weak tree expects fewer tokens "
                     "than this (bonus included; 2 = less than one accepted draft token)")
        _widget(st.number_input, "tokens (for strong-first)", "sure", seed, step=0.25,
                help="strong-first lets the strong drafter draft first and verifies its tree alone where it "
                     "expects at least this many tokens (bonus included); elsewhere the weak pool is drafted "
                     "and when-unsure decides the call")
        # No min/max here on purpose: the engine's own check explains an impossible value.
        _widget(st.number_input, "Budget N (tree nodes sent to the target)", "budget", seed, step=1)
        _widget(st.checkbox, "Size the tree to this machine (auto)", "auto_budget", seed,
                help="per step, the N (at most Budget N) and the drafter levels with the most expected "
                     "tokens per second on this machine's measured cost curve (the command line's "
                     "default); the first use measures the curve (seconds)")
        _widget(st.number_input, "Depth D (tokens)", "depth", seed, step=1)
        _widget(st.number_input, "Top-k children per node", "topk", seed, step=1)
        _widget(st.number_input, "Max new tokens", "max_new_tokens", seed, step=8)
        _widget(st.number_input, "Temperature (0 = greedy)", "temperature", seed, step=0.1, format="%.2f")
        _widget(st.number_input, "Top-p", "top_p", seed, step=0.05, format="%.2f")
        _widget(st.number_input, "Seed", "seed", seed, step=1)
    with sb.expander("TreeGraft refinement", expanded=False):
        _widget(st.number_input, "M: pool nodes rescored", "rescore_m", seed, step=1)
        _widget(st.number_input, "k_r: strong top-k recovered per parent", "recover_k", seed, step=1)
        _widget(st.number_input, "G: graft positions", "graft_g", seed, step=1)
        _widget(st.number_input, "h: graft depth (tokens)", "graft_h", seed, step=1)
        _widget(st.number_input, "children per graft node", "graft_k", seed, step=1)
        _widget(st.number_input, "blend (weight of log q_strong)", "blend", seed, step=0.1, format="%.2f")
        _widget(st.number_input, "W: strong drafter's window (tokens, 0 = all)", "strong_context", seed, step=32,
                help="the strong drafter reads only the last W tokens of the context it first sees: its "
                     "prompt prefill, a first call's one-time cost, shrinks to W tokens; the target still "
                     "verifies every token")
    return settings()


def validate(s: dict, prompt: str) -> GenConfig:
    """Every check that needs no model: run before anything says "starting a new run"."""
    cfg = make_config(s)
    if not prompt or not prompt.strip():
        raise ConfigError("the prompt is empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"the prompt has {len(prompt):,} characters; the limit here is {MAX_PROMPT_CHARS:,}")
    if any(not str(s[k]).strip() for k in ("target", "weak", "strong")):
        raise ModelLoadError("a model field is empty; use 'default', a local path or a cached Hugging Face id")
    return cfg


def make_config(s: dict, **override) -> GenConfig:
    graft = GraftConfig(rescore_m=int(s["rescore_m"]), recover_k=int(s["recover_k"]), graft_g=int(s["graft_g"]),
                        graft_h=int(s["graft_h"]), graft_k=int(s["graft_k"]), blend=float(s["blend"]),
                        strong_context=int(s.get("strong_context", 0)))
    cfg = GenConfig(method=s["method"], max_new_tokens=int(s["max_new_tokens"]), budget=int(s["budget"]),
                    auto_budget=bool(s.get("auto_budget", False)),
                    depth=int(s["depth"]), topk=int(s["topk"]), temperature=float(s["temperature"]),
                    top_p=float(s["top_p"]), seed=int(s["seed"]), policy=s["policy"],
                    every_k=int(s["every_k"]), unsure=float(s.get("unsure", 2.0)),
                    sure=float(s.get("sure", 3.0)), graft=graft, record_stages=True)
    cfg = replace(cfg, **override)
    cfg.check()
    return cfg


# ---------------------------------------------------------------- models

@st.cache_resource(show_spinner=False, max_entries=1)  # one trio in memory: qwen-coder alone is ~11 GB
def cached_trio(trio: str, target: str, weak: str, strong: str, device: str, dtype: str, int8: str = "none",
                draft_vocab: str = "trio default"):
    threads = os.environ.get("TREEGRAFT_THREADS")
    if threads:  # a busy shared CPU runs small models faster on fewer threads
        import torch
        torch.set_num_threads(int(threads))
    return load_trio(target.strip(), weak.strip(), strong.strip(),
                     None if device == "auto" else device, None if dtype == "auto" else dtype, trio=trio,
                     int8=int8, draft_vocab=DRAFT_VOCABS[draft_vocab])


def trio_for(s: dict):
    specs = tuple(s[k] for k in ("trio", "target", "weak", "strong", "device", "dtype")) + \
        (s.get("int8", "none"), s.get("draft_vocab", "trio default"))
    if any(not str(x).strip() for x in specs[1:4]):
        raise ModelLoadError("a model field is empty; use 'default', a local path or a cached Hugging Face id")
    with st.spinner(f"Loading models (trio {specs[0]}: target {specs[1]}, weak {specs[2]}, strong {specs[3]}) ..."):
        return cached_trio(*specs)


@lru_cache(maxsize=8)
def decoder(tokenizer):
    @lru_cache(maxsize=65536)
    def decode(token: int) -> str:
        return tokenizer.decode([token])
    return decode


# ---------------------------------------------------------------- the live run

@dataclass
class Run:
    """One prompt under one configuration: the engine, its records, and baselines on the same prompt."""
    key: tuple
    trio: object
    cfg: GenConfig
    prompt: str
    prompt_ids: list[int]
    engine: Engine
    race: dict = field(default_factory=dict)        # method -> Engine, every method re-run interleaved
    serial: int = 0
    prefill_s: float = 0.0                          # prompt prefill before step 0 (not in any step's time)

    @property
    def records(self) -> list[StepRecord]:
        return self.engine.records

    @property
    def decode(self):
        return decoder(self.trio.tokenizer)

    def runs(self) -> dict[str, list[StepRecord]]:
        """What the speed charts compare: the interleaved race once there is one (every method, the
        current one re-run too, so all of them share the same moments of a shared CPU), else this run."""
        if self.race:
            return {m: e.records for m, e in self.race.items() if e.records}
        return {self.cfg.method: self.records}

    @property
    def race_tokens(self) -> int:
        return min((len(e.new_tokens) for e in self.race.values()), default=0)

    def trace(self) -> str:
        meta = {"prompt": self.prompt, "prompt_ids": self.prompt_ids, "names": self.trio.names,
                "config": {k: v for k, v in vars(self.cfg).items() if k != "graft"} | {"graft": vars(self.cfg.graft)},
                "device": str(self.trio.device), "dtype": str(self.trio.dtype).replace("torch.", "")}
        return dumps_trace(self.records, meta)


def run_key(s: dict, prompt: str) -> tuple:
    return tuple(sorted(s.items())) + (prompt,)


def current_run() -> Run | None:
    return st.session_state.get("run")


def prefill(engine: Engine, ids: list[int], runners=None, label: str = "") -> float:
    """Feed the prompt (all but its last token, which each step feeds as the root) to the models
    the method uses, in chunks, so a long prompt shows progress instead of one silent minute inside
    step 0. Every run in the app is prefilled this way, so step times and speed comparisons never
    include the prompt. Returns the seconds it took."""
    import time
    if len(ids) < 2:
        return 0.0
    method = engine.cfg.method
    runners = runners or [engine.target] + ([engine.weak] if method in ("tree-weak", "treegraft") else []) \
        + ([engine.strong] if method in ("tree-strong", "treegraft") else [])
    total = (len(ids) - 1) * len(runners)
    bar = st.progress(0.0, text=f"prefilling {len(ids) - 1} prompt tokens{label}") if len(ids) > LONG_PROMPT else None
    t0, done = time.perf_counter(), 0
    for r in runners:  # the target first: a feature drafter reads its hidden states
        for end in range(PREFILL_CHUNK, len(ids) - 1 + PREFILL_CHUNK, PREFILL_CHUNK):
            end = min(end, len(ids) - 1)
            if end > r.n:
                done += end - r.n
                r.catch_up(ids[:end])
                if bar:
                    bar.progress(min(1.0, done / total),
                                 text=f"prefilling the {r.name}: {end} of {len(ids) - 1} prompt tokens{label}")
    if bar:
        bar.empty()
    return time.perf_counter() - t0


def new_run(s: dict, prompt: str) -> Run:
    """Validate everything before loading anything heavy, then build and start the engine."""
    cfg = validate(s, prompt)
    trio = trio_for(s)
    ids = encode_prompt(trio.tokenizer, prompt, raw=False)
    engine = Engine(trio, cfg)
    engine.start(ids)
    st.session_state.pop("run", None)  # never leave the previous run on screen once this one starts
    spent = prefill(engine, ids)
    serial = st.session_state.get("run_serial", 0) + 1
    st.session_state["run_serial"] = serial
    run = Run(run_key(s, prompt), trio, cfg, prompt, ids, engine, serial=serial, prefill_s=spent)
    st.session_state["run"] = run
    return run


def ensure_run(s: dict, prompt: str) -> Run:
    run = current_run()
    if run is None or run.key != run_key(s, prompt):
        validate(s, prompt)  # a bad setting raises here: nothing is announced, nothing is kept
        if run is not None:
            st.session_state.pop("run", None)
            st.toast("Settings or prompt changed: started a new run.")
        run = new_run(s, prompt)
    return run


def changed_settings(run: Run, s: dict, prompt: str) -> list[str]:
    """Which settings differ from the ones the run was made with (for the stale-results banner)."""
    old = dict(k for k in run.key[:-1])
    out = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in sorted(s.items()) if old.get(k) != v]
    if run.key[-1] != prompt:
        out.append("the prompt")
    return out


def step(run: Run, n: int = 1, live_baselines: bool = False) -> int:
    """Up to n engine steps with a progress bar; returns how many ran. With live_baselines, after
    each step the interleaved race (every method) is brought to the same length."""
    bar = st.progress(0.0, text="stepping") if n > 1 else None
    done = 0
    for i in range(n):
        if run.engine.done:
            break
        run.engine.step()
        done += 1
        if live_baselines:
            race(run)
        if bar:
            bar.progress((i + 1) / n, text=f"step {i + 1} of {n}")
    if bar:
        bar.empty()
    return done


def race(run: Run, tokens: int | None = None) -> None:
    """Run every method (ar, tree-weak, tree-strong, treegraft; the current method re-run too) on
    this prompt and settings to `tokens` tokens (default: as many as the main run has), interleaved
    step by step: the method furthest behind always steps next, so all of them share the same
    moments of a shared CPU, as the bench interleaves methods prompt by prompt. Greedy outputs equal
    the main run's; times are measured like the main run's (prefill excluded)."""
    tokens = len(run.engine.new_tokens) if tokens is None else tokens
    methods = list(dict.fromkeys([*BASELINES, run.cfg.method]))
    bar = st.progress(0.0, text="interleaved race")
    for j, m in enumerate(methods):
        if m not in run.race:
            eng = Engine(run.trio, replace(run.cfg, method=m, record_stages=False))
            eng.start(run.prompt_ids)
            prefill(eng, run.prompt_ids, label=f" for {m}")
            run.race[m] = eng

    def behind():
        live = [(len(e.new_tokens) / max(1, tokens), m) for m, e in run.race.items()
                if len(e.new_tokens) < tokens and not e.done]
        return min(live)[1] if live else None

    total = sum(max(0, tokens - len(e.new_tokens)) for e in run.race.values()) or 1
    left = total
    while (m := behind()) is not None:
        eng = run.race[m]
        before = len(eng.new_tokens)
        eng.step()
        left -= min(len(eng.new_tokens), tokens) - before
        bar.progress(min(1.0, 1 - left / total),
                     text="interleaved race: " + ", ".join(f"{k} {min(len(e.new_tokens), tokens)}/{tokens}"
                                                           for k, e in run.race.items()))
    bar.empty()


def tokens_before(records: list[StepRecord], k: int) -> list[int]:
    return [t for r in records[:k] for t in r.new_tokens]


def what_if(run: Run, k: int) -> dict[str, StepRecord]:
    """Rerun step k from the same prefix with the strong drafter forced on and forced off.

    A fresh engine takes the prompt + the tokens accepted before step k as its prompt and is
    prefilled outside the timed step (as the live run was), so each branch's time covers the same
    work as a live step: target and weak drafter start from the prefix minus the root, exactly as
    in the live run. What differs: the strong drafter starts fully caught up (live, it re-reads the
    previous step's tokens, and after skipped steps every token it missed), and the scheduler's
    history is not replayed (the policy is forced anyway)."""
    prefix = run.prompt_ids + tokens_before(run.records, k)
    out = {}
    for policy in ("always", "never"):
        eng = Engine(run.trio, replace(run.cfg, method="treegraft", policy=policy))
        eng.start(prefix)
        prefill(eng, prefix)
        out[policy] = eng.step()
    return out


def one_step_run(s: dict, prompt: str, steps: int = 1) -> Run:
    """For pages opened before any step: a fresh TreeGraft run with real steps. The settings stay
    as the user set them, except the method (these pages explain TreeGraft)."""
    run = new_run(s | {"method": "treegraft"}, prompt)
    step(run, steps)
    return run


def model_caption(run: Run) -> str:
    n = run.trio.names
    untrained = any("random-init" in str(v) for v in n.values())
    note = " (untrained drafters accept little: train them with `python -m treegraft distill`)" if untrained else ""
    return (f"target **{n['target']}**, weak **{n['weak']}**, strong **{n['strong']}** on "
            f"{run.trio.device} / {str(run.trio.dtype).replace('torch.', '')}{note}")


def tree_help() -> str:
    return ("**Reading the tree.** The black square is the last accepted token; each column is one more "
            "token of draft. Colour and shape say who proposed a node: " +
            "; ".join(f"{label}" for label, _, _ in viz.PROVENANCE.values()) +
            ". A thick outline marks a graft point. Grey, faded nodes were pruned by the budget (a pruned "
            "subtree is drawn as its top node). Green rings: accepted by the target, along the top row; red x: "
            "the best candidate the target rejected; gold star: the bonus token the target adds itself. Token "
            "text is printed on the best few nodes per column; hover any node for its token, log-probabilities "
            "and rank.")

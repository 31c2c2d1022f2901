"""The methods a benchmark compares, and one timed generation of a prompt by each.

`ar`, `tree-weak`, `tree-strong` and `treegraft:POLICY` run on our engine; `assisted` and
`assisted-weak` are Hugging Face `generate(assistant_model=...)` with the strong or the weak drafter,
the linear speculative decoding most users would reach for; `pld` is Hugging Face prompt-lookup
decoding (`generate(prompt_lookup_num_tokens=10)`), the linear twin of our `ngram` drafter. Hooks on the models count their forwards
and time them, so every method reports tau and a per-phase time split in the same units.

An engine method may end in overrides, an ablation: GraftConfig knobs and the tree's own (`budget`
= an integer or `auto`, `depth`, `topk`, `width`, `calibrate` = 0 or 1), e.g. `treegraft:always[graft_g=0,blend=0]` or
`tree-strong[depth=3,budget=auto]` (its label in results.csv is the whole spec)."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from ..engine import ConfigError, Engine, GenConfig
from ..graft import GraftConfig
from ..options import AUTO_CAP
from ..models import Trio, sync
from ..record import oracle_extra_s, provenance_by_depth, summarize
from ..schedule import POLICIES
from ..vocab import admit

ENGINE_METHODS = ("ar", "tree-weak", "tree-strong")
ASSISTED = {"assisted": "strong", "assisted-weak": "weak", "pld": None}
PLD_TOKENS = 10  # HF's documented default for prompt_lookup_num_tokens
PHASES = ("draft_weak", "draft_strong", "schedule", "verify", "overhead")


@dataclass
class Method:
    label: str           # the name in results.csv, e.g. "treegraft:always"
    engine: str | None   # GenConfig.method, or None for HF assisted generation
    policy: str | None = None
    assistant: str | None = None  # "weak" or "strong" for assisted generation
    graft: dict = field(default_factory=dict)  # GraftConfig overrides: `...[graft_g=0,blend=0]`
    tree: dict = field(default_factory=dict)   # GenConfig overrides: `...[budget=auto,depth=3]`


def split_specs(spec: str) -> list[str]:
    """Split on commas outside [...]: 'a,b[x=1,y=2],c' -> ['a', 'b[x=1,y=2]', 'c']."""
    out, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [s.strip() for s in out + [cur] if s.strip()]


def parse_methods(spec: str, default_policy: str) -> list[Method]:
    """"ar,assisted,treegraft:never" -> Methods, in order, `ar` first (speedups are measured against it)."""
    out, seen = [], set()
    for name in split_specs(spec):
        m = parse_method(name, default_policy)
        if m.label in seen:
            raise ConfigError(f"method {m.label!r} is listed twice")
        seen.add(m.label)
        out.append(m)
    if not out:
        raise ConfigError("--methods is empty")
    return sorted(out, key=lambda m: m.label != "ar")


def parse_method(spec: str, default_policy: str) -> Method:
    name, bracket, knobs = spec.partition("[")
    m = parse_name(name, default_policy)
    if bracket:
        if m.engine is None:
            raise ConfigError(f"{spec!r}: overrides apply to engine methods only")
        m.graft, m.tree = parse_knobs(spec, knobs)
        m.label += "[" + ",".join("".join(kv.split()) for kv in knobs[:-1].split(",") if kv.strip()) + "]"
    return m


def parse_name(name: str, default_policy: str) -> Method:
    if name in ENGINE_METHODS:
        return Method(name, name)
    if name in ASSISTED:
        return Method(name, None, assistant=ASSISTED[name])
    if name == "treegraft" or name.startswith("treegraft:"):
        policy = name.partition(":")[2] or default_policy
        if policy not in POLICIES:
            raise ConfigError(f"unknown TreeGraft policy {policy!r} in {name!r}; choose one of {', '.join(POLICIES)}")
        return Method(f"treegraft:{policy}", "treegraft", policy=policy)
    raise ConfigError(f"unknown method {name!r}; choose from ar, assisted, assisted-weak, pld, tree-weak, "
                      f"tree-strong, treegraft[:{'|'.join(POLICIES)}], each engine method optionally with "
                      f"[knob=value,...] (GraftConfig knobs)")


TREE_KNOBS = ("budget", "depth", "topk", "width", "calibrate", "temper", "unsure", "sure")


def parse_knobs(spec: str, text: str) -> tuple[dict, dict]:
    """'graft_g=0,budget=auto]' -> ({'graft_g': 0}, {'budget': 64, 'auto_budget': True}): GraftConfig
    overrides and GenConfig ones, typed and range-checked by their dataclasses."""
    if not text.endswith("]"):
        raise ConfigError(f"{spec!r}: the overrides must end with ']'")
    base, out, tree = GraftConfig(), {}, {}
    for kv in filter(None, (s.strip() for s in text[:-1].split(","))):
        key, _, val = kv.partition("=")
        key, val = key.strip(), val.strip()
        if key in TREE_KNOBS:
            tree |= _tree_knob(spec, key, val)
            continue
        if not hasattr(base, key):
            raise ConfigError(f"unknown knob {key!r} in {spec!r}; choose from "
                              f"{', '.join([f.name for f in dataclasses.fields(GraftConfig)] + list(TREE_KNOBS))}")
        try:
            out[key] = type(getattr(base, key))(val)
        except ValueError:
            raise ConfigError(f"{spec!r}: {key} takes a {type(getattr(base, key)).__name__}, got {val!r}") from None
    try:
        dataclasses.replace(base, **out).check()
        GenConfig(**{k: v for k, v in tree.items() if k != "auto_budget"}).check()
    except (ValueError, ConfigError) as e:
        raise ConfigError(f"{spec!r}: {e}") from None
    return out, tree


def _tree_knob(spec: str, key: str, val: str) -> dict:
    if key == "budget" and val == "auto":
        return {"budget": AUTO_CAP, "auto_budget": True}
    if key in ("calibrate", "temper"):
        if val not in ("0", "1"):
            raise ConfigError(f"{spec!r}: {key} takes 0 or 1, got {val!r}")
        return {key: val == "1"}
    if key in ("unsure", "sure"):
        try:
            return {key: float(val)}
        except ValueError:
            raise ConfigError(f"{spec!r}: {key} takes a number of tokens, got {val!r}") from None
    try:
        return {key: int(val)} | ({"auto_budget": False} if key == "budget" else {})
    except ValueError:
        what = "an integer or 'auto'" if key == "budget" else "an integer"
        raise ConfigError(f"{spec!r}: {key} takes {what}, got {val!r}") from None


# ---------------------------------------------------------------- one runner per method

class EngineRunner:
    def __init__(self, trio: Trio, cfg: GenConfig, method: Method):
        over = {"method": method.engine, "record_stages": False}  # stage snapshots cost time
        if method.policy:
            over["policy"] = method.policy
        if method.graft:
            over["graft"] = dataclasses.replace(cfg.graft, **method.graft)
        over |= method.tree
        self.engine = Engine(trio, dataclasses.replace(cfg, **over))

    def run(self, ids: list[int]) -> dict:
        t0 = time.perf_counter()
        records = list(self.engine.generate(ids))
        wall = time.perf_counter() - t0
        return engine_stats(records, wall, list(self.engine.new_tokens))


def engine_stats(records, wall: float, new: list[int]) -> dict:
    phases = Counter()
    for r in records:
        phases.update(r.times)
    extra = oracle_extra_s(records)
    s = summarize(records, wall)
    return {"token_ids": new, "wall_s": wall, "target_forwards": s["target_forwards"],
            "target_calls": sum(r.forwards.get("target", 0) for r in records),
            "weak_forwards": sum(r.forwards.get("weak", 0) for r in records),
            "strong_forwards": sum(r.forwards.get("strong", 0) for r in records),
            "strong_calls": s["strong_calls"], "mean_tree_size": s["mean_tree_size"],
            "accept_lens": [r.accept_len for r in records], "phases": dict(phases), "oracle_extra_s": extra,
            "provenance": provenance_by_depth(records)}


class AssistedRunner:
    """HF assisted generation (or prompt lookup: no assistant model). Forward hooks count and time the
    target's and the assistant's calls; the target's cache length at each call gives the accepted
    length of every step."""

    def __init__(self, trio: Trio, cfg: GenConfig, method: Method):
        self.trio, self.cfg, self.role = trio, cfg, method.assistant
        self.assistant = getattr(trio, self.role) if self.role else None
        if self.role and getattr(self.assistant, "runner_cls", None) is not None:
            raise ConfigError(f"`{method.label}`: the {self.role} drafter is prompt lookup (ngram), not a model "
                              "Hugging Face can drive; use `pld` for Hugging Face's prompt-lookup decoding")
        if getattr(self.assistant, "needs_features", False):
            raise ConfigError(f"`{method.label}`: Hugging Face assisted generation cannot drive the {self.role} drafter "
                              f"({trio.names.get(self.role)}): it reads the target's hidden states "
                              "(treegraft.eagle). Compare it with tree-strong / treegraft instead.")
        # HF's "heuristic" schedule writes its draft length back into the assistant's config after each
        # call; restoring it makes every prompt start alike, whatever ran before.
        self.fresh_config = copy.deepcopy(self.assistant.generation_config) if self.assistant else None

    def run(self, ids: list[int]) -> dict:
        trio, cfg = self.trio, self.cfg
        eos = sorted(trio.eos_ids) or None
        kw = dict(do_sample=cfg.temperature > 0, max_new_tokens=cfg.max_new_tokens, eos_token_id=eos,
                  pad_token_id=eos[0] if eos else None)
        if self.assistant is not None:
            self.assistant.generation_config = copy.deepcopy(self.fresh_config)
            admit(self.assistant, ids)  # the same cut head our engine's drafter gets for this prompt
            kw["assistant_model"] = self.assistant
        else:
            kw["prompt_lookup_num_tokens"] = PLD_TOKENS
        if cfg.temperature > 0:
            kw |= dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
            torch.manual_seed(cfg.seed)
        inp = torch.tensor([ids], device=trio.device)
        hooks = Hooks(trio.target, self.assistant, trio.device)
        try:
            t0 = time.perf_counter()
            with torch.no_grad():
                out = trio.target.generate(inp, attention_mask=torch.ones_like(inp), **kw)
            sync(trio.device)
            wall = time.perf_counter() - t0
        finally:
            hooks.remove()
        new = out[0, len(ids):].tolist()
        return self.stats(hooks, new, len(ids), wall)

    def stats(self, hooks: "Hooks", new: list[int], prompt_len: int, wall: float) -> dict:
        n = hooks.calls["target"]
        draft = f"draft_{self.role or 'weak'}"  # prompt lookup's drafting is host time: it lands in overhead
        phases = {"verify": hooks.seconds["target"], draft: hooks.seconds["assistant"]}
        phases["overhead"] = max(0.0, wall - sum(phases.values()))
        return {"token_ids": new, "wall_s": wall, "target_forwards": n, "target_calls": n,
                "weak_forwards": hooks.calls["assistant"] if self.role == "weak" else 0,
                "strong_forwards": hooks.calls["assistant"] if self.role == "strong" else 0,
                "strong_calls": n if self.role == "strong" else 0,  # the drafter is consulted every step
                "mean_tree_size": chain_size(hooks.input_lens, prompt_len),
                "accept_lens": accept_lens(hooks.cache_lens, prompt_len, len(new)),
                "phases": phases, "oracle_extra_s": 0.0}


def accept_lens(cache_lens: list[int | None], prompt_len: int, new: int) -> list[int]:
    """The target's cache holds every committed token but the newest when it is called, so the
    growth between calls is what each verification accepted (+ its bonus token)."""
    if not cache_lens or any(c is None for c in cache_lens):
        return []
    marks = [prompt_len - 1] + cache_lens[1:] + [prompt_len + new - 1]
    lens = [b - a for a, b in zip(marks, marks[1:])]
    return lens if all(x > 0 for x in lens) else []


def chain_size(input_lens: list[int | None], prompt_len: int) -> float:
    """Mean draft tokens per target call: the first call also feeds the prompt, later ones the
    newest committed token, before the candidates."""
    if not input_lens or any(n is None for n in input_lens):
        return float("nan")
    return (sum(input_lens) - prompt_len - (len(input_lens) - 1)) / len(input_lens)


class Hooks:
    def __init__(self, target, assistant, device):
        self.device = device
        self.calls = {"target": 0, "assistant": 0}
        self.seconds = {"target": 0.0, "assistant": 0.0}
        self.cache_lens: list[int | None] = []
        self.input_lens: list[int | None] = []
        self.t = {}
        self.handles = []
        for name, model in (("target", target), ("assistant", assistant)):
            if model is None:
                continue
            self.handles.append(model.register_forward_pre_hook(self.pre(name), with_kwargs=True))
            self.handles.append(model.register_forward_hook(self.post(name)))

    def pre(self, name):
        def hook(module, args, kwargs):
            sync(self.device)
            if name == "target":
                cache = kwargs.get("past_key_values", kwargs.get("cache"))
                self.cache_lens.append(cache.get_seq_length() if hasattr(cache, "get_seq_length") else
                                       (0 if cache is None else None))
                ids = kwargs.get("input_ids", args[0] if args else None)
                self.input_lens.append(ids.shape[-1] if ids is not None else None)
            self.t[name] = time.perf_counter()
        return hook

    def post(self, name):
        def hook(module, args, output):
            sync(self.device)
            self.calls[name] += 1
            self.seconds[name] += time.perf_counter() - self.t[name]
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def make_runner(trio: Trio, cfg: GenConfig, method: Method):
    return AssistedRunner(trio, cfg, method) if method.engine is None else EngineRunner(trio, cfg, method)

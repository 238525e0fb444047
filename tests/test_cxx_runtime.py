"""A library with its own libstdc++ that builds a locale before llama.cpp's runtime has: the failure behind
every model load crashing in some Python environments (specdec_cli/cxx_runtime.py), and the claim that
`import specdec_cli` makes against it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Like a wheel whose extension links libstdc++ statically with its symbols visible: its own facet counter,
# and a std::locale built as soon as it is used.
OFFENDER = r"""
#include <iostream>
#include <locale>
extern "C" int offender_locale() { std::locale l; return (int)std::has_facet<std::collate<char>>(l); }
"""

LOAD = """
import ctypes, sys
if sys.argv[1] == "specdec-first":
    import specdec_cli  # claims the runtime (cxx_runtime.py)
ctypes.CDLL(sys.argv[2]).offender_locale()
from specdec_cli.engine.model import Model
m = Model(sys.argv[3], vocab_only=True)
print(m.tokenize("Hello world", add_special=False, parse_special=False))
"""


@pytest.fixture(scope="module")
def offender(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++ to build a library with its own libstdc++")
    d = tmp_path_factory.mktemp("offender")
    (d / "offender.cpp").write_text(OFFENDER)
    lib = d / "liboffender.so"
    proc = subprocess.run([cxx, "-fPIC", "-shared", "-static-libstdc++", "-o", str(lib), str(d / "offender.cpp")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"g++ cannot link libstdc++ statically here: {proc.stderr.strip()[-200:]}")
    return lib


@pytest.mark.parametrize("order", ["offender-first", "specdec-first"])
def test_a_library_with_its_own_cxx_runtime_cannot_break_model_loads_after_import(order: str, offender: Path,
                                                                                  smol_path: Path) -> None:  # fmt: skip
    """Loaded and used before specdec, the library breaks llama.cpp's tokenizer (std::bad_cast with GCC 12,
    a segfault with GCC 13+): the old order, which the CUDA machine's environment produced. Loaded after
    `import specdec_cli`, every load works."""
    env = {**os.environ, "SPECDEC_DEBUG": "0"}
    proc = subprocess.run([sys.executable, "-c", LOAD, order, str(offender), str(smol_path)], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    if order == "offender-first":
        assert proc.returncode != 0, "the failure this guards against no longer shows: is the offender built as intended?"
        assert proc.returncode < 0 or "brought its own C++ runtime" in proc.stderr, proc.stderr[-1000:]  # segfault or said
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().startswith("[") and len(proc.stdout.split(",")) >= 2

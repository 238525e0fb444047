"""`python -m specdec_cli.smoke`: decode one token from each packaged model, with the batch-invariant kernels,
and on the GPU where the build has one (its kernels probed: exact mode then decodes alone, engine/kernels.py).

Run in a child process by the set-up script, so that a llama.cpp build that
crashes (a segfault or an illegal instruction), or a library that is not the patched one
(patches/llama.cpp/), is caught before anyone uses it.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import os, sys
import numpy as np
from specdec_cli.models import packaged
from specdec_cli.engine import kernels
from specdec_cli.engine.model import Model
if not kernels.patched_build():
    sys.exit("smoke: the llama.cpp library running is not the patched build scripts/setup.sh makes")
# with the patches switched off the build is stock llama.cpp, which no kernel set makes exact (llamafile)
want = kernels.INVARIANT if os.environ["GGML_CPU_BATCH_INVARIANT"] == "1" else kernels.INEXACT
for name in ("smollm2-135m-instruct", "gemma3-270m"):
    m = Model(packaged.packaged_path(name), n_ctx=128, n_threads=2)
    rows = m.decode(m.tokenize("Hello", add_special=True, parse_special=True))
    assert np.isfinite(rows).all(), name
    assert m.kernels == want, f"{name}: {m.kernels} kernels, not {want}: {m.warnings}"
    m.close()
    print(name, m.kernels, "ok")
from specdec_cli.engine import native
for gpu in native.gpu_devices()[:1]:  # a build for a GPU that finds one: decode there too, every layer on it
    for name in ("smollm2-135m-instruct", "gemma3-270m"):
        m = Model(packaged.packaged_path(name), n_ctx=2048, n_threads=2, n_gpu_layers=kernels.ALL_LAYERS)
        rows = m.decode(m.tokenize("Hello", add_special=True, parse_special=True))
        assert np.isfinite(rows).all(), name
        m.close()
        print(name, "on", gpu.description, m.kernels, "ok")
"""


def main() -> int:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr[-3000:])
        sys.stderr.write(f"smoke: decoding crashed or failed (exit code {proc.returncode})\n")
        return 1
    sys.stderr.write("smoke: " + ", ".join(line for line in proc.stdout.split("\n") if line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

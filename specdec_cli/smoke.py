"""`python -m specdec_cli.smoke`: decode one token from each packaged model.

Run in a child process by the set-up script, so that a llama.cpp build that
crashes (a segfault or an illegal instruction) is caught before anyone uses it.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import numpy as np
from specdec_cli.models import packaged
from specdec_cli.engine.model import Model
for name in ("smollm2-135m-instruct", "gemma3-270m"):
    m = Model(packaged.packaged_path(name), n_ctx=128, n_threads=2)
    rows = m.decode(m.tokenize("Hello", add_special=True, parse_special=True))
    assert np.isfinite(rows).all(), name
    m.close()
    print(name, "ok")
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

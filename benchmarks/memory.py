"""Peak RSS of `specdec run --ctx-size 8192` with the packaged Gemma as target and draft.

    .venv/bin/python benchmarks/memory.py [--ctx-size 8192] [-n 64]

Prints the measured peak RSS of the specdec process and the budget it must stay
under: the two model files + their two KV caches (from the GGUF metadata, f16,
every layer full size because specdec keeps sliding-window caches full for exact
rollback) + 300 MB. Exits 1 if the budget is exceeded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from benchmarks import record
from specdec_cli.engine.gguf import GGUFSummary
from specdec_cli.engine.model import Model
from specdec_cli.models import packaged

MB = 1024 * 1024
# `specdec run` in a child that prints its own peak RSS (VmHWM) when it exits. Not getrusage(RUSAGE_CHILDREN):
# ru_maxrss survives fork+exec, so it counted this process's own memory (the vocabulary read above) too.
PEAK_AT_EXIT = (
    "import atexit, sys, runpy\n"
    "atexit.register(lambda: print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).strip(),"
    " file=sys.stderr))\n"
    "sys.argv[0] = 'specdec'\n"
    "runpy.run_module('specdec_cli', run_name='__main__')\n"
)


def kv_bytes(path: str, n_ctx: int) -> int:
    with Model(path, vocab_only=True) as m:
        return GGUFSummary.from_info(m.info()).kv_cache_bytes(n_ctx)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx-size", type=int, default=8192)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    record.add_option(ap)
    args = ap.parse_args()
    gemma = str(packaged.gemma3_path())
    file_size = os.path.getsize(gemma)
    kv = kv_bytes(gemma, args.ctx_size)
    budget = 2 * file_size + 2 * kv + 300 * MB
    cmd = [
        sys.executable,
        "-c",
        PEAK_AT_EXIT,
        "run",
        "The history of the printing press",
        "--raw",
        "--target",
        gemma,
        "--draft",
        gemma,
        "--ctx-size",
        str(args.ctx_size),
        "-n",
        str(args.max_tokens),
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return 1
    peak = int(next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("VmHWM:"))) * 1024
    print(f"ctx-size {args.ctx_size}: peak RSS {peak / MB:.0f} MB")
    print(
        f"budget: 2 x model file {file_size / MB:.0f} MB + 2 x KV cache {kv / MB:.0f} MB + 300 MB = {budget / MB:.0f} MB"
    )
    print(f"headroom {(budget - peak) / MB:.0f} MB -> {'OK' if peak <= budget else 'OVER BUDGET'}")
    record.save(args, "memory", threads=None, models={"target": gemma, "draft": gemma}, data={
        "settings": {"ctx_size": args.ctx_size, "max_tokens": args.max_tokens},
        "peak_rss_mb": round(peak / MB, 1), "model_file_mb": round(file_size / MB, 1), "kv_cache_mb": round(kv / MB, 1),
        "budget_mb": round(budget / MB, 1), "within_budget": peak <= budget})  # fmt: skip
    return 0 if peak <= budget else 1


if __name__ == "__main__":
    sys.exit(main())

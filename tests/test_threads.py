"""ggml's CPU backend computes with OpenMP, and libgomp keeps a team of worker threads for every thread that
has computed. A second thread computing while the first one's team exists ran every token 3x slower here
(30 ms against 9.5 ms for SmolLM2: more OpenMP threads than cores, so libgomp waits in the kernel at every
barrier), as in a parallel server that calibrated on its main thread. So a generation, a calibration and
the RPC check let their thread's team go when they end (engine/native.py); this checks that they do, by
the process's threads, not by timing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from specdec_cli import api
from specdec_cli.calibration import calibrate
from specdec_cli.engine import native


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settles_at(n: int) -> bool:
    """The process has `n` threads within 2 s (a released team's threads exit on their own time)."""
    deadline = time.monotonic() + 2
    while threads() != n and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads() == n


def test_generations_and_calibration_let_their_openmp_team_go(
    smol_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDEC_CALIBRATE", "1")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))  # an empty cache: calibration measures
    with api.load(smol_path, None, drafter="none", n_ctx=512, n_threads=2) as spec:
        before = threads()
        spec.target.decode(spec.target.tokenize("Hello there", add_special=True, parse_special=False))
        assert threads() > before  # a computation left a team behind: what the test can see
        native.release_compute_threads()
        assert settles_at(before)
        spec.generate("Say hello.", max_tokens=6)
        assert settles_at(before)
        assert calibrate(spec.target, None, 2, 5) is not None
        assert settles_at(before)

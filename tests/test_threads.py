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
from specdec_cli.errors import UsageError


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
    with api.load(smol_path, None, drafter="none", n_ctx=512, n_threads=2) as spec:  # a team: two
        before = threads()
        spec.target.decode(spec.target.tokenize("Hello there", add_special=True, parse_special=False))
        assert threads() > before  # a computation left a team behind: what the test can see
        native.release_compute_threads()
        assert settles_at(before)
        spec.generate("Say hello.", max_tokens=6)
        assert settles_at(before)
        assert calibrate(spec.target, None, 2, 5) is not None
        assert settles_at(before)


def test_busy_cores_reads_the_runnable_tasks_but_this_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("1.90 1.20 0.80 3/412 12345\n")  # 3 runnable, this process among them
    monkeypatch.setattr(native, "usable_cores", lambda: os.cpu_count())
    assert native.busy_cores(loadavg=str(loadavg), interval=0) == 2
    loadavg.write_text("garbage\n")
    assert native.busy_cores(loadavg=str(loadavg), interval=0) == 0
    assert native.busy_cores(loadavg=str(tmp_path / "missing"), interval=0) == 0
    monkeypatch.setattr(native, "usable_cores", lambda: (os.cpu_count() or 2) - 1)  # pinned: the count is not ours
    assert native.busy_cores(loadavg=str(loadavg), interval=0) == 0


def test_default_threads_leave_busy_cores_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECDEC_THREADS")  # conftest's: here the count of busy cores decides
    monkeypatch.setattr(native, "usable_cores", lambda: 2)
    monkeypatch.setattr(native, "busy_cores", lambda: 0)
    assert native.default_threads() == (2, None)
    monkeypatch.setattr(native, "busy_cores", lambda: 5)
    threads, note = native.default_threads()
    assert threads == 1 and note == "5 other tasks running on this machine's 2 cores: 1 thread (--threads sets it)"
    monkeypatch.setattr(native, "usable_cores", lambda: 8)
    monkeypatch.setattr(native, "busy_cores", lambda: 1)
    assert native.default_threads() == (7, "1 other task running on this machine's 8 cores: 7 threads (--threads sets it)")


def test_a_real_second_load_is_seen() -> None:
    """Two busy processes (what a build does to a 2-core machine) count as two busy cores at least."""
    if native.usable_cores() != os.cpu_count() or not Path("/proc/loadavg").exists():
        pytest.skip("the runnable count is the whole machine's: this process is pinned to some cores")
    import subprocess
    import sys

    hogs = [subprocess.Popen([sys.executable, "-c", "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 5: pass"])
            for _ in range(2)]  # fmt: skip
    try:
        time.sleep(0.5)
        assert native.busy_cores() >= 2
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_the_thread_count_does_not_change_a_logit(smol_path: Path) -> None:
    """The default thread count follows the machine's load, so a run and its baseline may differ in threads:
    the kernels must give the same bits whatever the count (a batch and one token at a time alike)."""
    from specdec_cli.engine.model import Model

    got = []
    for n in (1, 2, 3):
        m = Model(smol_path, n_ctx=256, n_threads=n)
        ids = m.tokenize("The quick brown fox jumps over the lazy dog, and then " * 3, add_special=True,
                         parse_special=False)  # fmt: skip
        batch = m.decode(ids).copy()
        one = [m.decode([i])[-1].copy() for i in ids[:8]]
        got.append((batch, one))
        m.close()
    for batch, one in got[1:]:
        assert (batch == got[0][0]).all() and all((a == b).all() for a, b in zip(one, got[0][1], strict=True))


def test_specdec_threads_names_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "busy_cores", lambda: 5)
    monkeypatch.setenv("SPECDEC_THREADS", "3")
    assert native.default_threads() == (3, None)
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("SPECDEC_THREADS", bad)
        with pytest.raises(UsageError, match="SPECDEC_THREADS must be a whole number >= 1"):
            native.default_threads()

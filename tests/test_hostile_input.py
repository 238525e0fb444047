"""Hostile and careless input outside the weights: files that are not files, resources, bytes, outputs.

Each case asserts the exit code, exactly one `Error:` line (or one `Warning:`),
no traceback, and a bounded time. Cases that need real file descriptors (a
closed stdout, a full disk, a pipe that closes) run the CLI in a subprocess.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import ConfigError
from specdec_cli.models import registry
from tests.conftest import THREADS

cli = CliRunner()
FAST = ["--ctx-size", "256", "--threads", str(THREADS)]
CLEAN_ENV = {**os.environ, "SPECDEC_CALIBRATE": "0", "NO_COLOR": "1"}


def assert_one_line(res: Any, code: int, *needles: str, prefix: str = "Error: ") -> str:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    err = res.stderr.strip()
    assert err.startswith(prefix) and len(err.splitlines()) == 1, err
    assert "Traceback" not in res.stdout + res.stderr
    for needle in needles:
        assert needle in err, err
    return err


def specdec(*args: str | bytes, stdin: bytes | None = None, timeout: float = 120, shell_tail: str = "") -> Any:
    """The CLI in a subprocess (real file descriptors); `shell_tail` is appended to a bash command line."""
    if shell_tail:
        import shlex

        cmd = " ".join(shlex.quote(os.fsdecode(a)) for a in (sys.executable, "-m", "specdec_cli", *args))
        argv: list[str | bytes] = ["bash", "-c", f"{cmd} {shell_tail}"]
    else:
        argv = [sys.executable, "-m", "specdec_cli", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env=CLEAN_ENV)


def assert_proc_one_line(proc: Any, code: int, *needles: str) -> str:
    err = proc.stderr.decode("utf-8", "replace").strip()
    assert proc.returncode == code, (proc.returncode, err)
    assert err.startswith("Error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err
    for needle in needles:
        assert needle in err, err
    return err


# ------------------------------------------------------------- not regular files
def test_fifo_as_model_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    for args in (["run", "hi", "--target", str(fifo), "--no-draft"], ["pair-check", str(fifo), str(fifo)]):
        t0 = time.monotonic()
        proc = specdec(*args, timeout=30)  # a blocked open would hit the timeout and fail the test
        assert_proc_one_line(proc, 1, "FIFO", "not a regular file")
        assert time.monotonic() - t0 < 30


def test_symlink_loop_is_named_as_such(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.symlink_to(b)
    b.symlink_to(a)
    res = cli.invoke(app, ["run", "hi", "--target", str(a), "--no-draft"])
    assert_one_line(res, 1, "symbolic link loop")


def test_device_as_model_is_refused() -> None:
    res = cli.invoke(app, ["run", "hi", "--target", "/dev/null", "--no-draft"])
    assert_one_line(res, 1, "/dev/null is a device")


def test_bad_gguf_version_says_so(tmp_path: Path, smol_path: Path) -> None:
    head = bytearray(smol_path.read_bytes()[:1_000_000])
    head[4:8] = struct.pack("<I", 7)
    bad = tmp_path / "future.gguf"
    bad.write_bytes(bytes(head))
    res = cli.invoke(app, ["run", "hi", "--target", str(bad), "--no-draft"])
    err = assert_one_line(res, 1, "invalid GGUF header", "version 7")
    assert "truncated" not in err  # the generic guess is not offered when llama.cpp said what is wrong


# --------------------------------------------------------------------- resources
def test_absurd_context_is_refused_before_allocating() -> None:
    t0 = time.monotonic()
    res = cli.invoke(app, ["run", "hi", "--no-draft", "--ctx-size", "1000000000", "--threads", str(THREADS)])
    assert_one_line(res, 1, "--ctx-size 1,000,000,000 needs about", "KV cache", "available")
    assert time.monotonic() - t0 < 30
    res = cli.invoke(app, ["run", "hi", "--ctx-size", "100000000000"])
    assert_one_line(res, 2, "--ctx-size must be from 8 to 2^31-1")


def test_context_above_training_length_warns(smol_path: Path) -> None:
    res = cli.invoke(app, ["run", "hi", "--target", str(smol_path), "--no-draft", "-n", "2", "--ctx-size", "9000"])
    assert res.exit_code == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "training context (8,192 tokens)" in warnings[0], res.stderr


def test_threads_above_the_cores_are_capped(smol_path: Path) -> None:
    res = cli.invoke(app, ["run", "hi", "--target", str(smol_path), "--no-draft", "-n", "2", "--threads", "1000",
                           "--ctx-size", "256", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    cores = len(os.sched_getaffinity(0))
    assert f"Warning: --threads 1000 is more than the {cores} cores" in res.stderr
    import json

    assert json.loads(res.stdout)["settings"]["threads"] == cores


def test_draft_max_is_bounded() -> None:
    res = cli.invoke(app, ["run", "hi", "--draft-max", "1000"])
    assert_one_line(res, 2, "--draft-max must be from 1 to 64")


# ------------------------------------------------------------- bytes and values
def test_invalid_utf8_prompt_in_argv_and_stdin() -> None:
    proc = specdec("run", b"ab\xff\xfe", "--no-draft", *FAST)
    assert_proc_one_line(proc, 2, "the prompt is not valid UTF-8 (byte 0xff at character 2)")
    proc = specdec("run", "-", "--no-draft", *FAST, stdin=b"x\xc3(hello")
    assert_proc_one_line(proc, 2, "the prompt read from stdin is not valid UTF-8 (byte 0xc3 at character 1)")


def test_negative_seed_is_a_usage_error_with_the_way_to_randomness() -> None:
    res = cli.invoke(app, ["run", "hi", "--seed", "-1"])
    assert_one_line(res, 2, "--seed", "leave it out for a random seed")


def test_chat_set_seed_minus_one_keeps_the_session(smol_path: Path, smol_q2k_path: Path) -> None:
    args = ["chat", "--target", str(smol_path), "--draft", str(smol_q2k_path), "-n", "4", *FAST]
    res = cli.invoke(app, args, input="/set seed -1\nHello\n/exit\n")
    assert res.exit_code == 0, res.stderr
    assert "Error: seed must be a whole number" in res.stderr and "Traceback" not in res.stderr  # named as /set names it
    assert "tokens/s" in res.stderr  # the next message was answered


# ---------------------------------------------------------------------- outputs
def test_closed_stdout_is_one_line() -> None:
    proc = specdec("run", "hi", "--no-draft", "-n", "2", *FAST, shell_tail=">&-")
    assert_proc_one_line(proc, 1, "stdout is closed")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("json_mode", [False, True])
def test_full_disk_is_one_line(json_mode: bool) -> None:
    extra = ["--json"] if json_mode else []
    proc = specdec("run", "hi", "--no-draft", "-n", "8", *FAST, *extra, shell_tail="> /dev/full")
    assert_proc_one_line(proc, 1, "cannot write the output: No space left on device")


def test_reader_going_away_ends_quietly() -> None:
    """`specdec run ... | head -c 1`: no traceback, no 'Exception ignored', a non-zero status like other CLIs."""
    proc = specdec("run", "--raw", "Count: 1, 2, 3,", "--no-draft", "-n", "64", *FAST,
                   shell_tail="| head -c 1 >/dev/null; exit ${PIPESTATUS[0]}")  # fmt: skip
    err = proc.stderr.decode()
    assert "Traceback" not in err and "Exception ignored" not in err and "Error" not in err, err
    assert proc.returncode in (0, 1, 141)  # 0 only if everything fit in the pipe before head left


# ------------------------------------------------------------------ models.toml
PAIR = '[pairs.mine]\ndescription = "x"\ndraft = {{ path = "d.gguf" }}\ntarget = {{ {target} }}\n{extra}'


@pytest.mark.parametrize(
    ("target", "extra", "needle"),
    [
        ('repo = "o/n", file = "../../x.gguf"', "", "must be a path inside the repository"),
        ('repo = "o/n", file = "/etc/x.gguf"', "", "must be a path inside the repository"),
        ('repo = "o/n", file = "x.bin"', "", "must name a .gguf file"),
        ('repo = "own er/na me", file = "x.gguf"', "", "must look like 'owner/name'"),
        ('repo = "o/n/m", file = "x.gguf"', "", "must look like 'owner/name'"),
        ('repo = "o/n", file = "x.gguf", size_gb = nan', "", "size_gb must be a number of gigabytes"),
        ('repo = "o/n", file = "x.gguf", size_gb = inf', "", "size_gb must be a number of gigabytes"),
        ('path = "t.gguf"', "draft_max = 100000\n", "draft_max must be an integer from 1 to 64"),
        ('path = "t\\u001b[2J.gguf"', "", "contains control characters"),
    ],
)
def test_models_toml_hostile_values(tmp_path: Path, target: str, extra: str, needle: str) -> None:
    f = tmp_path / "models.toml"
    f.write_text(PAIR.format(target=target, extra=extra))
    with pytest.raises(ConfigError, match=str(f)) as exc:
        registry.load(f)
    assert needle in str(exc.value)


def test_models_toml_hostile_value_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text(PAIR.format(target='repo = "a b/c", file = "x.gguf"', extra=""))
    monkeypatch.setenv("SPECDEC_CONFIG_DIR", str(config))
    assert_one_line(cli.invoke(app, ["models", "list"]), 1, "must look like 'owner/name'")


@pytest.mark.parametrize(
    ("variable", "command"),
    [
        ("SPECDEC_CACHE_DIR", ["run", "hi", "-n", "2", *FAST]),  # the derived draft lives there
        ("SPECDEC_CONFIG_DIR", ["run", "hi", "-n", "2", *FAST]),  # the user's models.toml
        ("SPECDEC_MODELS_DIR", ["models", "list"]),  # hand-fetched files, looked for by `models list`
    ],
)
def test_directory_variables_pointing_at_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, command: list[str]
) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv(variable, str(f))
    res = cli.invoke(app, command)
    assert_one_line(res, 1, f"{variable}={f} is not a directory")

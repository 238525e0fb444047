"""`specdec models pull` through the real huggingface-hub client, against a local imitation of the hub.

Every test runs the CLI in a subprocess, because huggingface-hub reads HF_ENDPOINT,
HF_HOME and HF_HUB_OFFLINE when it is imported: the environment is the interface.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import THREADS
from tests.fakehub import FakeHub

REPO = "specdec-test/SmolLM2-135M-Instruct-GGUF"
TARGET = "SmolLM2-135M-Instruct-Q4_1.gguf"
DRAFT = "SmolLM2-135M-Instruct-Q2_K.gguf"


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub()
    yield hub
    hub.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def env_for(home: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(home / "hf"),
        HF_HUB_DISABLE_TELEMETRY="1",
        SPECDEC_CONFIG_DIR=str(home / "config"),
        SPECDEC_MODELS_DIR=str(home / "by-hand"),
        NO_PROXY="127.0.0.1,localhost",
        NO_COLOR="1",
    )
    env.update(extra)
    return env


def write_pairs(home: Path, *entries: tuple[str, str, str, str, str]) -> None:
    """User models.toml entries: (name, target repo, target file, draft repo, draft file)."""
    text = ""
    for name, trepo, tfile, drepo, dfile in entries:
        text += (
            f'[pairs."{name}"]\ndescription = "test pair"\ndraft_max = 2\n'
            f'target = {{ repo = "{trepo}", file = "{tfile}" }}\n'
            f'draft = {{ repo = "{drepo}", file = "{dfile}" }}\n'
        )
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "models.toml").write_text(text)


def specdec(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specdec_cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The error is one line, the last on stderr (progress lines may come before it)."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], r.stderr
    assert "Traceback" not in r.stderr and "Error while downloading" not in r.stderr
    return errors[0]


def snapshot_files(home: Path) -> list[Path]:
    return sorted(p for p in (home / "hf").glob("hub/models--*/snapshots/*/*"))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def listed(env: dict[str, str], name: str) -> dict[str, object]:
    r = specdec(env, "models", "list", "--json")
    assert r.returncode == 0, r.stderr
    return next(p for p in json.loads(r.stdout)["pairs"] if p["name"] == name)


# ------------------------------------------------------------------ the happy path, end to end
def test_pull_real_models_then_run_the_pair(
    fake_hub: FakeHub, home: Path, smol_path: Path, smol_q2k_path: Path
) -> None:
    target, draft = smol_path.read_bytes(), smol_q2k_path.read_bytes()
    fake_hub.add(REPO, TARGET, target)
    fake_hub.add(REPO, DRAFT, draft)
    write_pairs(home, ("smol-hub", REPO, TARGET, REPO, DRAFT))
    env = env_for(home, fake_hub.endpoint)

    assert listed(env, "smol-hub")["on_disk"] == "no"
    r = specdec(env, "run", "--pair", "smol-hub", "-n", "4", "hello")
    assert r.returncode == 1
    assert "is not on disk: run `specdec models pull smol-hub`" in one_error_line(r)

    r = specdec(env, "models", "pull", "smol-hub")
    assert r.returncode == 0, r.stderr
    paths = [Path(p) for p in r.stdout.split()]
    assert [p.name for p in paths] == [TARGET, DRAFT]
    assert paths == snapshot_files(home) or sorted(paths) == snapshot_files(home)
    assert sha(paths[0].read_bytes()) == sha(target) and sha(paths[1].read_bytes()) == sha(draft)
    assert f"{TARGET} (98.4 MB) ..." in r.stderr  # progress goes to stderr, one line per file off a terminal
    assert listed(env, "smol-hub")["on_disk"] == "yes"

    r = specdec(env, "models", "path", "smol-hub")
    assert r.returncode == 0 and [Path(p) for p in r.stdout.split()] == paths

    gets = len(fake_hub.cdn_gets())
    r = specdec(env, "models", "pull", "smol-hub")
    assert r.returncode == 0 and "already on disk" in r.stderr
    assert len(fake_hub.cdn_gets()) == gets  # nothing downloaded twice

    r = specdec(
        env, "run", "--pair", "smol-hub", "--drafter", "model", "-n", "6", "--json", "--threads", str(THREADS), "Say hi."
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["models"]["target"] == str(paths[0]) and out["models"]["draft"] == str(paths[1])
    assert out["n_tokens"] > 0 and out["stats"]["drafted"] > 0


# ------------------------------------------------------------------ interrupted downloads
def big_pair(hub: FakeHub, home: Path) -> bytes:
    """Pair "big": a 25 MB target (the client writes 10 MiB chunks, so a cut keeps whole ones)."""
    data = os.urandom(25_000_000)
    hub.add("org/big-GGUF", "big.gguf", data)
    hub.add("org/big-GGUF", "small.gguf", b"GGUF" + os.urandom(1000))
    write_pairs(home, ("big", "org/big-GGUF", "big.gguf", "org/big-GGUF", "small.gguf"))
    return data


@pytest.mark.slow
def test_interrupted_pull_keeps_its_part_and_the_next_pull_resumes_it(fake_hub: FakeHub, home: Path) -> None:
    data = big_pair(fake_hub, home)
    env = env_for(home, fake_hub.endpoint)
    fake_hub.cut_after, fake_hub.refuse_after_cut = 11_000_000, True  # the connection drops, then the network is gone

    r = specdec(env, "models", "pull", "big")
    assert r.returncode == 1
    line = one_error_line(r)
    assert "downloading org/big-GGUF/big.gguf stopped after 10.5 MB of 25.0 MB, which is kept" in line
    assert "run the same command again to resume" in line

    # Nothing half-written looks complete.
    assert snapshot_files(home) == []
    assert listed(env, "big")["on_disk"] == "no (partial download kept)"
    r = specdec(env, "models", "path", "big")
    assert r.returncode == 1 and "not on disk: run `specdec models pull big`" in one_error_line(r)

    fake_hub.cut_after, fake_hub.refuse_gets = None, False  # the network is back
    fake_hub.log.clear()
    r = specdec(env, "models", "pull", "big")
    assert r.returncode == 0, r.stderr
    assert "resuming at 10.5 MB" in r.stderr
    big_gets = [g for g in fake_hub.cdn_gets() if g.path.startswith(f"/cdn/{sha(data)}")]
    assert [g.range for g in big_gets] == ["bytes=10485760-"]  # only the missing bytes were fetched
    assert sha(Path(r.stdout.split()[0]).read_bytes()) == sha(data)
    assert listed(env, "big")["on_disk"] == "yes"


def test_ctrl_c_keeps_the_part_and_exits_130(fake_hub: FakeHub, home: Path) -> None:
    data = big_pair(fake_hub, home)
    env = env_for(home, fake_hub.endpoint)
    fake_hub.stall_after = 11_000_000  # sends 11 MB, then hangs like a dead link
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdec_cli", "models", "pull", "big"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job (CI may run us as one) ignores SIGINT, and children inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    blobs = home / "hf" / "hub" / "models--org--big-GGUF" / "blobs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the first 10 MiB chunk is on disk
        parts = list(blobs.glob("*.specdec-partial")) if blobs.is_dir() else []
        if parts and parts[0].stat().st_size >= 10_485_760:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the first chunk never reached the disk")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    fake_hub.release.set()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("Error: interrupted: what was downloaded is kept")
    assert "Traceback" not in err and out == ""
    assert snapshot_files(home) == []

    fake_hub.stall_after = None
    fake_hub.log.clear()
    r = specdec(env, "models", "pull", "big")
    assert r.returncode == 0, r.stderr
    assert [g.range for g in fake_hub.cdn_gets() if g.path.startswith(f"/cdn/{sha(data)}")] == ["bytes=10485760-"]
    assert sha(Path(r.stdout.split()[0]).read_bytes()) == sha(data)


@pytest.mark.slow
def test_a_dropped_connection_is_resumed_within_the_same_pull(fake_hub: FakeHub, home: Path) -> None:
    data = big_pair(fake_hub, home)
    fake_hub.cut_after = 11_000_000  # every response drops after 11 MB
    r = specdec(env_for(home, fake_hub.endpoint), "models", "pull", "big")
    assert r.returncode == 0, r.stderr
    ranges = [g.range for g in fake_hub.cdn_gets() if g.path.startswith(f"/cdn/{sha(data)}")]
    assert ranges == [None, "bytes=10485760-", "bytes=20971520-"]
    assert sha(Path(r.stdout.split()[0]).read_bytes()) == sha(data)


def test_corrupt_bytes_are_caught_by_the_sha256_and_not_kept(fake_hub: FakeHub, home: Path) -> None:
    fake_hub.add("org/x-GGUF", "t.gguf", b"GGUF" + os.urandom(2000))
    fake_hub.add("org/x-GGUF", "d.gguf", b"GGUF" + os.urandom(1000))
    write_pairs(home, ("x", "org/x-GGUF", "t.gguf", "org/x-GGUF", "d.gguf"))
    fake_hub.corrupt = True
    r = specdec(env_for(home, fake_hub.endpoint), "models", "pull", "x")
    assert r.returncode == 1
    assert "the corrupt part was deleted: run again" in one_error_line(r)
    assert snapshot_files(home) == []
    assert not list((home / "hf").glob("hub/models--org--x-GGUF/blobs/*.specdec-partial"))


# ------------------------------------------------------------------ hub errors
def test_a_missing_file_is_a_404_that_names_the_entry(fake_hub: FakeHub, home: Path) -> None:
    fake_hub.add("org/x-GGUF", "t.gguf", b"GGUF" + os.urandom(100))
    write_pairs(home, ("x", "org/x-GGUF", "t.gguf", "org/x-GGUF", "renamed.gguf"))
    r = specdec(env_for(home, fake_hub.endpoint), "models", "pull", "x")
    assert r.returncode == 1
    line = one_error_line(r)
    assert "has no file 'renamed.gguf' in org/x-GGUF (HTTP 404)" in line
    assert f"{fake_hub.endpoint}/org/x-GGUF/resolve/main/renamed.gguf by hand" in line
    # the target came first and is complete; the draft left nothing behind
    assert [p.name for p in snapshot_files(home)] == ["t.gguf"]


def test_a_gated_repo_needs_hf_token_which_never_reaches_the_cdn(fake_hub: FakeHub, home: Path) -> None:
    fake_hub.add("org/gated-GGUF", "t.gguf", b"GGUF" + os.urandom(100))
    fake_hub.add("org/gated-GGUF", "d.gguf", b"GGUF" + os.urandom(100))
    fake_hub.gated["org/gated-GGUF"] = "hf_secret"
    write_pairs(home, ("g", "org/gated-GGUF", "t.gguf", "org/gated-GGUF", "d.gguf"))
    r = specdec(env_for(home, fake_hub.endpoint), "models", "pull", "g")
    assert r.returncode == 1
    assert "org/gated-GGUF is gated" in one_error_line(r) and "HF_TOKEN" in r.stderr

    r = specdec(env_for(home, fake_hub.endpoint, HF_TOKEN="hf_secret"), "models", "pull", "g")
    assert r.returncode == 0, r.stderr
    heads = [q for q in fake_hub.log if q.method == "HEAD" and q.authorization]
    assert heads and all(q.authorization == "Bearer hf_secret" for q in heads)
    assert fake_hub.cdn_gets() and all(q.authorization is None for q in fake_hub.cdn_gets())


# ------------------------------------------------------------------ no network, offline mode
def test_offline_mode_fails_clearly_and_then_works_from_the_cache(
    fake_hub: FakeHub, home: Path, smol_path: Path, smol_q2k_path: Path
) -> None:
    fake_hub.add(REPO, TARGET, smol_path.read_bytes())
    fake_hub.add(REPO, DRAFT, smol_q2k_path.read_bytes())
    write_pairs(home, ("smol-hub", REPO, TARGET, REPO, DRAFT))
    offline = env_for(home, fake_hub.endpoint, HF_HUB_OFFLINE="1")

    r = specdec(offline, "models", "pull", "smol-hub")
    assert r.returncode == 1
    line = one_error_line(r)
    assert "HF_HUB_OFFLINE is set, so" in line and "by hand to" in line
    assert [q for q in fake_hub.log if "/resolve/" in q.path or q.path.startswith("/cdn/")] == []
    assert snapshot_files(home) == []

    assert specdec(env_for(home, fake_hub.endpoint), "models", "pull", "smol-hub").returncode == 0
    fake_hub.log.clear()
    r = specdec(offline, "models", "path", "smol-hub")
    assert r.returncode == 0 and len(r.stdout.split()) == 2
    r = specdec(offline, "models", "pull", "smol-hub")  # already there: offline does not matter
    assert r.returncode == 0, r.stderr
    r = specdec(offline, "pair-check", "--pair", "smol-hub", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verdict"] == "compatible"
    assert [q for q in fake_hub.log if "/resolve/" in q.path or q.path.startswith("/cdn/")] == []


def test_no_network_says_what_failed_and_how_to_fetch_by_hand(home: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    write_pairs(home, ("x", "org/x-GGUF", "t.gguf", "org/x-GGUF", "d.gguf"))
    r = specdec(env_for(home, dead), "models", "pull", "x")
    assert r.returncode == 1
    line = one_error_line(r)
    assert f"cannot reach {dead} (ConnectError" in line
    assert f"download {dead}/org/x-GGUF/resolve/main/t.gguf by hand to {home / 'by-hand' / 't.gguf'}" in line
    assert not (home / "hf").exists() or snapshot_files(home) == []

    # ... and doing exactly that works.
    (home / "by-hand").mkdir()
    (home / "by-hand" / "t.gguf").write_bytes(b"GGUF")
    (home / "by-hand" / "d.gguf").write_bytes(b"GGUF")
    r = specdec(env_for(home, dead), "models", "path", "x")
    assert r.returncode == 0 and r.stdout.split() == [
        str(home / "by-hand" / "t.gguf"),
        str(home / "by-hand" / "d.gguf"),
    ]


def test_two_pulls_of_one_file_do_not_write_the_same_part(fake_hub: FakeHub, home: Path) -> None:
    from filelock import FileLock

    data = b"GGUF" + os.urandom(5000)
    fake_hub.add("org/x-GGUF", "t.gguf", data)
    fake_hub.add("org/x-GGUF", "d.gguf", b"GGUF" + os.urandom(100))
    write_pairs(home, ("x", "org/x-GGUF", "t.gguf", "org/x-GGUF", "d.gguf"))
    blobs = home / "hf" / "hub" / "models--org--x-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    with FileLock(str(blobs / f"{sha(data)}.specdec-partial.lock")):  # a pull already running
        r = specdec(env_for(home, fake_hub.endpoint), "models", "pull", "x")
    assert r.returncode == 1
    assert "another `specdec models pull` is downloading org/x-GGUF/t.gguf now" in one_error_line(r)
    assert fake_hub.cdn_gets() == []

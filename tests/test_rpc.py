"""The target on llama.cpp RPC servers (engine/rpc.py, `specdec rpc-server`, `--rpc`): endpoints checked
before llama.cpp connects, output identical to the target alone on the same servers, and the faults: a server that is not
there, speaks another protocol, is busy, runs inexact kernels, runs out of memory, or dies mid-generation
(`run` ends with what it produced; `serve` stays up, answers 503 until the server is back, then serves).

Every server here binds 127.0.0.1 and ends with its test (and with the test process: PDEATHSIG)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from specdec_cli.engine import rpc
from specdec_cli.errors import RpcError, UsageError
from tests.server_fixtures import live_server

SPECDEC = [sys.executable, "-m", "specdec_cli"]
ENV = {**os.environ, "SPECDEC_CALIBRATE": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RpcServer:
    """`specdec rpc-server` on a free loopback port, as a user starts it."""

    def __init__(self, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self.proc = subprocess.Popen([*SPECDEC, "rpc-server", "--port", str(self.port), "--threads", "1"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**ENV, **(env or {})}, preexec_fn=_die_with_parent)  # fmt: skip
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            try:
                rpc.probe(self.endpoint, timeout=2)
                return
            except RpcError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("rpc-server did not start:\n" + "".join(self.lines)) from None
                time.sleep(0.1)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def server_pid(self) -> int:
        """The child that holds the layers (llama.cpp's server loop)."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                return int(stat.parent.name)
        raise ProcessLookupError(f"no child of {self.proc.pid}")

    def kill(self) -> None:
        """Die as a crashed machine would: the layer-holding child first, with no goodbye."""
        try:
            os.kill(self.server_pid(), signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def rpc_servers(n: int, **kw: object) -> Iterator[list[RpcServer]]:
    servers = [RpcServer(**kw) for _ in range(n)]  # type: ignore[arg-type]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@contextmanager
def tcp_server(answer: bytes | None) -> Iterator[int]:
    """A loopback server that reads a request and answers `answer` (None: never answers)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.recv(64)
                if answer is None:
                    stop.wait(5)
                else:
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        sock.close()


def hello_answer(major: int, minor: int, patch: int) -> bytes:
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECDEC, *args], capture_output=True, text=True, env=ENV, timeout=timeout)


# ------------------------------------------------------------------ endpoints, without models
def test_endpoints_are_parsed_and_bad_ones_named() -> None:
    assert rpc.parse_endpoints("127.0.0.1:50052, localhost:8") == ("127.0.0.1:50052", "localhost:8")
    for bad in ("127.0.0.1", ":50052", "127.0.0.1:0", "127.0.0.1:70000", "::1:50052", "a:b", "", "h:1,h:1"):
        with pytest.raises(UsageError, match="--rpc"):
            rpc.parse_endpoints(bad)


def test_probe_names_the_endpoint_for_each_fault() -> None:
    port = free_port()
    with pytest.raises(RpcError, match=f"cannot reach the RPC server at 127.0.0.1:{port}: Connection refused"):
        rpc.probe(f"127.0.0.1:{port}")
    with tcp_server(hello_answer(6, 1, 0)) as port:
        with pytest.raises(RpcError, match=rf"127\.0\.0\.1:{port} speaks protocol 6\.1\.0, this build 7\.0\.0"):
            rpc.probe(f"127.0.0.1:{port}")
    with tcp_server(hello_answer(7, 0, 3)) as port:
        assert rpc.probe(f"127.0.0.1:{port}") == (7, 0, 3)  # a newer patch level speaks the same protocol
    with tcp_server(b"HTTP/1.1 400 Bad Request\r\n\r\n") as port:
        with pytest.raises(RpcError, match=f"127.0.0.1:{port} is not a llama.cpp RPC server"):
            rpc.probe(f"127.0.0.1:{port}")
    with tcp_server(None) as port:
        with pytest.raises(RpcError, match=f"RPC server 127.0.0.1:{port} does not answer within 0.5 s: it serves one"):
            rpc.probe(f"127.0.0.1:{port}", timeout=0.5)


def test_rpc_server_refuses_an_open_address_and_a_port_in_use() -> None:
    r = cli("rpc-server", "--host", "0.0.0.0", "--port", str(free_port()))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--host 0.0.0.0 is not a loopback address" in r.stderr and "--expose" in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = cli("rpc-server", "--port", str(port))
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr and r.stderr.count("\n") == 1


def test_run_with_a_bad_rpc_server_is_one_line(smol_path: Path) -> None:
    r = cli("run", "--target", str(smol_path), "--rpc", "nowhere", "-n", "4", "hi")
    assert r.returncode == 2 and "--rpc: 'nowhere' is not HOST:PORT" in r.stderr and r.stderr.count("\n") == 1
    port = free_port()
    r = cli("run", "--target", str(smol_path), "--rpc", f"127.0.0.1:{port}", "-n", "4", "hi")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"cannot reach the RPC server at 127.0.0.1:{port}" in r.stderr
    with tcp_server(hello_answer(6, 0, 0)) as port:
        r = cli("run", "--target", str(smol_path), "--rpc", f"127.0.0.1:{port}", "-n", "4", "hi")
    assert r.returncode == 1 and f"127.0.0.1:{port} speaks protocol 6.0.0" in r.stderr and r.stderr.count("\n") == 1


# ------------------------------------------------------------------ real servers
PROMPT = "Write a haiku about autumn rain."


def run_json(*args: str) -> dict[str, object]:
    r = cli("run", "--json", "--ctx-size", "1024", "-n", "48", *args, PROMPT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_two_rpc_servers_hold_the_target_and_the_output_is_identical(smol_path: Path, smol_q2k_path: Path) -> None:
    """Speculation with the target on RPC servers gives what the target alone gives there, however its layers
    are split. (A target on servers runs the reference kernels, without flash attention, and a local one the
    invariant kernels, with it: their logits differ by rounding, so the comparison is with the target alone
    on servers.)"""
    pair = ["--target", str(smol_path), "--draft", str(smol_q2k_path)]
    with rpc_servers(2) as (a, b):
        alone = run_json("--target", str(smol_path), "--no-draft", "--rpc", f"{a.endpoint},{b.endpoint}")
        alone_sampled = run_json("--target", str(smol_path), "--no-draft", "--rpc", f"{a.endpoint},{b.endpoint}",
                                 "--temp", "0.8", "--seed", "3")  # fmt: skip
        remote = run_json(*pair, "--rpc", f"{a.endpoint},{b.endpoint}")
        sampled = run_json(*pair, "--rpc", f"{a.endpoint},{b.endpoint}", "--temp", "0.8", "--seed", "3")
        split = run_json(*pair, "--rpc", f"{a.endpoint},{b.endpoint}", "--tensor-split", "3,1", "--drafter", "model")
        # the draft on a server too, one the target uses (a process keeps one connection per server)
        both = run_json(*pair, "--rpc", a.endpoint, "--draft-rpc", b.endpoint, "--drafter", "model")
        shared = run_json(*pair, "--rpc", a.endpoint, "--draft-rpc", a.endpoint, "--drafter", "model")
    assert both["token_ids"] == alone["token_ids"] == shared["token_ids"]
    assert set(both["models"]["where"]["draft"]) == {"local", b.endpoint}  # type: ignore[index]
    assert set(shared["models"]["where"]["draft"]) == {"local", a.endpoint}  # type: ignore[index]
    assert remote["token_ids"] == alone["token_ids"]
    assert sampled["token_ids"] == alone_sampled["token_ids"]
    assert split["token_ids"] == alone["token_ids"]
    where = remote["models"]["where"]  # type: ignore[index]
    assert where["draft"] == "local"
    assert where["target"][a.endpoint] > 10 and where["target"][b.endpoint] > 10
    three_to_one = split["models"]["where"]["target"]  # type: ignore[index]
    # by free memory (the same machine): half the layers each; 3,1: three quarters on a
    assert three_to_one[a.endpoint] > 1.3 * where["target"][a.endpoint]
    assert three_to_one[b.endpoint] < 0.9 * where["target"][b.endpoint]
    assert any("client connected" in line and "MiB" in line for line in a.lines)
    stats = remote["stats"]
    assert stats["accepted"] <= stats["drafted"]  # type: ignore[index]


def test_a_server_that_computes_batches_differently_is_refused(smol_q2k_path: Path) -> None:
    from specdec_cli.engine.model import Model
    from specdec_cli.engine.rpc_model import PlacedModel

    # GGML_CPU_TILED_MM=1: the tiled K-quant matmul, which sums a batch in another order than one token
    with rpc_servers(1, env={"GGML_CPU_TILED_MM": "1"}) as (server,):
        with pytest.raises(RpcError, match=f"RPC server {server.endpoint} computes a batch of tokens differently"):
            PlacedModel(smol_q2k_path, n_ctx=256, placement=rpc.Placement((server.endpoint,)))
        Model(smol_q2k_path, n_ctx=256).close()  # the same model, local: accepted (the check is the server's)


def test_a_server_out_of_memory_is_one_line(smol_path: Path) -> None:
    with rpc_servers(1) as (server,):
        pid = server.server_pid()
        size = int(re.search(r"VmSize:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) * 1024  # type: ignore[union-attr]
        limit = size + (8 << 20)  # the server may not grow by the model's layers
        resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
        r = cli("run", "--target", str(smol_path), "--rpc", server.endpoint, "-n", "4", "hi")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"the RPC server {server.endpoint} could not hold {smol_path.name}'s layers" in r.stderr


def test_a_server_that_dies_mid_run_ends_it_with_what_was_produced(smol_path: Path, smol_q2k_path: Path) -> None:
    pair = ["--target", str(smol_path), "--draft", str(smol_q2k_path)]
    with rpc_servers(2) as (a, b):
        # the target alone on the same servers (their kernels), far past where the run below is cut
        full = cli("run", "--ctx-size", "2048", "-n", "300", "--target", str(smol_path), "--no-draft",
                   "--rpc", f"{a.endpoint},{b.endpoint}", PROMPT)  # fmt: skip
        assert full.returncode == 0, full.stderr
        proc = subprocess.Popen([*SPECDEC, "run", "--ctx-size", "2048", "-n", "1500", *pair,
                                 "--rpc", f"{a.endpoint},{b.endpoint}", PROMPT],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        got = b""
        while len(got) < 40:  # generating through both servers
            part = os.read(proc.stdout.fileno(), 4096)
            assert part, proc.stderr.read().decode()
            got += part
        b.kill()
        rest, err = proc.communicate(timeout=60)
    text = (got + rest).decode()
    assert proc.returncode == 1, err.decode()
    assert f"RPC server {b.endpoint} stopped answering" in err.decode() and "the output ends there" in err.decode()
    assert "Traceback" not in err.decode()
    produced = text.split("\n")[0]
    assert 40 <= len(produced) < len(full.stdout.split("\n")[0])  # what was produced, and no more
    assert full.stdout.startswith(produced)


def test_serve_stays_up_while_a_server_is_away_and_serves_again_after(smol_path: Path, smol_q2k_path: Path) -> None:
    from openai import APIError, OpenAI

    with rpc_servers(2) as servers:
        a, b = servers
        args = ["--target", str(smol_path), "--draft", str(smol_q2k_path), "--parallel", "2", "--ctx-size", "2048",
                "--rpc", f"{a.endpoint},{b.endpoint}"]  # fmt: skip
        with live_server(*args) as live:
            client = OpenAI(base_url=live.base_url, api_key="none", max_retries=0, timeout=120)
            ask = {"model": smol_path.name, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0.0}
            before = client.chat.completions.create(**ask, max_tokens=32)  # type: ignore[call-overload]
            stream = client.chat.completions.create(**ask, max_tokens=1500, stream=True)  # type: ignore[call-overload]
            chunks = 0
            with pytest.raises(APIError, match=f"RPC server {b.endpoint} stopped answering"):
                for _ in stream:
                    chunks += 1
                    if chunks == 10:
                        b.kill()
            assert chunks >= 10
            r = httpx.post(f"{live.base_url}/chat/completions", json={**ask, "max_tokens": 8}, timeout=60)
            assert r.status_code == 503, r.text
            assert f"127.0.0.1:{b.port}" in r.json()["error"]["message"]
            assert httpx.get(f"{live.url}/health", timeout=10).status_code == 200
            servers[1] = RpcServer(port=b.port)  # the server comes back on its port
            after = client.chat.completions.create(**ask, max_tokens=32)  # type: ignore[call-overload]
            assert after.choices[0].message.content == before.choices[0].message.content
            assert live.proc.poll() is None


def test_bench_and_pair_check_probe_run_over_rpc(smol_path: Path, smol_q2k_path: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Repeat: one two three four.", "category": "input-grounded"}) + "\n")
    with rpc_servers(1) as (server,):
        r = cli("bench", "--target", str(smol_path), "--draft", str(smol_q2k_path), "--rpc", server.endpoint,
                "--configs", "target,auto:4", "--prompts", str(prompts), "--repeats", "1", "--warmup", "0",
                "-n", "16", "--ctx-size", "1024", "--json")  # fmt: skip
        assert r.returncode == 0, r.stderr
        bench = json.loads(r.stdout)
        assert set(bench["models"]["where"]["target"]) == {"local", server.endpoint}
        assert {row["config"] for row in bench["results"]} >= {"target", "auto:4"}
        r = cli("pair-check", str(smol_path), str(smol_q2k_path), "--probe", "--rpc", server.endpoint, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["probe"]["measured_speedup"] > 0
        r = cli("bench", "--target", str(smol_path), "--rpc", server.endpoint, "--llama-cpp-bin", "/nonexistent")
        assert r.returncode == 2 and "serves one client at a time" in r.stderr

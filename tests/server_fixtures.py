"""A live `specdec serve` in a subprocess on 127.0.0.1, for tests that talk to it over a real socket; and a
`Server` in this process through httpx's ASGI transport (`in_process`), for the fake model's tests."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from specdec_cli.server.app import Server
from tests.conftest import THREADS

READY = re.compile(r"on http://127\.0\.0\.1:(\d+)/v1")


@dataclass
class LiveServer:
    proc: subprocess.Popen[str]
    port: int
    stderr: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


def wait_healthy(proc: subprocess.Popen[Any], base: str, seconds: float, what: str) -> None:
    """Until `base`/health answers 200; RuntimeError naming `what` if the process exits or `seconds` pass (a
    server under test here, llama-server or specdec in the benchmarks)."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready in {seconds:g} s")
        time.sleep(0.1)


@contextmanager
def live_server(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> Iterator[LiveServer]:
    cmd = [sys.executable, "-m", "specdec_cli", "serve", "--port", "0", "--threads", str(THREADS), *args]
    environ = {**os.environ, "SPECDEC_CALIBRATE": "0", **(env or {})}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=environ)
    lines: list[str] = []
    port: list[int] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = READY.search(line)
            if m and not port:
                port.append(int(m.group(1)))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout) or not port:
        proc.kill()
        raise RuntimeError("server did not start:\n" + "".join(lines))
    server = LiveServer(proc, port[0], lines)
    try:
        wait_healthy(proc, server.url, 60, "server")
    except RuntimeError as exc:
        proc.kill()
        raise RuntimeError(f"{exc}:\n" + "".join(lines)) from None
    try:
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def in_process(server: Server, coro: Any) -> Any:
    """Run `coro(client)` against `server`'s ASGI app (httpx's transport: no socket, no thread of ours), then stop
    its worker."""

    async def main() -> Any:
        transport = httpx.ASGITransport(app=server.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://specdec.test", timeout=30) as http:
            return await coro(http)

    try:
        return asyncio.run(main())
    finally:
        server.worker.stop()

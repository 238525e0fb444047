"""`specdec rpc-server`: llama.cpp's RPC server from the bindings' own build, for `--rpc` on another process
or machine.

It runs as a child process (engine/rpc_server.py: llama.cpp's server loop never gives control back to
Python), and this process prints what it does: the banner, each client connection, and the memory the
server holds (its resident size) when a client comes or goes and whenever it moves by 64 MiB.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from specdec_cli.cli.output import Output

WARNING = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARNING: Host ('{host}') is != '127.0.0.1'
         Never expose the RPC server to an open network!
         This is an experimental feature and is not secure!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""  # llama.cpp's own words (tools/rpc/rpc-server.cpp)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resident_mib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rpc_server(
    host: Annotated[str, typer.Option(help="Address to listen on (a loopback one unless --expose).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 50052,
    threads: Annotated[int | None, typer.Option(help="CPU threads for the layers it holds (default: all cores).")] = None,
    cache: Annotated[
        Path | None, typer.Option(help="Folder where the server keeps tensors it received, so a client that loads "
                                  "the same model again sends hashes instead of weights.")
    ] = None,
    expose: Annotated[
        bool, typer.Option("--expose", help="Allow a non-loopback --host. The RPC protocol has no authentication: "
                           "anyone who reaches the port can read and write the server's memory through it. Never on "
                           "an open network.")
    ] = False,
) -> None:
    """Hold model layers for `--rpc HOST:PORT` clients (llama.cpp's RPC server, this build's protocol)."""
    from specdec_cli.engine import native, rpc
    from specdec_cli.errors import UsageError

    out = Output(False)
    with out.errors():
        if not 1 <= port <= 65535:
            raise UsageError(f"--port {port}: choose 1-65535")
        if threads is not None and threads < 1:
            raise UsageError(f"--threads {threads}: at least 1")
        if ":" in host:
            raise UsageError(f"--host {host}: llama.cpp's RPC endpoints take an IPv4 address or a name")
        if not is_loopback(host) and not expose:
            raise UsageError(f"--host {host} is not a loopback address: the RPC protocol has no authentication, "
                             "so this needs --expose (and a network you trust)")  # fmt: skip
        if cache is not None:
            if cache.exists() and not cache.is_dir():
                raise UsageError(f"--cache {cache}: not a folder")
            cache.mkdir(parents=True, exist_ok=True)
        try:  # a clear line for a port in use (llama.cpp would say "Failed to create server socket")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        if not is_loopback(host):
            sys.stderr.write(WARNING.format(host=host))
        n = threads or native.usable_cores()
        endpoint = f"{host}:{port}"
        child = subprocess.Popen(
            [sys.executable, "-m", "specdec_cli.engine.rpc_server", endpoint, str(n), str(cache or "")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        )  # fmt: skip
        code = _relay(child, endpoint, protocol=".".join(map(str, rpc.PROTOCOL)))
        if code not in (0, None):
            raise rpc.RpcError(f"the RPC server on {endpoint} stopped (exit {code})")


def _relay(child: subprocess.Popen[str], endpoint: str, protocol: str) -> int | None:
    """Print the child's lines with the time and its memory; stop it on Ctrl-C or a signal to this process."""
    say_lock = threading.Lock()
    last = [0]

    def say(text: str) -> None:
        with say_lock:
            sys.stdout.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            sys.stdout.flush()

    def memory(event: str) -> None:
        mib = resident_mib(child.pid)
        if mib is not None:
            last[0] = mib
            say(f"{event}; the server holds {mib} MiB")
        else:
            say(event)

    def watch_memory() -> None:
        while child.poll() is None:
            time.sleep(2.0)
            mib = resident_mib(child.pid)
            if mib is not None and abs(mib - last[0]) >= 64:
                last[0] = mib
                say(f"the server holds {mib} MiB")

    threading.Thread(target=watch_memory, daemon=True).start()
    say(f"specdec rpc-server on {endpoint}, protocol {protocol} (pid {child.pid}); Ctrl-C stops it")
    assert child.stdout is not None
    # llama.cpp's client opens a connection per query while it loads a model (device count, memory, ...):
    # a connection shorter than a second is counted, not printed, and named with the next one that lasts
    pending: list[threading.Timer] = []
    short = [0]

    def connected() -> None:
        extra = f" (after {short[0]} short queries)" if short[0] else ""
        short[0] = 0
        memory(f"client connected{extra}")

    try:
        for line in child.stdout:
            line = line.rstrip()
            if line == "Accepted client connection":
                timer = threading.Timer(1.0, connected)
                timer.daemon = True
                pending[:] = [timer]
                timer.start()
            elif line == "Client connection closed":
                if pending and not pending[0].finished.is_set():
                    pending[0].cancel()
                    short[0] += 1
                else:
                    memory("client disconnected")
                pending.clear()
            elif line:
                say(line)
        return child.wait()
    except KeyboardInterrupt:
        say("stopping")
        child.terminate()
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
        return 0
    finally:
        if child.poll() is None:
            child.kill()

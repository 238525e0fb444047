"""Speculation with the target on llama.cpp RPC servers, as network latency grows (a command, not a test).

    .venv/bin/python -m benchmarks.rpc_latency [--pair P] [--delays 0,0.5,2] [--max-tokens 128] [--rounds 1]
        [--llama-cpp-bin build/llama.cpp/bin]        (built by scripts/build-llama-cpp-tools.sh)

Per delay D: two `specdec rpc-server` processes on 127.0.0.1 hold the target's layers (split by their free
memory: half each), and every server below reaches them through `--rpc`, its draft local. D > 0: the
client reaches each RPC server through a delay proxy on 127.0.0.1 that forwards every chunk of bytes D ms
after it arrived, each way (a round trip gains 2D; the bytes' order and amount unchanged). tc netem would
be the usual tool, but this machine's kernel (Firecracker) has no netem (nor prio) qdisc: `tc qdisc add
dev lo root netem delay 2ms` answers "Specified qdisc kind is unknown". Servers, started fresh in turn:
specdec serve --no-draft (the target alone), specdec serve (auto), and with `--llama-cpp-bin`
llama-server plain and with the pair's draft (`-md`, draft-simple, K 4, `-ngld 0`: the draft local),
both with `--cache-ram 0` (its prompt cache copies every request's KV cache back through RPC: with
latency that costs it tens of seconds a request).
One client, the same greedy streamed requests; completion tokens over end-to-end time, summed. Every
figure is measured in this one run; the ratios are over the target alone of the same server family and
delay (specdec auto / specdec --no-draft; llama-server -md / llama-server).
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from benchmarks import record
from benchmarks.record import pair_files
from benchmarks.serve_bench import EXACT, free_port, llama_server, one_request
from specdec_cli.engine import rpc
from tests.server_fixtures import live_server

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Explain in detail how a car engine works, step by step.",
    "Summarise this and then repeat it word for word: the quick brown fox jumps over the lazy dog near "
    "the river bank on a sunny morning.",
    "List the steps to rename a git branch locally and on the remote, as a numbered list.",
]
CTX = 2048
CALIBRATE = {"SPECDEC_CALIBRATE": "1"}  # measure the batch costs through the servers at start (the tests turn it off)


# ------------------------------------------------------------------ the delay proxy (its own process)
def proxy_main(listen_port: int, target_port: int, delay_ms: float) -> None:
    """Forward 127.0.0.1:listen_port to 127.0.0.1:target_port, every chunk `delay_ms` late, each way.

    Threads and time.sleep, not asyncio: epoll's timeout is whole milliseconds, so 0.5 ms would become 1."""
    delay = delay_ms / 1000.0
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen_port))
    srv.listen(8)
    print("ready", flush=True)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        items: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def send() -> None:
            while True:
                due, data = items.get()
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=send, daemon=True).start()
        while True:
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            items.put((time.perf_counter() + delay, data))
            if not data:
                return

    while True:
        client, _ = srv.accept()
        upstream = socket.create_connection(("127.0.0.1", target_port))
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


@contextlib.contextmanager
def rpc_pair(delay_ms: float) -> Iterator[str]:
    """Two `specdec rpc-server`s (and, for a delay, a proxy in front of each); yields the --rpc value."""
    procs: list[subprocess.Popen[str]] = []
    try:
        endpoints = []
        for _ in range(2):
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, "-m", "specdec_cli", "rpc-server", "--port", str(port),
                                           "--threads", "2"], stdout=subprocess.DEVNULL, text=True))  # fmt: skip
            wait_for(f"127.0.0.1:{port}")
            if delay_ms > 0:
                front = free_port()
                proxy = subprocess.Popen([sys.executable, "-m", "benchmarks.rpc_latency", "--proxy",
                                          f"{front},{port},{delay_ms}"], stdout=subprocess.PIPE, text=True)  # fmt: skip
                procs.append(proxy)
                assert proxy.stdout is not None
                proxy.stdout.readline()
                port = front
            endpoints.append(f"127.0.0.1:{port}")
        yield ",".join(endpoints)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def wait_for(endpoint: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            rpc.probe(endpoint, timeout=2)
            return
        except rpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def measure(base: str, max_tokens: int) -> tuple[float, list[str]]:
    tokens, seconds, texts = 0, 0.0, []
    with httpx.Client(timeout=900) as client:
        one_request(base, "Say hello.", 8, client)  # warm-up, not counted
        for prompt in PROMPTS:
            t0 = time.perf_counter()
            _, _, n, text = one_request(base, prompt, max_tokens, client)
            seconds += time.perf_counter() - t0
            tokens += n
            texts.append(text)
    return tokens / seconds, texts


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--proxy":
        listen, target, delay = sys.argv[2].split(",")
        proxy_main(int(listen), int(target), float(delay))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="a pair from models.toml (default: the default pair)")
    ap.add_argument("--delays", default="0,0.5,2", help="ms added each way between client and RPC servers")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="every server this many times per delay (medians)")
    ap.add_argument("--llama-cpp-bin", type=Path, default=None, help="folder with llama-server")
    record.add_option(ap)
    args = ap.parse_args()
    target, draft = pair_files(args.pair)
    costs = record.calibrated(target, draft, 2)  # local, before any server starts
    pair = ["--pair", args.pair] if args.pair else []
    delays = [float(d) for d in args.delays.split(",")]

    def servers(endpoints: str) -> list[tuple[str, Callable[[], contextlib.AbstractContextManager[object]]]]:
        common = [*pair, "--ctx-size", str(CTX), "--parallel", "1", "--rpc", endpoints]
        out: list[tuple[str, Callable[[], contextlib.AbstractContextManager[object]]]] = [
            ("specdec --no-draft", lambda: live_server(*common, "--no-draft", env=CALIBRATE, timeout=600)),
            ("specdec auto", lambda: live_server(*common, env=CALIBRATE, timeout=600)),
        ]
        if args.llama_cpp_bin is not None:
            binary = args.llama_cpp_bin / "llama-server"
            # --cache-ram 0: llama-server's prompt cache copies each request's KV cache back from the servers
            # (measured at 2 ms each way: 26-30 s a request, 4.3 tok/s; 0.6-4.7 s without it)
            rpc_args = ("--rpc", endpoints, "-ngl", "99", "--cache-ram", "0")
            out += [
                ("llama-server", lambda: llama_server(binary, target, None, 1, exact=True, extra=rpc_args)),
                ("llama-server -md", lambda: llama_server(binary, target, draft, 1, exact=True,
                                                          extra=(*rpc_args, "-ngld", "0"))),  # fmt: skip
            ]
        return out

    table: dict[float, dict[str, float]] = {}
    raw: list[dict[str, object]] = []
    for delay in delays:
        rates: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            with rpc_pair(delay) as endpoints:
                for label, start in servers(endpoints):
                    with start() as server:
                        base = server if isinstance(server, str) else server.base_url  # type: ignore[attr-defined]
                        rate, _ = measure(base, args.max_tokens)
                    rates.setdefault(label, []).append(rate)
                    raw.append({"delay_ms": delay, "round": round_, "server": label, "tokens_per_second": round(rate, 3)})
                    print(f"delay {delay:g} ms, round {round_ + 1}: {label:20s} {rate:6.1f} tok/s", flush=True)
        table[delay] = {label: statistics.median(r) for label, r in rates.items()}
    print(f"\n{'delay each way':>14s}  {'specdec alone':>13s} {'specdec auto':>12s} {'speedup':>7s}   "
          f"{'llama-server':>12s} {'-md':>6s} {'speedup':>7s}   (tok/s; medians of {args.rounds})")
    for delay, r in table.items():
        ls, lmd = r.get("llama-server"), r.get("llama-server -md")
        llama = f"{ls:12.1f} {lmd:6.1f} {lmd / ls:6.2f}x" if ls and lmd else ""
        print(f"{delay:11g} ms  {r['specdec --no-draft']:13.1f} {r['specdec auto']:12.1f} "
              f"{r['specdec auto'] / r['specdec --no-draft']:6.2f}x   {llama}")
    record.save(args, "rpc-latency", threads=2, models={"target": target, "draft": draft}, data={
        "settings": {"pair": args.pair or "default", "delays_ms": delays, "max_tokens": args.max_tokens,
                     "rounds": args.rounds, "rpc_servers": 2, "prompts": PROMPTS},
        "servers": {"specdec": EXACT + " (target, on the RPC servers)",
                    "llama-server": EXACT + " (-fa off --no-repack, GGML_CPU_TILED_MM=0), --cache-ram 0"},
        "costs": costs, "rounds": raw})  # fmt: skip


if __name__ == "__main__":
    main()

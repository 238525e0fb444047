"""Where a streamed request's own host time goes in `specdec serve`, part by part (a command, not a test).

    .venv/bin/python -m benchmarks.request_profile [--pair P] [--requests 24] [--parallel 4]
        [--llama-cpp-bin build/llama.cpp/bin]

Runs specdec's server (the same `Server`, engine and uvicorn as `specdec serve --no-draft`) in a child process
with timing marks at the stages a request passes, sends `--requests` streamed greedy chat requests one after
another from one kept connection (the short mix's prompts: questions answered in a few tokens, sentences,
long answers; `serve_bench --mix short`), and splits each one's time to first token at the marks: the HTTP
request to the route's handler, the hop to a worker thread, the chat template and tokenization, the start
and the slot's admission (the prompt cache's save or restore of a slot's cells included), the step's plan up
to the prompt's decode, that decode (llama.cpp: not host time), the first token out of the verification and
relayed, the event loop's turn and the chunk's JSON, and the write and the client's read. A request's host
time is its time to first token less the prompt's decode. With `--llama-cpp-bin`, llama-server on the same
kernels answers the same prompts, for its own host time (time to first token less its `timings.prompt_ms`).
The marks' wrappers cost a microsecond or two each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks import record
from benchmarks.record import pair_files
from benchmarks.serve_bench import CTX, MIXED, free_port, llama_server, one_request
from tests.server_fixtures import wait_healthy

# (the mark, what ends there): each part runs from the previous mark to its own
PARTS = [
    ("handler", "HTTP request to the route's handler"),
    ("worker", "to a worker thread"),
    ("tokens", "chat template and tokens"),
    ("admitted", "start and admission (prompt cache included)"),
    ("decode>", "the step's plan, up to the prompt's decode"),
    ("decode<", "the prompt's decode (llama.cpp)"),
    ("relayed", "first token: verification, relay, its first text"),
    ("chunk", "the event loop's turn and the chunk's JSON"),
    ("client", "the write and the client's read"),
]
NOT_HOST = "decode<"


# ------------------------------------------------------------------ the child: a server with marks
def child(port: int, marks_path: Path, pair: str | None, parallel: int, threads: int) -> None:
    import uvicorn

    from specdec_cli import api
    from specdec_cli.engine.batch.engine import BatchEngine
    from specdec_cli.engine.settings import GenerateOptions
    from specdec_cli.server import shapes, worker
    from specdec_cli.server.app import Server, ServerSettings

    marks: list[tuple[float, str]] = []
    spec = api.load(pair=pair, drafter=None, parallel=parallel, n_ctx=CTX, n_threads=threads)
    target = spec.batch_engine().target

    def around(obj: Any, name: str, before: str | None, after: str | None,
               when: Callable[..., bool] = lambda *a, **k: True) -> None:  # fmt: skip
        f = getattr(obj, name)

        def marked(*a: Any, **k: Any) -> Any:
            hit = when(*a, **k)
            if hit and before:
                marks.append((time.perf_counter(), before))
            out = f(*a, **k)
            if hit and after:
                marks.append((time.perf_counter(), after))
            return out

        setattr(obj, name, marked)

    chat = Server.chat

    async def marked_chat(self: Server, request: Any) -> Any:
        marks.append((time.perf_counter(), "handler"))
        return await chat(self, request)

    Server.chat = marked_chat  # type: ignore[method-assign]
    around(worker.Worker, "_serve", "worker", None)
    around(type(spec), "tokenize", None, "tokens")
    around(BatchEngine, "_start", None, "admitted")
    around(target, "decode_many", "decode>", "decode<")
    delta = worker.Delta

    def marked_delta(*a: Any, **k: Any) -> Any:  # the first text out of the relay
        marks.append((time.perf_counter(), "relayed"))
        return delta(*a, **k)

    worker.Delta = marked_delta  # type: ignore[misc]
    around(shapes.Shape, "chunk", "chunk", None, when=lambda self, delta, *a, **k: bool(delta))
    server = Server(spec, ServerSettings("profile", GenerateOptions()))

    def dump() -> None:
        while True:
            time.sleep(0.5)
            marks_path.write_text(json.dumps(marks))

    threading.Thread(target=dump, daemon=True).start()
    uvicorn.Server(uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="warning",
                                  access_log=False)).run()  # fmt: skip


@contextlib.contextmanager
def profiled_server(pair: str | None, parallel: int, threads: int) -> Iterator[tuple[str, Path]]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks.json"
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.request_profile", "--child", str(port), str(marks),
                                 "--pair", pair or "", "--parallel", str(parallel), "--threads", str(threads)],
                                stderr=subprocess.DEVNULL)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(proc, base, 300, "the profiled server")
            yield f"{base}/v1", marks
        finally:
            proc.terminate()
            proc.wait(30)


# ------------------------------------------------------------------ the parent
def split(t0: float, first: float, marks: list[tuple[float, str]]) -> dict[str, float] | None:
    """One request's parts, in ms, from its marks (each the first after the one before it); None where a
    mark is missing (a request whose prompt took two decodes, say)."""
    seen: dict[str, float] = {}
    at = t0
    for tag, _ in PARTS[:-1]:
        t = next((t for t, m in marks if m == tag and at <= t <= first), None)
        if t is None:
            return None
        seen[tag], at = t, t
    seen["client"] = first
    out, prev = {}, t0
    for tag, _ in PARTS:
        out[tag] = (seen[tag] - prev) * 1000
        prev = seen[tag]
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        ap = argparse.ArgumentParser()
        ap.add_argument("--child", nargs=2)
        ap.add_argument("--pair", default="")
        ap.add_argument("--parallel", type=int, default=4)
        ap.add_argument("--threads", type=int, default=2)
        a = ap.parse_args()
        child(int(a.child[0]), Path(a.child[1]), a.pair or None, a.parallel, a.threads)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="a pair from models.toml (default: the default pair)")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--parallel", type=int, default=4, help="specdec's slots (the batch engine needs 2 or more)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-cpp-bin", type=Path, default=None, help="folder with llama-server (built with specdec's patches)")
    record.add_option(ap)
    args = ap.parse_args()
    if args.parallel < 2:
        ap.error("--parallel must be 2 or more: the marks are the batch engine's")
    prompts = MIXED[: args.requests]
    rows: list[dict[str, float]] = []
    hosts: list[float] = []
    with profiled_server(args.pair, args.parallel, args.threads) as (base, marks_path), \
            httpx.Client(timeout=600) as http:  # fmt: skip
        one_request(base, "Hello", 8, http)  # warm-up
        sent = []
        for prompt in prompts:
            t0 = time.perf_counter()
            ttft, _, _, _, prompt_s = one_request(base, prompt, args.max_tokens, http)
            sent.append((t0, t0 + ttft))
            hosts.append((ttft - (prompt_s or 0.0)) * 1000)
        time.sleep(1.2)  # the child writes its marks every half second
        marks = [(t, m) for t, m in json.loads(marks_path.read_text())]
    for t0, first in sent:
        parts = split(t0, first, marks)
        if parts is not None:
            rows.append(parts)

    theirs: list[float] = []
    if args.llama_cpp_bin is not None:
        target, _ = pair_files(args.pair)
        with llama_server(args.llama_cpp_bin / "llama-server", target, None, 1, exact=True) as base, \
                httpx.Client(timeout=600) as http:  # fmt: skip
            one_request(base, "Hello", 8, http)
            for prompt in prompts:
                ttft, _, _, _, prompt_s = one_request(base, prompt, args.max_tokens, http)
                theirs.append((ttft - (prompt_s or 0.0)) * 1000)
    medians = {tag: round(statistics.median(r[tag] for r in rows), 3) for tag, _ in PARTS} if rows else {}
    for tag, label in PARTS:
        if medians:
            print(f"{label:48s} {medians[tag]:7.3f} ms")
    print(f"requests split: {len(rows)} of {len(prompts)}; host time (TTFT less the prompt's decode): specdec "
          f"{statistics.median(hosts):.2f} ms" + (f", llama-server exact {statistics.median(theirs):.2f} ms" if theirs else ""))
    target, draft = pair_files(args.pair)
    record.save(args, "request-profile", threads=args.threads, models={"target": target, "draft": None}, data={
        "settings": {"pair": args.pair or "default", "requests": args.requests, "max_tokens": args.max_tokens,
                     "parallel": args.parallel, "prompts": "serve_bench --mix short"},
        "parts": [{"mark": tag, "part": label} for tag, label in PARTS], "not_host": NOT_HOST,
        "medians_ms": medians, "requests": rows, "host_ms": [round(h, 3) for h in hosts],
        "llama_server_exact_host_ms": [round(h, 3) for h in theirs]})  # fmt: skip


if __name__ == "__main__":
    main()

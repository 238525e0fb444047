"""A streamed token's CPU in each server, thread by thread, beside llama-server on the same kernels (a command).

    .venv/bin/python -m benchmarks.server_threads [--pair P] [-n 300] [--rounds 4] --llama-cpp-bin DIR

One client streams long greedy answers from `specdec serve --no-draft` (its default slots) and from llama-server
with specdec's kernels (`serve_bench.llama_server`, one slot), in turn, the order alternating each round (this
machine's speed drifts). Per request, from /proc: each thread's CPU time (schedstat) and context switches per
streamed token, and the client's time per token (its first five left out). Threads are told apart by what they
do, not by name (Python 3.11 leaves its threads' OS names alone): the `--threads` busiest are llama.cpp's
compute threads, ggml's and the one that calls llama_decode, whose time between decodes is the server's host
time per step (specdec's batch engine and relay; llama-server's sampling and slot loop); every other thread is
the server's HTTP side (specdec's event loop; llama-server's HTTP and queue threads). On a machine whose cores
all decode, what the HTTP side spends is taken from the compute threads (`benchmarks.step_wake`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import httpx

from benchmarks import record
from benchmarks.record import pair_files
from benchmarks.serve_bench import CTX, llama_server
from tests.server_fixtures import live_server


def threads(pid: int) -> dict[int, tuple[int, int, int]]:
    """Each thread of `pid`: (CPU nanoseconds, voluntary and involuntary context switches) so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            cpu = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
                          if ":" in line)  # fmt: skip
        except OSError:  # a thread that ended meanwhile
            continue
        out[int(tid)] = (cpu, int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))
    return out


def split(before: dict[int, tuple[int, int, int]], after: dict[int, tuple[int, int, int]], n_compute: int,
          tokens: int) -> dict[str, float]:  # fmt: skip
    """Microseconds of CPU per token of the `n_compute` busiest threads and of the others (the busiest of them
    apart), and context switches per token, between two `threads` readings."""
    zero = (0, 0, 0)
    delta = sorted(([a - b for a, b in zip(now, before.get(tid, zero), strict=True)] for tid, now in after.items()),
                   reverse=True)  # fmt: skip
    compute, rest = delta[:n_compute], delta[n_compute:]
    return {"compute_us": sum(d[0] for d in compute) / tokens / 1e3, "http_us": sum(d[0] for d in rest) / tokens / 1e3,
            "http_busiest_us": (rest[0][0] if rest else 0) / tokens / 1e3,
            "switches": sum(d[1] + d[2] for d in delta) / tokens,
            "preempted": sum(d[2] for d in delta) / tokens}  # fmt: skip


def stream(base: str, i: int, n: int) -> list[float]:
    """One streamed greedy answer of `n` tokens: when each chunk with text arrived."""
    body = {"messages": [{"role": "user", "content": f"Write a very long story about dragon number {i} and a knight."}],
            "max_tokens": n, "temperature": 0, "stream": True}  # fmt: skip
    times = []
    with httpx.Client(timeout=120) as client, client.stream("POST", f"{base}/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if '"content"' in line:
                times.append(time.perf_counter())
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-135m-q2k")
    ap.add_argument("-n", type=int, default=300, help="tokens a request")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2,
                    help="llama.cpp's threads in each server (specdec's tests' and serve_bench's llama-server's: 2)")
    ap.add_argument("--llama-cpp-bin", type=Path, required=True, help="folder with llama-server")
    record.add_option(ap)
    args = ap.parse_args()
    target, _ = pair_files(args.pair)
    runs: dict[str, list[dict[str, float]]] = {"specdec --no-draft": [], "llama-server exact": []}
    with (live_server("--ctx-size", str(CTX), "--no-draft", "--pair", args.pair) as ours,
          llama_server(args.llama_cpp_bin / "llama-server", target, None, 1, exact=True) as theirs):  # fmt: skip
        pids = {"specdec --no-draft": (ours.base_url, ours.proc.pid),
                "llama-server exact": (theirs, int(subprocess.check_output(["pgrep", "-n", "llama-server"]).split()[0]))}
        for base, _pid in pids.values():
            stream(base, 99, 16)  # warm-up
        for rnd in range(args.rounds):
            for name in list(pids) if rnd % 2 == 0 else list(pids)[::-1]:
                base, pid = pids[name]
                before = threads(pid)
                times = stream(base, rnd, args.n)
                row = split(before, threads(pid), args.threads, len(times))
                row["ms_per_token"] = (times[-1] - times[5]) / (len(times) - 6) * 1e3
                runs[name].append(row)
                print(f"{name:20s} {row['ms_per_token']:.3f} ms a token; CPU a token: compute threads "
                      f"{row['compute_us']:.0f} us, the rest {row['http_us']:.0f} us (busiest {row['http_busiest_us']:.0f}); "
                      f"{row['switches']:.2f} switches, {row['preempted']:.2f} preempted", flush=True)  # fmt: skip
    medians = {name: {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]} for name, rows in runs.items()}
    record.save(args, "server-threads", threads=args.threads, models={"target": target},
                data={"settings": {"pair": args.pair, "n": args.n, "rounds": args.rounds}, "medians": medians,
                      "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()

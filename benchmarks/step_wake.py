"""What a helper woken at every step costs the engine's step: none, a thread, a process (a command, not a test).

    .venv/bin/python -m benchmarks.step_wake [--pair P] [--burn 150] [-n 300] [--rounds 4]

The server's event loop is such a helper: the batch engine hands it each step's text, and it works (the JSON
chunk, the socket's write, whose kernel time wakes the client) while the engine decodes the next token. This
measures the kind of helper apart from its work: the engine as `specdec serve --no-draft` runs it (the pair
loaded with `parallel=4`, one greedy generation relayed from the engine's thread, `GenerationRun.listen`), and
at each step the relay wakes a helper that busy-works `--burn` microseconds: nobody; a thread of this process,
which holds the interpreter lock while it works (as the event loop's thread holds it writing a chunk); a
process of its own over a pipe (as an engine apart from its HTTP server would wake that server: no lock
shared). Per mode: the engine's host time per step (wall time between steps less the time inside llama_decode)
and what the helper added to it. Modes run in alternating order (ABC, CBA, ...) in one process, side by side:
this machine's speed drifts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks import record
from benchmarks.record import pair_files

MODES = ("none", "thread", "process")
def burn(fd: int, seconds: float) -> None:
    """The helper: for each byte read from `fd`, work `seconds` (a busy loop), until the writer closes it."""
    while got := os.read(fd, 256):
        for _ in got:
            t = time.perf_counter()
            while time.perf_counter() - t < seconds:
                pass


def one_run(spec: Any, prompt: str, n: int, wake_fd: int | None) -> dict[str, float]:
    """One greedy generation relayed from the engine's thread; each step writes a byte to `wake_fd`."""
    from specdec_cli.engine.events import Step
    from specdec_cli.engine.settings import GenerateOptions

    steps: list[tuple[float, float]] = []  # (when the step was relayed, its seconds in llama_decode)
    done = threading.Event()
    failed: list[BaseException] = []

    def on_event(ev: object) -> None:
        if isinstance(ev, Step):
            steps.append((time.perf_counter(), ev.t_target))
            if wake_fd is not None:
                os.write(wake_fd, b"x")

    def on_end(error: BaseException | None) -> None:
        if error is not None:
            failed.append(error)
        done.set()

    run = spec.start(spec.tokenize(prompt), GenerateOptions(max_tokens=n, temperature=0.0))
    run.listen(on_event, on_end)
    done.wait()
    if failed:
        raise failed[0]
    walls = [b[0] - a[0] for a, b in zip(steps, steps[1:], strict=False)]
    decode = statistics.mean(s[1] for s in steps[1:])
    wall = statistics.mean(walls)
    return {"steps": len(steps), "wall_ms": wall * 1000, "decode_ms": decode * 1000, "host_ms": (wall - decode) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="a pair from models.toml (default: the default pair)")
    ap.add_argument("--burn", type=float, default=150.0, help="microseconds the helper works per wake")
    ap.add_argument("-n", type=int, default=300, help="tokens per generation (each run)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    record.add_option(ap)
    args = ap.parse_args()
    from specdec_cli import api

    target, _ = pair_files(args.pair)
    read_fd, write_fd = os.pipe()
    threading.Thread(target=burn, args=(read_fd, args.burn / 1e6), daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import sys; from benchmarks.step_wake import burn; "
                              "burn(0, float(sys.argv[1]))", str(args.burn / 1e6)], stdin=subprocess.PIPE)  # fmt: skip
    assert child.stdin is not None
    fds = {"none": None, "thread": write_fd, "process": child.stdin.fileno()}
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        with api.load(pair=args.pair, drafter=None, parallel=4, n_threads=args.threads) as spec:
            spec.remember = False  # every run decodes its whole answer: nothing comes from the token pool
            one_run(spec, "Hello", 16, None)  # warm-up
            for r in range(args.rounds):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    prompt = f"Write a very long story about dragon number {r} and the knight who met it."
                    res = one_run(spec, prompt, args.n, fds[mode])
                    runs[mode].append(res)
                    print(f"round {r + 1} {mode:8s} wall {res['wall_ms']:.3f} ms/step, llama_decode "
                          f"{res['decode_ms']:.3f}, host {res['host_ms']:.3f}", flush=True)  # fmt: skip
    finally:
        child.stdin.close()
        child.wait(10)
        os.close(write_fd)
    host = {m: statistics.median(x["host_ms"] for x in runs[m]) for m in MODES}
    wall = {m: statistics.median(x["wall_ms"] for x in runs[m]) for m in MODES}
    added = {m: host[m] - host["none"] for m in MODES}
    print(f"\nthe helper works {args.burn:.0f} us per step; per step, medians of {args.rounds} rounds:")
    for m in MODES:
        print(f"  {m:8s} host {host[m]:.3f} ms, added {added[m] * 1000:+.0f} us ({added[m] * 1000 / args.burn:.2f} of the "
              f"work); wall {wall[m]:.3f} ms ({wall[m] / wall['none']:.3f}x none's)")
    record.save(args, "step-wake", threads=args.threads, models={"target": target},
                data={"settings": {"pair": args.pair or "default", "burn_us": args.burn, "tokens": args.n,
                                   "rounds": args.rounds, "parallel": 4},
                      "runs": runs, "host_ms": host, "wall_ms": wall, "added_us": {m: added[m] * 1000 for m in MODES}})  # fmt: skip


if __name__ == "__main__":
    main()

"""`specdec serve` under 1, 2 and 4 concurrent clients, with the drafter on and off (a command, not a test).

    .venv/bin/python -m benchmarks.serve_bench [--requests 4] [--max-tokens 96] [-- extra serve flags]

For each server (the auto drafter; --no-draft) and each concurrency c, c client
threads each send `--requests` streamed chat requests, greedy, one after the
other. Per request: time to first token (request sent to first content chunk;
it includes waiting in the queue, since one pair serves one generation at a
time) and tokens/s (completion tokens over the time from first to last chunk).
Prints the medians side by side, and the ratio of the drafter's tokens/s to
the target alone's, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx

from tests.server_fixtures import live_server

PROMPTS = [
    "Explain what a hash table is, in a paragraph.",
    "Write a short story about a lighthouse keeper.",
    "List the planets of the solar system with one fact each.",
    "Summarise the water cycle for a child.",
]


def one_request(base: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
            if data["choices"] and data["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    assert first is not None and last is not None
    return first - t0, tokens / max(last - first, 1e-9), tokens


def measure(base: str, clients: int, requests: int, max_tokens: int) -> tuple[float, float]:
    ttft: list[float] = []
    tps: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for i in range(requests):
            a, b, _ = one_request(base, PROMPTS[(c + i) % len(PROMPTS)], max_tokens)
            with lock:
                ttft.append(a)
                tps.append(b)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.median(ttft), statistics.median(tps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("serve_args", nargs="*", help="extra `specdec serve` flags (after --)")
    args = ap.parse_args()
    results: dict[str, dict[int, tuple[float, float]]] = {}
    for label, flags in (("auto drafter", []), ("target alone", ["--no-draft"])):
        with live_server("--ctx-size", "4096", "--max-queue", "16", *flags, *args.serve_args,
                         env={"SPECDEC_CALIBRATE": "1"}) as s:  # as users run it: calibrated
            one_request(s.base_url, "Hello", 8)  # warm up (and calibrate)
            results[label] = {c: measure(s.base_url, c, args.requests, args.max_tokens) for c in (1, 2, 4)}
    print(f"{'clients':>7}  {'drafter':>12}  {'TTFT median':>11}  {'tokens/s median':>15}")
    for c in (1, 2, 4):
        for label in results:
            ttft, tps = results[label][c]
            print(f"{c:>7}  {label:>12}  {ttft * 1000:>9.0f}ms  {tps:>15.1f}")
        ratio = results["auto drafter"][c][1] / results["target alone"][c][1]
        print(f"{'':>7}  {'ratio':>12}  {'':>11}  {ratio:>14.2f}x")


if __name__ == "__main__":
    main()

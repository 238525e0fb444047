"""Repeated requests against one server: first asks beside their repeats (a command, not a test).

    .venv/bin/python -m benchmarks.repeats [--pair P] [--max-tokens 128] [--llama-cpp-bin build/llama.cpp/bin]

A workload is a list of chat requests sent in order by one client to one server (one slot), greedy,
streamed. Its requests come in groups: agent retries (the same ask word for word, as after a tool
error), near-identical code asks (the same function with one name changed), repeated-schema extraction
(the same instruction over different records), and an open-ended control set (nothing repeats).
Within a group the first request is a *first ask* and the later ones *repeats*; the control set has
only first asks. Servers, each started fresh for the whole workload: specdec `--no-draft` (the target
alone), `--drafter ngram --pool-mb 0` (the per-request n-gram lookup), `--drafter ngram` (with the
token pool of earlier requests), specdec's default (auto, with the pool); with `--llama-cpp-bin`,
llama-server plain, with `--spec-type ngram-mod` (its pool shared by all requests), and with ngram-mod
and the pair's draft model (`--spec-type ngram-mod,draft-simple -md DRAFT --spec-draft-n-max 4`).
Per server and kind of request: completion tokens over end-to-end time (request sent to last chunk),
summed over the requests. Every figure is measured in this one run; the ratios are side by side.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.serve_bench import llama_server, one_request, pair_files
from tests.server_fixtures import live_server

CTX = 2048

CODE = ("Write a Python function named {name} that reads a TOML file from a path, checks that it has a "
        "'server' table with 'host' and 'port', and returns them as a tuple. Include a docstring.")
SCHEMA = ("Extract the person's name, age and city from this text and answer with JSON only, with the keys "
          "\"name\", \"age\" and \"city\": {record}")
WORKLOAD: list[tuple[str, str]] = [  # (group, prompt); a group's first prompt is its first ask
    ("retry-1", "List the steps to rename a git branch locally and on the remote, as a numbered list."),
    ("retry-1", "List the steps to rename a git branch locally and on the remote, as a numbered list."),
    ("code-1", CODE.format(name="load_server_address")),
    ("code-1", CODE.format(name="read_server_address")),
    ("schema-1", SCHEMA.format(record="Maria Lopez, 34, moved to Lyon last spring.")),
    ("schema-1", SCHEMA.format(record="Tom Becker is 58 and lives in Hamburg.")),
    ("schema-1", SCHEMA.format(record="In Osaka lives Aiko Tanaka, who turned 27 in May.")),
    ("retry-2", "Explain what a mutex is to a new programmer in one paragraph."),
    ("retry-2", "Explain what a mutex is to a new programmer in one paragraph."),
    ("open-1", "Write a haiku about autumn rain."),
    ("open-2", "Name three uses of copper and say why it suits each."),
    ("open-3", "What is the difference between a list and a tuple in Python?"),
]


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    texts: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def kind(i: int) -> str:
    group = WORKLOAD[i][0]
    if group.startswith("open"):
        return "control"
    return "first" if all(g != group for g, _ in WORKLOAD[:i]) else "repeat"


def run_workload(base: str, max_tokens: int) -> dict[str, Tally]:
    out = {"first": Tally(), "repeat": Tally(), "control": Tally()}
    with httpx.Client(timeout=600) as client:
        one_request(base, "Say hello.", 8, client)  # warm-up (not counted, and no part of the workload)
        for i, (_, prompt) in enumerate(WORKLOAD):
            t0 = time.perf_counter()
            _, _, tokens, text = one_request(base, prompt, max_tokens, client)
            tally = out[kind(i)]
            tally.tokens += tokens
            tally.seconds += time.perf_counter() - t0
            tally.texts.append(text)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="a pair from models.toml (default: the default pair)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--llama-cpp-bin", type=Path, default=None, help="folder with llama-server")
    ap.add_argument("--pool-args", default="", help="extra flags for the two specdec servers with the pool "
                    "(for example \"--draft-max 32\")")
    ap.add_argument("--only", default=None, help="comma-separated server labels to run (a diagnosis, not a report)")
    args = ap.parse_args()
    extra = args.pool_args.split()
    target, draft = pair_files(args.pair)
    pair = ["--pair", args.pair] if args.pair else []
    common = [*pair, "--ctx-size", str(CTX), "--parallel", "1"]
    servers: list[tuple[str, object]] = [
        ("specdec --no-draft", lambda: live_server(*common, "--no-draft")),
        ("specdec ngram, no pool", lambda: live_server(*common, "--drafter", "ngram", "--pool-mb", "0")),
        ("specdec ngram + pool", lambda: live_server(*common, "--drafter", "ngram", *extra)),
        ("specdec auto + pool", lambda: live_server(*common, *extra)),
    ]
    if args.llama_cpp_bin is not None:
        binary = args.llama_cpp_bin / "llama-server"
        servers += [
            ("llama-server", lambda: llama_server(binary, target, None, 1)),
            ("llama-server ngram-mod", lambda: llama_server(binary, target, None, 1, extra=("--spec-type", "ngram-mod"))),
            ("llama-server ngram-mod+md", lambda: llama_server(binary, target, draft, 1,
                                                                extra=("--spec-type", "ngram-mod,draft-simple"))),
        ]
    if args.only:
        wanted = {"specdec --no-draft", *args.only.split(",")}
        servers = [(label, start) for label, start in servers if label in wanted]
    results: dict[str, dict[str, Tally]] = {}
    for label, start in servers:
        with start() as server:  # type: ignore[operator]
            base = server if isinstance(server, str) else server.base_url
            results[label] = run_workload(base, args.max_tokens)
        r = results[label]
        print(f"{label:24s} first {r['first'].rate:6.1f}  repeat {r['repeat'].rate:6.1f}  "
              f"control {r['control'].rate:6.1f} tok/s", flush=True)
    alone = results["specdec --no-draft"]
    print(f"\n{'server':24s} {'first':>7s} {'repeat':>7s} {'control':>7s}  repeat/first  vs target alone: "
          f"{'first':>6s} {'repeat':>6s} {'control':>7s}  same text as its plain run")
    for label, r in results.items():
        plain = results.get("llama-server", r) if label.startswith("llama") else alone  # llama.cpp's kernels differ
        same = all(a == b for k in r for a, b in zip(r[k].texts, plain[k].texts, strict=True))
        print(f"{label:24s} {r['first'].rate:7.1f} {r['repeat'].rate:7.1f} {r['control'].rate:7.1f}  "
              f"{r['repeat'].rate / r['first'].rate:11.2f}x  {'':16s}{r['first'].rate / alone['first'].rate:5.2f}x "
              f"{r['repeat'].rate / alone['repeat'].rate:5.2f}x {r['control'].rate / alone['control'].rate:6.2f}x  "
              f"{'yes' if same else 'no'}")


if __name__ == "__main__":
    main()

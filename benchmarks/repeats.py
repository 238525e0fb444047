"""Repeated requests against one server: first asks beside their repeats (a command, not a test).

    .venv/bin/python -m benchmarks.repeats [--pair P] [--max-tokens 128] [--rounds N] [--llama-cpp-bin build/llama.cpp/bin]

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
All servers are up at once (started afresh each round, specdec's calibrated as a user's are) and the
workload is interleaved: each request goes to every server in turn, the order rotating, before the next
request goes to any, so this machine's drifts in speed (15-40% over minutes) fall on all of them alike;
each server sees the workload in its own order. Per server and kind of request: completion tokens over
end-to-end time (request sent to last chunk), summed over the requests. Every figure is measured in this
one run; the ratios are side by side. `--rounds N` repeats it all N times and reports medians.
`--in-process none,ngram,auto`: the same workload through the Python API, the pair loaded as the servers
load it, a line per request (steps, drafts, tok/s, and each step's choice: M the draft model, n the lookup,
. a plain decode), to see where a figure comes from.
`--oracle`: the most any n-gram/suffix lookup could give on these texts: the target's own answers
(greedy, alone), then for each repeat, step by step, the earlier text (every earlier prompt and answer,
and this request's own context) whose continuation matches the answer longest, drafted exactly as far
as it is right (at most 64, the lookup's longest draft), each step priced at this machine's measured
batch cost c(k+1) (calibration); per-step overheads left out. An upper bound for lookup drafting, to tell
a policy's shortfall from the workload's. A report of the servers ends with that bound, measured after
they stop (`--no-bound`: not).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks import record
from benchmarks.record import pair_files
from benchmarks.serve_bench import kernels_of, llama_server, one_request
from specdec_cli.engine.settings import MAX_DRAFT, MODEL, NGRAM
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


KINDS = ("first", "repeat", "control")


def run_workload(bases: dict[str, str], max_tokens: int) -> dict[str, dict[str, Tally]]:
    """The workload against every server at once, interleaved: request i goes to each server in turn (the
    order rotating with i) before request i + 1 goes to any, so a drift in this machine's speed (15-40%
    over minutes here) falls on all servers alike. Each server still sees the workload in its order."""
    out = {label: {k: Tally() for k in KINDS} for label in bases}
    labels = list(bases)
    with httpx.Client(timeout=600) as client:
        for base in bases.values():
            one_request(base, "Say hello.", 8, client)  # warm-up (not counted, and no part of the workload)
        for i, (_, prompt) in enumerate(WORKLOAD):
            for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                t0 = time.perf_counter()
                _, _, tokens, text, _ = one_request(bases[label], prompt, max_tokens, client)
                tally = out[label][kind(i)]
                tally.tokens += tokens
                tally.seconds += time.perf_counter() - t0
                tally.texts.append(text)
    return out


STEP_MARK = {MODEL: "M", NGRAM: "n", None: "."}  # a step's choice: draft model, lookup, plain decode


def in_process(pair: str | None, drafters: list[str], max_tokens: int) -> None:
    """Each drafter through the API, one loaded pair per drafter (its pool and what auto learned start empty)."""
    from specdec_cli import api

    for name in drafters:  # the pair as a server loads it (its draft_max from models.toml)
        spec = api.load(pair=pair, drafter=None if name == "none" else name, n_ctx=CTX)
        with spec:
            spec.generate([{"role": "user", "content": "Say hello."}], max_tokens=8)  # warm-up, as the servers'
            out = {k: Tally() for k in KINDS}
            for i, (group, prompt) in enumerate(WORKLOAD):
                t0 = time.perf_counter()
                g = spec.generate([{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0)
                seconds = time.perf_counter() - t0
                tally = out[kind(i)]
                tally.tokens += len(g.token_ids)
                tally.seconds += seconds
                choices = "".join(STEP_MARK.get(step.drafter, "?") for step in g.steps)
                print(f"{name:5s} {group:9s} {kind(i):8s} {len(g.token_ids):4d} tokens {len(g.steps):4d} steps "
                      f"drafted {g.stats.drafted:4d} accepted {g.stats.accepted:4d}  {len(g.token_ids) / seconds:6.1f} tok/s  "
                      f"{choices}", flush=True)  # fmt: skip
        print(f"{name:5s} first {out['first'].rate:6.1f}  repeat {out['repeat'].rate:6.1f}  "
              f"control {out['control'].rate:6.1f} tok/s\n", flush=True)


def oracle(pair: str | None, max_tokens: int, k_max: int = MAX_DRAFT, quiet: bool = False) -> float:
    """The upper bound of lookup drafting on this workload's repeats (see the module's docstring), in
    units of the target alone; `quiet`: without the line per request."""
    import os

    import numpy as np

    from specdec_cli import api
    from specdec_cli.calibration import calibrate

    os.environ["SPECDEC_CALIBRATE"] = "1"
    target, _ = pair_files(pair)
    with api.load(target, None, drafter=None, n_ctx=CTX) as spec:
        cal = calibrate(spec.target, None, spec.n_threads, k_max + 1)
        assert cal is not None
        texts = []
        for _, prompt in WORKLOAD:
            ids = spec.tokenize([{"role": "user", "content": prompt}]).ids
            g = spec.generate([{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0)
            texts.append((list(ids), list(g.token_ids)))
    measured = {1: 1.0, **cal.relative}  # 1..9, 12, 16, 24, 32, 48, 64, 65 measured: the rest interpolated
    sizes = sorted(measured)
    cost = {b: float(np.interp(b, sizes, [measured[x] for x in sizes])) for b in range(1, k_max + 2)}
    say = (lambda *_: None) if quiet else print
    say("batch costs c(b): " + " ".join(f"{b}:{cost[b]:.2f}" for b in sorted(cost) if b in (2, 3, 5, 9, 17)))
    n_all = cost_all = 0.0
    for i, (group, _) in enumerate(WORKLOAD):
        if kind(i) != "repeat":
            continue
        earlier = [p + o for p, o in texts[:i]]
        context, out = list(texts[i][0]), texts[i][1]
        pos, steps, spent = 0, 0, 0.0
        while pos < len(out):
            best = 0
            for seq in [*earlier, context]:
                limit = len(seq) if seq is not context else len(seq) - 1
                for end in range(2, limit + 1):  # seq[:end] ends like the context: seq[end:] is a proposal
                    if seq[end - 1] != context[-1] or seq[end - 2] != context[-2]:
                        continue
                    right = 0
                    while (right < k_max and end + right < len(seq) and pos + right < len(out)
                           and seq[end + right] == out[pos + right]):  # fmt: skip
                        right += 1
                    best = max(best, right)
            steps += 1
            spent += cost[best + 1]
            step = min(best + 1, len(out) - pos)
            context += out[pos : pos + step]
            pos += step
        n_all += len(out)
        cost_all += spent
        say(f"{group:9s} {len(out):4d} tokens {steps:4d} steps  at most {len(out) / spent:5.2f}x the target alone")
    say(f"all repeats: at most {n_all / cost_all:.2f}x the target alone (per-step overheads left out)")
    return n_all / cost_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="a pair from models.toml (default: the default pair)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--llama-cpp-bin", type=Path, default=None, help="folder with llama-server")
    ap.add_argument("--pool-args", default="", help="extra flags for the two specdec servers with the pool "
                    "(for example \"--draft-max 32\")")
    ap.add_argument("--only", default=None, help="server labels to run, separated by ';' (a diagnosis, not a report)")
    ap.add_argument("--rounds", type=int, default=1, help="run every server this many times, in turn; the table "
                    "gives each figure's median over the rounds (this machine's speed drifts between servers)")
    ap.add_argument("--in-process", default=None, metavar="DRAFTERS",
                    help="instead of servers: the workload through the Python API, once per drafter (none, ngram, "
                         "auto; comma-separated), one line per request with its steps, drafts and choices (a diagnosis)")
    ap.add_argument("--oracle", action="store_true", help="instead of servers: the upper bound of lookup drafting "
                    "on this workload's repeats, from the target's own answers and measured batch costs")
    ap.add_argument("--no-bound", action="store_true", help="leave out the last line: the bound `--oracle` computes, "
                    "measured after the servers stop (about a minute)")
    record.add_option(ap)
    args = ap.parse_args()
    if args.oracle:
        oracle(args.pair, args.max_tokens)
        return
    if args.in_process:
        in_process(args.pair, args.in_process.split(","), args.max_tokens)
        return
    extra = args.pool_args.split()
    target, draft = pair_files(args.pair)
    costs = record.calibrated(target, draft, 2)  # before any server starts
    pair = ["--pair", args.pair] if args.pair else []
    common = [*pair, "--ctx-size", str(CTX), "--parallel", "1"]
    calibrated = {"SPECDEC_CALIBRATE": "1"}  # as a user's server starts (the test fixture turns it off)
    servers: list[tuple[str, object]] = [
        ("specdec --no-draft", lambda: live_server(*common, "--no-draft", env=calibrated)),
        ("specdec ngram, no pool", lambda: live_server(*common, "--drafter", "ngram", "--pool-mb", "0", env=calibrated)),
        ("specdec ngram + pool", lambda: live_server(*common, "--drafter", "ngram", *extra, env=calibrated)),
        ("specdec auto + pool", lambda: live_server(*common, *extra, env=calibrated)),
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
        wanted = {"specdec --no-draft", *args.only.split(";")}
        servers = [(label, start) for label, start in servers if label in wanted]
    runs: dict[str, list[dict[str, Tally]]] = {label: [] for label, _ in servers}
    for round_ in range(1, args.rounds + 1):
        with contextlib.ExitStack() as stack:  # every server up at once, started afresh each round
            bases = {}
            for label, start in servers:
                server = stack.enter_context(start())  # type: ignore[operator]
                bases[label] = server if isinstance(server, str) else server.base_url
            for label, r in run_workload(bases, args.max_tokens).items():
                runs[label].append(r)
                print(f"round {round_} {label:26s} first {r['first'].rate:6.1f}  repeat {r['repeat'].rate:6.1f}  "
                      f"control {r['control'].rate:6.1f} tok/s", flush=True)
    rate = {label: {k: statistics.median(r[k].rate for r in rs) for k in KINDS} for label, rs in runs.items()}
    alone = rate["specdec --no-draft"]
    rounds = f" (medians of {args.rounds} rounds)" if args.rounds > 1 else ""
    print(f"\n{'server':26s} {'first':>7s} {'repeat':>7s} {'control':>7s}  repeat/first  vs target alone: "
          f"{'first':>6s} {'repeat':>6s} {'control':>7s}  same text as its plain run{rounds}")
    same_text = {}  # every text of a server equal to its own family's plain run's (specdec's: the target alone's)
    for label in runs:
        plain = runs.get("llama-server", runs[label]) if label.startswith("llama") else runs["specdec --no-draft"]
        same_text[label] = all(a == b for run in runs[label] for k in KINDS
                               for a, b in zip(run[k].texts, plain[0][k].texts, strict=True))  # fmt: skip
    for label, r in rate.items():
        same = same_text[label]
        print(f"{label:26s} {r['first']:7.1f} {r['repeat']:7.1f} {r['control']:7.1f}  "
              f"{r['repeat'] / r['first']:11.2f}x  {'':16s}{r['first'] / alone['first']:5.2f}x "
              f"{r['repeat'] / alone['repeat']:5.2f}x {r['control'] / alone['control']:6.2f}x  "
              f"{'yes' if same else 'no'}")
    bound = None
    if not args.no_bound:  # the limit next to the figures: measured now, on this machine, after the servers stopped
        bound = oracle(args.pair, args.max_tokens, quiet=True)
        print(f"\nThe most any lookup drafting could give on these repeats here (`--oracle`: the target's own answers, "
              f"each step drafted exactly as far as it is right, at most {MAX_DRAFT}, at this machine's batch costs, "
              f"per-step overheads left out): {bound:.2f}x the target alone.")
    record.save(args, "repeats", threads=2, models={"target": target, "draft": draft}, data={
        "settings": {"pair": args.pair or "default", "max_tokens": args.max_tokens, "rounds": args.rounds,
                     "pool_args": args.pool_args, "workload": [{"group": g, "kind": kind(i), "prompt": p}
                                                               for i, (g, p) in enumerate(WORKLOAD)]},
        "servers": {label: kernels_of(label, target) for label in runs}, "costs": costs,
        "rounds": [{"server": label, "round": i, **{k: {"tokens": r[k].tokens, "seconds": round(r[k].seconds, 4)}
                                                     for k in KINDS}}
                   for label, rs in runs.items() for i, r in enumerate(rs)],
        "same_text_as_plain_run": same_text, "lookup_bound": bound})  # fmt: skip


if __name__ == "__main__":
    main()

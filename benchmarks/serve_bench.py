"""`specdec serve` beside llama.cpp's `llama-server` under 1, 2, 4 and 8 concurrent clients (a command, not a test).

    .venv/bin/python -m benchmarks.serve_bench [--pair P] [--clients 1,2,4,8] [--requests 2] [--max-tokens 96]
        [--llama-cpp-bin build/llama.cpp/bin]        (built by scripts/build-llama-cpp-tools.sh)

For each concurrency c, each server is started with its slots (`specdec serve` at its default
`--parallel 4`, or c where more; `llama-server -np c`), each with the same per-slot context,
warmed up, and c client
threads each send `--requests` streamed chat requests, greedy, one after the other, with
different prompts. Servers: specdec with its default drafter (auto) and with
`--no-draft`; llama-server plain and with the pair's draft (`-md` with
`--spec-type draft-simple --spec-draft-n-max 4`: `-md` alone drafts nothing). Per run:
aggregate completion tokens/s over the wall time, time to first token (request sent
to first content chunk) p50/p95, per-request tokens/s (first to last chunk) median, and a request's
own host time: its time to first token less the prompt's decode time the server reports (`timings.prompt_ms`).
Completion tokens are counted on each answer's text with the target's tokenizer (`count_tokens`), the same way
for every server: llama-server's `usage` counts the end-of-generation token an answer stopped at, specdec's does
not, which credited llama-server with a token per answer that ends on its own (a tenth of a ten-token answer).
Everything is measured in this one run, side by side; the ratios at the end are
specdec auto over the better llama-server at the same concurrency. This machine's speed
drifts by tens of percent over minutes: at each concurrency every server is started once and
kept up (each idles while another is measured), and `--rounds N` measures them N times in
ABBA order, so that a round's servers run seconds apart. From the second round on, each
server may find a prompt's prefix in a slot's cache, as a real server does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks import record
from benchmarks.record import pair_files
from specdec_cli.bench.external import target_kernels
from specdec_cli.engine import kernels
from tests.server_fixtures import live_server, wait_healthy

# Prompts whose answers run past --max-tokens on both packaged targets, so that every request generates
# exactly --max-tokens on every server: llama-server's default kernels give other texts than specdec's exact
# ones, and answers ending at different lengths would give the servers different work (how long a batch runs
# with fewer sequences). The "tokens" column shows it is the same. Every request of a run (round, client,
# request) sends another prompt while there are prompts left: a prompt sent again would find its
# prefix in a cache (llama-server keeps prompts in RAM) and its earlier answer in specdec's token pool.
SUBJECTS = [
    "the history of the printing press", "how a car engine works", "the water cycle", "how hash tables handle collisions",
    "the planets of the solar system", "learning a new language as an adult", "the life of a lighthouse keeper",
    "the causes of the French Revolution", "how vaccines train the immune system", "the invention of the telephone",
    "how bees make honey", "the rules of chess", "the building of the pyramids", "how a bill becomes law",
    "the migration of monarch butterflies", "the history of the bicycle", "how glaciers shape valleys",
    "the life cycle of a star", "the Silk Road", "how bread rises", "the history of the Olympic Games",
    "how airplanes fly", "the causes of earthquakes", "the invention of paper", "how the heart pumps blood",
    "the Roman aqueducts", "how rainbows form", "the history of coffee", "how submarines dive and surface",
    "the growth of cities in the nineteenth century", "how photosynthesis works", "the history of maps",
    "how a compiler works", "the domestication of dogs", "the history of jazz", "how tides work",
    "the Great Wall of China", "how solar panels make electricity", "the history of the printing of money",
    "how volcanoes erupt", "the Renaissance in Florence", "how a refrigerator keeps food cold",
    "the history of chocolate", "how birds navigate", "the first voyage around the world", "how batteries store energy",
    "the history of the violin", "how forests recover after a fire", "the invention of the steam engine",
    "how the internet routes a message", "the history of tea", "how coral reefs grow", "the history of the calendar",
    "how a camera captures light", "the life of honeybee colonies in winter", "the history of skiing",
    "how rivers form deltas", "how microscopes reveal living cells", "how memory works in the human brain",
    "the history of the postal service", "how wind turbines work", "the history of glassmaking",
    "how ants organise their colonies", "the history of the railway",
]  # fmt: skip
TEMPLATES = ("Write a detailed essay about {}, in several long paragraphs.",
             "Explain {} to a curious twelve-year-old, step by step.")  # both checked past 96 tokens on both targets
PROMPTS = [t.format(s) for t in TEMPLATES for s in SUBJECTS]  # 128: 8 rounds of 8 clients x 2 requests
# `--mix short`: answers of every length, as a chat server gets them. On the packaged targets, greedy, these
# questions are answered in under 20 tokens, the one-sentence ones in 20 to 45, the rest run to --max-tokens;
# a request's fixed costs (template, admission, the first and last chunk) weigh most on the short ones.
QUESTIONS = [
    "Answer in one word: which insect makes honey?", "What is the capital of France? Reply with the name only.",
    "Reply with a single number: how many legs does a spider have?", "What colour is the sky on a clear day? One word.",
    "Reply with a single number: how many days are in a week?", "What is the capital of Japan? Reply with the name only.",
    "Answer in one word: what do cows drink?", "Reply with a single number: how many continents are there?",
    "What is the opposite of hot? One word.", "What is the capital of Italy? Reply with the name only.",
    "Answer in one word: which planet do we live on?", "Reply with a single number: how many hours are in a day?",
    "What is frozen water called? One word.", "What is the capital of Spain? Reply with the name only.",
    "Answer in one word: what animal barks?", "Reply with a single number: how many wheels does a bicycle have?",
    "What is the largest ocean? Reply with the name only.", "Answer in one word: what gas do plants breathe in?",
    "Reply with a single number: how many months are in a year?", "What is the capital of Germany? Name only.",
    "Answer in one word: what is the colour of grass?", "Reply with a single number: how many sides has a triangle?",
    "What do bees live in? One word.", "What is the capital of Egypt? Reply with the name only.",
]  # fmt: skip
SENTENCES = [f"In one short sentence, what is {s}?" for s in SUBJECTS]
MIXED = [p for quad in zip(QUESTIONS, PROMPTS[::2], SENTENCES, PROMPTS[1::2], strict=False) for p in quad]  # 96
CTX = 4096  # per slot
COUNT: list[Callable[[str], int]] = []  # `count_tokens`, once the pair is known


def count_tokens(target: Path) -> Callable[[str], int]:
    """An answer's completion tokens, from its text: the same count for the same text, whichever server wrote it."""
    from specdec_cli.engine.model import Model

    vocab = Model(target, vocab_only=True)
    return lambda text: len(vocab.tokenize(text, add_special=False, parse_special=False))


def gpu_layers() -> int:
    """specdec serve's default, which llama-server gets too: every layer on the GPU where there is one."""
    return kernels.gpu_layers(None, "n_gpu_layers")


LLAMA = ("llama-server", "llama-server -md")  # the servers specdec auto is compared with
# The CPU kernels each server computes with, for the results file (`kernels_of`): specdec's target runs exact
# mode's (engine/kernels.py), "llama-server exact" the same ones, llama-server stock llama.cpp's.
STOCK = ("llama.cpp's defaults: flash attention auto, repacked weights (a GEMM from 4 rows), tiled matmul, "
         "llamafile's sgemm from 2 rows")


def kernels_of(label: str, target: Path) -> str:
    ours = kernels.expected(target, 2, gpu_layers())  # the probe's verdict, kept when specdec's servers loaded the target
    if label.startswith("specdec"):
        return f"{ours}: {kernels.DESCRIPTIONS[ours]} (target); the draft: llama.cpp's own"
    if label == "llama-server exact":
        return f"{ours}: {kernels.DESCRIPTIONS[ours]}: {' '.join(target_kernels(ours, gpu_layers())[0])}"
    return STOCK


@dataclass
class Run:
    tokens_per_second: float  # aggregate over the wall time
    ttft_p50: float
    ttft_p95: float
    per_request: float  # median tokens/s of one request, first to last chunk
    tokens: int  # completion tokens in all
    texts: dict[str, str]
    ttfts: list[float]
    # each request's time to first token less the prompt's decode time the server reports (`timings.prompt_ms`,
    # llama-server's field, which specdec also sends): the request's own host time (HTTP, template, tokens,
    # admission, the stream's start), as each server counts its prompt
    hosts: list[float]


Answer = tuple[float, float, int, str, float | None]  # TTFT, tokens/s, tokens, text, prompt seconds (server's)


def one_request(base: str, prompt: str, max_tokens: int, client: httpx.Client | None = None) -> Answer:
    """One streamed chat request. Each client thread keeps one connection (as the openai SDK does): a new
    `httpx.Client` per request costs about 30 ms here (its SSL context), which would count as TTFT."""
    if client is None:
        with httpx.Client(timeout=600) as own:
            return one_request(base, prompt, max_tokens, own)
    try:
        return _one_request(base, prompt, max_tokens, client)
    except httpx.RemoteProtocolError as exc:  # the server closed the kept connection (llama-server does, at times)
        if "without sending a response" not in str(exc):
            raise
        return _one_request(base, prompt, max_tokens, client)  # once more, on a new connection, as SDKs retry


def _one_request(base: str, prompt: str, max_tokens: int, client: httpx.Client) -> Answer:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    first = last = None
    tokens = chunks = 0
    prompt_s = None
    text = []
    with client.stream("POST", f"{base}/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
            if "prompt_ms" in data.get("timings", {}):
                prompt_s = data["timings"]["prompt_ms"] / 1000
            if data.get("choices") and data["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
                text.append(data["choices"][0]["delta"]["content"])
    assert first is not None and last is not None
    tokens = COUNT[0]("".join(text)) if COUNT else tokens or chunks
    return first - t0, tokens / max(last - first, 1e-9), tokens, "".join(text), prompt_s


def run_clients(clients: int, requests: int, one: Callable[[int, str], Answer], first: int = 0) -> Run:
    """`clients` threads, each sending `requests` prompts one after the other through `one(client, prompt)`
    (TTFT, tokens/s of the request, tokens, text); aggregate tokens/s over the wall time."""
    ttft: list[float] = []
    hosts: list[float] = []
    tps: list[float] = []
    texts: dict[str, str] = {}
    total = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        for i in range(requests):
            prompt = PROMPTS[(first + c * requests + i) % len(PROMPTS)]
            a, b, n, text, prompt_s = one(c, prompt)
            with lock:
                ttft.append(a)
                hosts.extend([] if prompt_s is None else [a - prompt_s])
                tps.append(b)
                total[0] += n
                texts[prompt] = text

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft.sort()
    return Run(total[0] / wall, statistics.median(ttft), p95(ttft), statistics.median(tps), total[0], texts, ttft,
               hosts)  # fmt: skip


def measure_in_process(spec: Any, clients: int, requests: int, max_tokens: int, first_prompt: int = 0) -> Run:
    """The same clients calling `Speculator.stream` from threads: the batch engine without HTTP (a diagnosis:
    what the server layer costs on top of it)."""

    def one(_client: int, prompt: str) -> Answer:
        t0 = time.perf_counter()
        first = last = None
        n, text, prompt_s = 0, [], None
        for chunk in spec.stream([{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0):
            if chunk.token_ids:
                last = time.perf_counter()
                first = first or last
                n += len(chunk.token_ids)
                text.append(chunk.text)
            if chunk.generation is not None:
                prompt_s = chunk.generation.stats.seconds.prefill
        assert first is not None and last is not None
        n = COUNT[0]("".join(text)) if COUNT else n
        return first - t0, n / max(last - first, 1e-9), n, "".join(text), prompt_s

    return run_clients(clients, requests, one, first_prompt)


def measure(base: str, clients: int, requests: int, max_tokens: int, first_prompt: int = 0) -> Run:
    https = [httpx.Client(timeout=600) for _ in range(clients)]
    for http in https:  # connected before the clock starts
        http.get(base.removesuffix("/v1") + "/health")
    try:
        return run_clients(clients, requests, lambda c, prompt: one_request(base, prompt, max_tokens, https[c]),
                           first_prompt)  # fmt: skip
    finally:
        for http in https:
            http.close()


def p95(xs: list[float]) -> float:
    """The 95th percentile of sorted values (nearest rank)."""
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def pooled(runs: list[Run]) -> Run:
    """Several runs of one server at one concurrency: mean tokens/s, TTFT percentiles of all requests pooled."""
    ttft = sorted(t for r in runs for t in r.ttfts)
    texts: dict[str, str] = {}
    for r in runs:
        texts.update(r.texts)
    return Run(statistics.mean(r.tokens_per_second for r in runs), statistics.median(ttft), p95(ttft),
               statistics.median(r.per_request for r in runs), sum(r.tokens for r in runs), texts, ttft,
               [h for r in runs for h in r.hosts])  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llama_server(binary: Path, target: Path, draft: Path | None, slots: int, exact: bool = False,
                 extra: tuple[str, ...] = ()) -> Iterator[str]:  # fmt: skip
    port = free_port()
    cmd = [str(binary), "-m", str(target), "-np", str(slots), "-c", str(CTX * slots), "-t", "2", "-tb", "2",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui"]  # fmt: skip
    if draft is not None:
        cmd += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    cmd += list(extra)
    # stock llama.cpp: the variables specdec's import set in this process are not llama-server's
    env = {k: v for k, v in os.environ.items() if k not in ("GGML_CPU_BATCH_INVARIANT", "GGML_CPU_TILED_MM")}
    if exact:  # the kernels specdec's target runs
        flags, more = target_kernels(kernels.expected(target, 2, gpu_layers()), gpu_layers())
        cmd += flags
        env.update(more)
    else:  # on the device specdec's models run on (every layer on the GPU where there is one)
        cmd += ["-ngl", str(gpu_layers())] + (["-ngld", str(gpu_layers())] if draft is not None else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, 180, f"llama-server ({' '.join(cmd)})")
        yield f"{base}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="a pair from models.toml (default: the default pair)")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--mix", choices=("long", "short"), default="long",
                    help="long: every answer runs to --max-tokens (the same work on every server); short: a quarter "
                         "answered in under 20 tokens, a quarter in one sentence, half long (a request's own costs)")
    ap.add_argument("--llama-cpp-bin", type=Path, default=None, help="folder with llama-server (else specdec only)")
    ap.add_argument("--specdec-parallel", type=int, default=0,
                    help="specdec's --parallel (0: its default, 4, or as many slots as clients where more)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every server this many times per concurrency, in alternating order (ABBA), "
                         "and report the mean tokens/s and the pooled TTFT: this machine's speed drifts")
    ap.add_argument("--exact-llama-server", action="store_true",
                    help="also run llama-server plain on the kernels specdec's target runs (-fa off, "
                         "GGML_CPU_TILED_MM=0, and the invariant kernels or --no-repack): what exactness costs, "
                         "apart from scheduling")
    ap.add_argument("--in-process", action="store_true",
                    help="also run specdec --no-draft without HTTP (Speculator.stream from the client threads): "
                         "what the server layer costs")
    ap.add_argument("--no-fair", action="store_true",
                    help="also run specdec auto with --no-fair: what fair slots cost in tokens per second")
    ap.add_argument("--burst-too", action="store_true",
                    help="also run specdec --no-draft with --burst-ms 0 (each token handed on alone, as llama-server "
                         "streams): what decoding a lone stream's tokens in bursts gains")
    ap.add_argument("--only", default=None, help="comma-separated server labels to run (a diagnosis, not a report)")
    record.add_option(ap)
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    if args.mix == "short":
        PROMPTS[:] = MIXED
    if (need := max(clients) * args.requests * args.rounds) > len(PROMPTS):  # a prompt sent again finds its answer
        ap.error(f"{args.rounds} rounds of {max(clients)} clients x {args.requests} requests need {need} prompts; "
                 f"there are {len(PROMPTS)}: fewer rounds or requests")
    target, draft = pair_files(args.pair)
    COUNT.append(count_tokens(target))
    costs = record.calibrated(target, draft, 2)  # before any server starts: nothing else runs
    pair_flags = ["--pair", args.pair] if args.pair else []
    def slots(c: int) -> str:
        return str(args.specdec_parallel or max(4, c))

    servers: dict[str, object] = {
        "specdec auto": lambda c: live_server("--ctx-size", str(CTX), "--max-queue", "64", "--parallel", slots(c),
                                              *pair_flags, env={"SPECDEC_CALIBRATE": "1"}, timeout=300),
        "specdec --no-draft": lambda c: live_server("--ctx-size", str(CTX), "--max-queue", "64", "--parallel",
                                                    slots(c), "--no-draft", *pair_flags,
                                                    env={"SPECDEC_CALIBRATE": "1"}, timeout=300),
    }  # fmt: skip
    if args.no_fair:
        servers["specdec auto --no-fair"] = lambda c: live_server("--ctx-size", str(CTX), "--max-queue", "64",
                                                                  "--parallel", slots(c), "--no-fair", *pair_flags,
                                                                  env={"SPECDEC_CALIBRATE": "1"}, timeout=300)  # fmt: skip
    if args.burst_too:
        servers["specdec --no-draft --burst-ms 0"] = lambda c: live_server(
            "--ctx-size", str(CTX), "--max-queue", "64", "--parallel", slots(c), "--no-draft", "--burst-ms", "0",
            *pair_flags, env={"SPECDEC_CALIBRATE": "1"}, timeout=300)  # fmt: skip
    if args.in_process:
        def in_process(c: int) -> Any:
            from specdec_cli import api

            return api.load(pair=args.pair, drafter=None, parallel=int(slots(c)), n_ctx=CTX, n_threads=2)

        servers["specdec in-process --no-draft"] = in_process
    if args.llama_cpp_bin is not None:
        binary = args.llama_cpp_bin / "llama-server"
        servers["llama-server"] = lambda c: llama_server(binary, target, None, c)
        servers["llama-server -md"] = lambda c: llama_server(binary, target, draft, c)
        if args.exact_llama_server:
            servers["llama-server exact"] = lambda c: llama_server(binary, target, None, c, exact=True)
    if args.only:
        keep = [label.strip() for label in args.only.split(",")]
        unknown = [label for label in keep if label not in servers]
        if unknown:
            ap.error(f"--only: no server {', '.join(map(repr, unknown))} here (servers: {', '.join(servers)})")
        servers = {label: start for label, start in servers.items() if label in keep}
    runs: dict[tuple[str, int], list[Run]] = {}
    for c in clients:
        with contextlib.ExitStack() as stack:  # every server up side by side, each idle while another runs
            up: dict[str, Any] = {}
            for label, start in servers.items():
                s = stack.enter_context(start(c))  # type: ignore[operator]
                if hasattr(s, "stream"):  # a Speculator: no HTTP
                    s.generate("Hello", max_tokens=8)
                else:  # its base URL; warm up (specdec calibrates here on first use)
                    s = s if isinstance(s, str) else s.base_url
                    one_request(s, "Hello", 8)
                up[label] = s
            for r in range(args.rounds):
                order = list(up.items()) if r % 2 == 0 else list(reversed(up.items()))
                first = r * c * args.requests  # every server gets the round's prompts; each round new ones
                for label, s in order:
                    if hasattr(s, "stream"):
                        run = measure_in_process(s, c, args.requests, args.max_tokens, first)
                    else:
                        run = measure(s, c, args.requests, args.max_tokens, first)
                    runs.setdefault((label, c), []).append(run)
                    print(f"{label:>20} c={c}: {run.tokens_per_second:6.1f} tok/s  TTFT p50 {run.ttft_p50 * 1000:5.0f} ms"
                          f"  p95 {run.ttft_p95 * 1000:5.0f} ms  per request {run.per_request:5.1f} tok/s",
                          file=sys.stderr, flush=True)  # fmt: skip
    results = {key: pooled(rs) for key, rs in runs.items()}
    print(f"pair: {args.pair or 'default'}; {args.requests} requests per client, {args.max_tokens} tokens, greedy; "
          f"{args.rounds} round(s); specdec --parallel {args.specdec_parallel or 'max(4, clients)'}; "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"{'clients':>7}  {'server':>20}  {'tok/s':>7}  {'TTFT p50':>9}  {'TTFT p95':>9}  {'per request':>11}  {'tokens':>6}"
          f"  {'request host':>12}")
    for c in clients:
        for label in servers:
            res = results[label, c]
            host = f"{statistics.median(res.hosts) * 1000:>10.1f}ms" if res.hosts else f"{'-':>12}"
            print(f"{c:>7}  {label:>20}  {res.tokens_per_second:>7.1f}  {res.ttft_p50 * 1000:>7.0f}ms"
                  f"  {res.ttft_p95 * 1000:>7.0f}ms  {res.per_request:>11.1f}  {res.tokens:>6}  {host}")  # fmt: skip
        ours, plain = results.get(("specdec auto", c)), results.get(("specdec --no-draft", c))
        theirs = [results[k, c] for k in LLAMA if (k, c) in results]
        if ours is None or plain is None:
            continue
        line = f"{'':>7}  specdec auto / --no-draft: {ours.tokens_per_second / plain.tokens_per_second:.2f}x"
        if theirs:
            best = max(r.tokens_per_second for r in theirs)
            line += f"; / best llama-server: {ours.tokens_per_second / best:.2f}x"
            # each round's ratio, its servers run minutes apart rather than across the whole run
            per_round = [a.tokens_per_second / max(runs[k, c][r].tokens_per_second for k in LLAMA if (k, c) in runs)
                         for r, a in enumerate(runs["specdec auto", c])]  # fmt: skip
            line += f" (by round: {', '.join(f'{x:.2f}' for x in per_round)}; median {statistics.median(per_round):.2f})"
        print(line + f"; same text with and without drafts: {ours.texts == plain.texts}")
    rounds = [{"server": label, "clients": c, "round": i, "tokens_per_second": round(r.tokens_per_second, 3),
               "ttft": [round(t, 4) for t in r.ttfts], "per_request": round(r.per_request, 3), "tokens": r.tokens,
               "request_host": [round(h, 5) for h in r.hosts]}
              for (label, c), rs in runs.items() for i, r in enumerate(rs)]  # fmt: skip
    same = {str(c): results["specdec auto", c].texts == results["specdec --no-draft", c].texts for c in clients
            if ("specdec auto", c) in results and ("specdec --no-draft", c) in results}  # fmt: skip
    record.save(args, "serve", threads=2, models={"target": target, "draft": draft}, data={
        "settings": {"pair": args.pair or "default", "clients": clients, "requests": args.requests,
                     "max_tokens": args.max_tokens, "mix": args.mix, "rounds": args.rounds, "ctx_per_slot": CTX,
                     "specdec_parallel": args.specdec_parallel or "max(4, clients)"},
        "servers": {label: kernels_of(label, target) for label in servers}, "costs": costs, "rounds": runs_out(rounds),
        "same_text_with_and_without_drafts": same})  # fmt: skip


def runs_out(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rounds in the order they ran within each concurrency (for the results file)."""
    return sorted(rounds, key=lambda r: (r["clients"], r["round"], r["server"]))


if __name__ == "__main__":
    main()

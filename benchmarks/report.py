"""The docs' tables, rendered from results files (never typed in): `docs/benchmarks.md` and the README.

Each function takes a results file written by a benchmark command (benchmarks/record.py,
`specdec bench --results`) and returns Markdown: a table and its caption (machine, date, commit,
rounds, the command, a link to the file). Where a benchmark ran several rounds, a cell is the median
with the range over the rounds in brackets. The pages call these from cog blocks; `python
scripts/docgen.py` regenerates them and the test suite fails when one is stale.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def load(name: str) -> dict[str, Any]:
    """A kept results file by its name in docs/results/."""
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data


# ------------------------------------------------------------------ the caption
def machine(stamp: dict[str, Any]) -> str:
    """"AMD EPYC (AVX2), 2 cores": the CPU and the widest SIMD its kernels could use."""
    cpu = stamp["cpu"]
    simd = set(cpu.get("simd", []))
    level = "AVX-512" if "avx512f" in simd else "AVX2" if "avx2" in simd else "AVX" if "avx" in simd else "no AVX"
    amx = " + AMX" if any(f.startswith("amx") for f in simd) else ""
    return f"{cpu['model']} ({level}{amx}), {cpu['cores']} cores"


def caption(data: dict[str, Any], name: str, base: str = "results/", rounds: int | None = None) -> str:
    """What a table was measured on, and where its numbers are."""
    s = data["stamp"]
    commit = (s.get("commit") or "?")[:7] + (" + uncommitted changes" if s.get("dirty") else "")
    parts = [machine(s), f"{s['threads']} thread{'s' if s['threads'] != 1 else ''}" if s.get("threads") else None, s["date"][:10],
             f"commit {commit}", f"llama-cpp-python {s['build']['llama_cpp_python']}",
             f"{rounds} rounds: median (range)" if rounds and rounds > 1 else "one round" if rounds else None]  # fmt: skip
    text = " · ".join(p for p in parts if p)
    return f"*{text}. `{s['command']}` · [{name}]({base}{name})*"


# ------------------------------------------------------------------ cells
def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """The median, and the range when there are several values: `88.0 (86.1-90.2)`."""
    values = list(values)
    mid = fmt(statistics.median(values))
    if len(values) < 2 or fmt(min(values)) == fmt(max(values)):
        return mid
    return f"{mid} ({fmt(min(values))}-{fmt(max(values))})"


def interval(ratios: Sequence[float], fmt: Callable[[float], str], resamples: int = 10_000) -> str:
    """The geometric mean of ratios measured in pairs, with a 95% bootstrap interval (seeded, so a page
    renders the same text from the same file): `0.97x (95% interval 0.94x-1.00x, 40 pairs)`."""
    import numpy as np

    logs = np.log(np.asarray(ratios, dtype=float))
    mid = fmt(float(np.exp(logs.mean())))
    if len(logs) < 2:
        return mid
    means = np.random.default_rng(0).choice(logs, size=(resamples, len(logs))).mean(axis=1)
    lo, hi = np.exp(np.percentile(means, [2.5, 97.5]))
    return f"{mid} (95% interval {fmt(float(lo))}-{fmt(float(hi))}, {len(logs)} pairs)"


def f1(x: float) -> str:
    return f"{x:.1f}"


def f2(x: float) -> str:
    return f"{x:.2f}"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def pair_label(data: dict[str, Any]) -> str:
    """The pair a results file measured: its name, or for the default pair (which has changed over time) the
    files the stamp names."""
    pair = data["settings"].get("pair", "default")
    if pair != "default":
        return f"`{pair}`"
    models = data["stamp"].get("models", {})
    target, draft = (models.get(k, {}).get("file") for k in ("target", "draft"))
    return f"`{target}` drafted by `{draft}` (the default pair then)" if draft else f"`{target}` (the default then)"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render(data: dict[str, Any], name: str, body: str, base: str, rounds: int | None) -> str:
    return f"{body}\n\n{caption(data, name, base, rounds)}\n"


# ------------------------------------------------------------------ benchmarks.decode_cost
def costs(name: str, base: str = "results/") -> str:
    """One token's time, batch costs c(b) and the perfect-drafter limit per model."""
    data = load(name)
    sizes = data["settings"]["sizes"]
    rows = [[r["model"], f"{r['one_token_ms']:.1f} ms", *(f2(r["batch"][str(b)]) for b in sizes),
             f"{r['perfect_drafter']:.2f}x (K = {r['perfect_k']})", "yes" if r["batch_equals_single"] else "**no**"]
            for r in data["rows"]]  # fmt: skip
    header = ["model", "one token", *(f"c({b})" for b in sizes), "perfect drafter", "batch = single"]
    return render(data, name, table(header, rows), base, None)


# ------------------------------------------------------------------ specdec bench
def bench(name: str, base: str = "results/", configs: Sequence[str] | None = None) -> str:
    """Speedup over the target alone per prompt category, acceptance, tokens/s (median and range of the runs)."""
    data = load(name)
    results = data["results"]
    cats = list(dict.fromkeys(r["category"] for r in results))
    runs = data.get("runs", [])
    rows = []
    for cfg in dict.fromkeys(r["config"] for r in results):
        if configs is not None and cfg not in configs:
            continue
        by = {r["category"]: r for r in results if r["config"] == cfg}
        every = by.get("all", by[cats[-1]])
        tps = [r["tokens"] / r["seconds"] for r in runs if r["config"] == cfg and r.get("seconds")]
        same = every.get("identical")
        rows.append([f"`{cfg}`", *(ratio(by[c]["speedup"]) if by.get(c, {}).get("speedup") else "" for c in cats),
                     pct(every["acceptance_rate"]) if every.get("acceptance_rate") is not None else "",
                     f2(every["tokens_per_step"]) if every.get("tokens_per_step") else "",
                     spread(tps, f1) if tps else f1(every["tps_median"]),
                     "" if same is None else "yes" if same else "**no**"])  # fmt: skip
    header = ["configuration", *(f"speedup, {c}" for c in cats), "acceptance", "tokens / step",
              "tok/s per run", "same text as the target alone"]  # fmt: skip
    c = data["costs"]
    limit = (f"Measured costs in this run: one target token {c['target_ms']:.1f} ms; a batch of 5 costs "
             f"{c['verify']['5']:.2f} and a batch of 9 {c['verify']['9']:.2f} single decodes"
             + (f"; a draft token {c['draft']:.2f} of a target token" if c.get("draft") else "")
             + f". The most any drafter could give under these costs (every token accepted, drafting free): "
             f"**{c['perfect_drafter']['speedup']:.2f}x** (K = {c['perfect_drafter']['k']}).")  # fmt: skip
    repeats = data["settings"]["repeats"]
    return render(data, name, table(header, rows) + "\n\n" + limit, base, repeats)


# ------------------------------------------------------------------ benchmarks.serve_bench
def _by(rounds: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rounds:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def _serve_rows(data: dict[str, Any], labels: Sequence[str], cell: Callable[[list[dict[str, Any]]], str]) -> list[list[str]]:
    """A serve table's rows: one per concurrency, a `cell` of each server's rounds there."""
    groups = _by(data["rounds"], "server", "clients")
    return [[str(c), *(cell(groups.get((label, c), [])) for label in labels)] for c in data["settings"]["clients"]]


def _median_ttft(rounds: list[dict[str, Any]]) -> float:
    return statistics.median(t for r in rounds for t in r["ttft"])


def serve(name: str, base: str = "results/", servers: Sequence[str] | None = None) -> str:
    """Aggregate tokens/s and median time to first token per server and concurrency."""
    data = load(name)
    labels = [s for s in data["servers"] if servers is None or s in servers]

    def cell(rs: list[dict[str, Any]]) -> str:
        return f"{spread([r['tokens_per_second'] for r in rs], f1)}, {ms(_median_ttft(rs))}" if rs else ""

    rows = _serve_rows(data, labels, cell)
    header = ["clients", *(f"{label}: tok/s, TTFT" for label in labels)]
    by_kernels: dict[str, list[str]] = {}
    for label in labels:  # servers that ran the same kernels, named together
        by_kernels.setdefault(data["servers"][label], []).append(label)
    kernels = "; ".join(f"{', '.join(names)}: {k}" for k, names in by_kernels.items())
    st = data["settings"]
    length = (f"of up to {st['max_tokens']} tokens (a quarter answered in under 20, a quarter in one sentence, "
              "half running to the limit)" if st.get("mix") == "short" else f"of {st['max_tokens']} tokens")
    note = (f"Pair {pair_label(data)}; each client sends {st['requests']} streamed greedy chat requests {length} "
            f"one after the other; aggregate tokens/s over the wall time, median time to first token. Kernels: "
            f"{kernels}.")  # fmt: skip
    if costs := data.get("costs"):  # measured before the servers started: the machine's speed drifts after
        note += f" Calibrated before the servers started: a target token {costs['target_ms']:.1f} ms"
        note += f", c(9) {costs['batch']['9']:.2f}" if "9" in costs.get("batch", {}) else ""
        note += f", a draft token {costs['draft']:.2f} of a target token." if costs.get("draft") else "."
    return render(data, name, table(header, rows) + "\n\n" + note, base, st["rounds"])


def serve_request_host(name: str, base: str = "results/") -> str:
    """Per server and concurrency, the median request's own host time: its time to first token less the prompt's
    decode time the server reported (serve_bench's `request_host`), beside the median time to first token."""
    data = load(name)
    labels = [s for s in data["servers"] if any(r.get("request_host") for r in data["rounds"] if r["server"] == s)]

    def cell(rs: list[dict[str, Any]]) -> str:
        hosts = [h for r in rs for h in r.get("request_host", [])]
        return f"{ms1(statistics.median(hosts))} of {ms(_median_ttft(rs))}" if hosts else ""

    rows = _serve_rows(data, labels, cell)
    header = ["clients", *(f"{label}: request host time of TTFT" for label in labels)]
    note = ("Median over every request: its time to first token less the prompt's decode time the server reports "
            "(`timings.prompt_ms`; in process, the prefill's): HTTP, the chat template, tokenization, admission, the "
            "stream's start, as each server counts its prompt: every prompt token in llama-server's and in specdec's "
            "batch engine (`--parallel` 2 or more, its default 4); with `--parallel 1` specdec counts the prompt but "
            "its last token, which its first step decodes, so its figure there holds one more token's decode.")  # fmt: skip
    return render(data, name, table(header, rows) + "\n\n" + note, base, data["settings"]["rounds"])


def serve_ratios(name: str, over: str, under: str) -> dict[int, list[float]]:
    """Per concurrency, each round's tokens/s of one server over another's (same round)."""
    data = load(name)
    groups = _by(data["rounds"], "server", "clients", "round")
    out: dict[int, list[float]] = {}
    for c in data["settings"]["clients"]:
        for i in range(data["settings"]["rounds"]):
            a, b = groups.get((over, c, i)), groups.get((under, c, i))
            if a and b:
                out.setdefault(c, []).append(a[0]["tokens_per_second"] / b[0]["tokens_per_second"])
    return out


def serve_ratios_table(name: str, pairs: Sequence[tuple[str, str]]) -> str:
    """Per concurrency, one server's tokens/s over another's, round by round (servers a round apart are
    minutes apart; within a round, seconds): median (range)."""
    data = load(name)
    rows, header = [], ["clients"]
    cols = []
    for over, under in pairs:
        r = serve_ratios(name, over, under)
        if r:
            cols.append(r)
            header.append(f"{over} / {under}")
    for c in data["settings"]["clients"]:
        rows.append([str(c), *(spread(col[c], ratio) if c in col else "" for col in cols)])
    return table(header, rows) + "\n"


# ------------------------------------------------------------------ benchmarks.repeats
KINDS = ("first", "repeat", "control")


def repeats(name: str, base: str = "results/") -> str:
    """Tokens/s on first asks, repeats and controls per server; repeats over first asks; against the target alone."""
    data = load(name)
    groups = _by(data["rounds"], "server")

    def rate(r: dict[str, Any], k: str) -> float:
        return float(r[k]["tokens"] / r[k]["seconds"])

    alone = {r["round"]: r for r in groups["specdec --no-draft",]}
    rows = []
    for (label,), rs in groups.items():
        rows.append([label, *(spread([rate(r, k) for r in rs], f1) for k in KINDS),
                     spread([rate(r, "repeat") / rate(r, "first") for r in rs], ratio),
                     *(spread([rate(r, k) / rate(alone[r["round"]], k) for r in rs], ratio) for k in ("repeat", "control")),
                     "yes" if data["same_text_as_plain_run"][label] else "no"])  # fmt: skip
    header = ["server", "first asks tok/s", "repeats", "controls", "repeats / first asks",
              "repeats vs specdec --no-draft", "controls vs --no-draft", "same text as its plain run"]
    st = data["settings"]
    note = (f"Pair {pair_label(data)}; one client, one slot, {len(st['workload'])} greedy streamed requests of up to "
            f"{st['max_tokens']} tokens sent to every server in turn; completion tokens over end-to-end time.")
    if data.get("lookup_bound"):
        note += (f" The most any lookup drafting could give on these repeats at this machine's batch costs "
                 f"(`--oracle`): **{data['lookup_bound']:.2f}x** the target alone.")
    return render(data, name, table(header, rows) + "\n\n" + note, base, st["rounds"])


# ------------------------------------------------------------------ benchmarks.rpc_latency
def rpc(name: str, base: str = "results/") -> str:
    """Tokens/s with the target on two RPC servers as latency grows, specdec and llama-server."""
    data = load(name)
    groups = _by(data["rounds"], "delay_ms", "server")
    servers = list(dict.fromkeys(r["server"] for r in data["rounds"]))
    rows = []
    for d in data["settings"]["delays_ms"]:
        row = [f"{d:g} ms"]
        for label in servers:
            row.append(spread([r["tokens_per_second"] for r in groups.get((d, label), [])], f1))
        for fast, slow in (("specdec auto", "specdec --no-draft"), ("llama-server -md", "llama-server")):
            a, b = groups.get((d, fast)), groups.get((d, slow))
            if a and b:
                row.append(spread([x["tokens_per_second"] / y["tokens_per_second"] for x, y in zip(a, b, strict=True)],
                                  ratio))  # fmt: skip
        rows.append(row)
    header = ["added each way", *(f"{s} tok/s" for s in servers), "specdec auto / alone"]
    if "llama-server" in servers:
        header.append("llama-server -md / plain")
    st = data["settings"]
    note = (f"Pair {pair_label(data)}; the target on {st['rpc_servers']} RPC servers on this machine, reached through a "
            f"delay proxy; {len(st['prompts'])} greedy streamed requests of up to {st['max_tokens']} tokens.")
    return render(data, name, table(header, rows) + "\n\n" + note, base, st["rounds"])


def pays(files: Sequence[tuple[str, str]], base: str = "results/") -> str:
    """Per pair (label, bench results file): what verifying and drafting cost there, the most a perfect drafter
    could give, and what auto and the best fixed model drafter measured, per prompt category."""
    rows, captions = [], []
    for label, name in files:
        data = load(name)
        c, res = data["costs"], data["results"]
        cats = [k for k in dict.fromkeys(r["category"] for r in res) if k != "all"]
        by = {(r["config"], r["category"]): r for r in res}
        models = [r for r in res if r["config"].startswith("model:") and r["category"] == "all" and r.get("speedup")]
        best = max(models, key=lambda r: r["speedup"], default=None)
        rows.append([label, f2(c["verify"]["9"]), f2(c["draft"]) if c.get("draft") else "",
                     f"{c['perfect_drafter']['speedup']:.2f}x",
                     *(ratio(by["auto", k]["speedup"]) if by.get(("auto", k), {}).get("speedup") else "" for k in cats),
                     f"{ratio(best['speedup'])} (`{best['config']}`)" if best else ""])  # fmt: skip
        captions.append(caption(data, name, base, data["settings"]["repeats"]))
    header = ["pair", "c(9): verifying 9 tokens", "a draft token", "perfect drafter", *(f"auto, {k}" for k in cats),
              "best fixed draft model"]  # fmt: skip
    same = all(r.get("identical") is not False for _, name in files for r in load(name)["results"])
    verdict = (f"Every greedy run's text was the target alone's: **{'yes' if same else 'no'}**. c(9) and the draft "
               "token's cost are in single target decodes; the perfect drafter is the most any drafter could give "
               "under those costs.")  # fmt: skip
    return table(header, rows) + "\n\n" + verdict + "\n\n" + "\n\n".join(captions) + "\n"


def screen(name: str, base: str = "results/") -> str:
    """The terminal a run leaves, as text (benchmarks/screen.py)."""
    data = load(name)
    screen = "\n".join(line.rstrip() for line in data["screen"].rstrip().splitlines())
    return f"```text\n{screen}\n```\n\n{caption(data, name, base)}\n"


# ------------------------------------------------------------------ benchmarks.host_time
def host_time(name: str, base: str = "results/") -> str:
    """Host time per step (outside llama_decode) by configuration, llama.cpp's programs beside, and a model:4
    step's parts."""
    data = load(name)
    rows = [[label, f"{m['host_ms_per_step']:.3f} ms", f"{m['sampling_ms_per_step']:.3f} ms",
             f"{m['other_ms_per_step']:.3f} ms", f"{m['decode_ms_per_step']:.2f} ms", f1(m["tokens_per_second"])]
            for label, m in data["medians"].items()]  # fmt: skip
    out = table(["greedy", "host per step", "drafting and verification maths", "the rest", "inside llama_decode",
                 "tokens/s"], rows)  # fmt: skip
    if data.get("native_over_numpy"):
        out += "\n\n" + table(["greedy", "tokens/s, patch 0006's calls / numpy's path (median of pairs)"],
                              [[k, f"{v:.3f}x"] for k, v in data["native_over_numpy"].items()])  # fmt: skip
    if data.get("bursts_over_not") is not None:
        rows = [["target alone", "in bursts / a token a call", f"{data['bursts_over_not']:.3f}x"]]
        if data.get("runs_over_not") is not None:
            rows.append(["model:4", "in runs of steps / a step a call", f"{data['runs_over_not']:.3f}x"])
        out += "\n\n" + table(["greedy", "tokens/s", "median of pairs"], rows)
    if data.get("llama_cpp"):
        # the specdec line each program ran beside, and specdec / the program in each repeat (median, range)
        side = {v["beside"]: (config, v["repeats"]) for config, v in (data.get("versus_llama_cpp") or {}).items()}
        out += "\n\n" + table(["llama.cpp, same model and kernels", "tokens/s", "beside", "specdec / llama.cpp"],
                              [[k, f1(v), side[k][0] if k in side else "", spread(side[k][1], ratio) if k in side else "-"]
                               for k, v in data["llama_cpp"].items()])  # fmt: skip
    if data.get("parts"):
        out += "\n\n" + table(["a model:4 step's host time, part by part (inclusive, timing wrappers included)",
                               "per step"], [[k, f"{v:.1f} us"] for k, v in data["parts"]["us_per_step"].items()])  # fmt: skip
    s = data["settings"]
    return render(data, name, out + f"\n\n{s['repeats']} repeats of {len(s['prompts'])} prompts, {s['n']} tokens "
                  "each, medians.", base, None)  # fmt: skip


def server_threads(name: str, base: str = "results/") -> str:
    """A streamed token's CPU in each server, thread by thread (benchmarks.server_threads): median (range) over
    the rounds."""
    data = load(name)
    us = lambda x: f"{x:.0f} us"  # noqa: E731
    rows = [[server, spread([r["ms_per_token"] for r in runs], f2) + " ms", spread([r["compute_us"] for r in runs], us),
             spread([r["http_us"] for r in runs], us), spread([r["http_busiest_us"] for r in runs], us),
             spread([r["switches"] for r in runs], f1)]
            for server, runs in data["runs"].items()]  # fmt: skip
    out = table(["one client, streamed", "a token, at the client", "CPU a token: llama.cpp's compute threads",
                 "the server's other threads", "the busiest of those", "context switches a token"], rows)  # fmt: skip
    s = data["settings"]
    (ours, mine), (theirs, other) = list(data["runs"].items())[:2]
    speed = ", ".join(ratio(b["ms_per_token"] / a["ms_per_token"]) for a, b in zip(mine, other, strict=True))
    return render(data, name, out + f"\n\n{s['n']}-token answers, greedy, the servers in turn; {ours}'s tokens per "
                  f"second over {theirs}'s, round by round: {speed}.", base, s["rounds"])  # fmt: skip


def request_profile(name: str, base: str = "results/") -> str:
    """A streamed request's time to first token in `specdec serve`, part by part (benchmarks.request_profile),
    and the host time against llama-server's on the same kernels."""
    data = load(name)
    med, skip = data["medians_ms"], data["not_host"]
    host = sum(v for k, v in med.items() if k != skip)
    rows = [[p["part"], f"{med[p['mark']]:.2f} ms", "" if p["mark"] == skip else f"{med[p['mark']] / host:.0%}"]
            for p in data["parts"]]  # fmt: skip
    out = table(["a streamed request, up to its first token", "median", "share of the host parts"], rows)
    theirs = data.get("llama_server_exact_host_ms") or []
    line = (f"Host time (time to first token less the prompt's decode), median over the requests: specdec "
            f"{statistics.median(data['host_ms']):.1f} ms")
    if theirs:
        line += f", llama-server on the same kernels {statistics.median(theirs):.1f} ms"
    s = data["settings"]
    note = (f"{line}. {len(data['requests'])} of {s['requests']} requests split at every mark (one after another, "
            f"one connection, `--parallel {s['parallel']}`, greedy, up to {s['max_tokens']} tokens, "
            f"`{s['prompts']}`'s prompts); each part's median, so the parts need not add up to the median total.")
    return render(data, name, out + "\n\n" + note, base, None)


# ------------------------------------------------------------------ benchmarks.kernels
def kernels(name: str, base: str = "results/") -> str:
    """The invariant kernels per model: their time, and the speed against the reference kernels and against
    llama.cpp's own, round by round (above one: the invariant kernels are faster)."""
    data = load(name)
    st = data["settings"]
    rows = []
    for r in data["rows"]:
        sets = r["rounds"]
        inv = sets["invariant"]

        def cells(key: str, fmt: Callable[[float], str], faster: Callable[[float, float], float],
                  inv: list[dict[str, float]] = inv, sets: dict[str, Any] = sets) -> list[str]:  # fmt: skip
            out = [spread([x[key] for x in inv], fmt)]
            for other in ("reference", "llama.cpp"):
                if other in sets:
                    out.append(spread([faster(a[key], b[key]) for a, b in zip(sets[other], inv, strict=True)], ratio))
                else:
                    out.append("")
            return out

        exact = "yes" if all(r["batch_equals_single"].values()) else "**no**"
        rows.append([r["model"], *cells("one_token_s", lambda x: f"{x * 1000:.2f} ms", lambda a, b: a / b),
                     *cells("one_token_long_s", lambda x: f"{x * 1000:.2f} ms", lambda a, b: a / b),
                     *cells("batch_s", lambda x: f"{x * 1000:.1f} ms", lambda a, b: a / b),
                     *cells("prefill_tokens_per_s", f1, lambda a, b: b / a), exact])  # fmt: skip
    header = ["model"]
    for what in (f"one token after {st['context']}", f"one token after {st['long_context']}",
                 f"batch of {st['batch']}", f"prefill {st['prefill']} (tokens/s)"):
        header += [f"{what}: invariant", "vs reference", "vs llama.cpp's"]
    header.append("batch = single")
    return render(data, name, table(header, rows), base, st["rounds"])


# ------------------------------------------------------------------ the smaller ones
def chat_ttft(name: str, base: str = "results/") -> str:
    data = load(name)
    rows = [[str(t["turn"]), str(t["conversation_tokens"]), f"{t['evaluated_target']} / {t['evaluated_draft']}",
             f"{t['ttft_ms']:.0f} ms"] for t in data["turns"]]  # fmt: skip
    c = data["cold"]
    rows.append([f"{c['turn']}, caches cleared", "", f"{c['evaluated_target']} / {c['evaluated_draft']}",
                 f"{c['ttft_ms']:.0f} ms"])  # fmt: skip
    header = ["turn", "conversation tokens", "evaluated before the first token (target / draft)", "time to first token"]
    return render(data, name, table(header, rows), base, None)


def pool_cost(name: str, base: str = "results/") -> str:
    data = load(name)
    rows = [[f"{r['pool_tokens']:,}", r["contexts"], f"{r['median_ms']:.3f} ms", f"{r['p90_ms']:.3f} ms",
             f"{r['max_ms']:.2f} ms"] for r in data["rows"]]  # fmt: skip
    return render(data, name, table(["tokens held", "contexts", "median", "90th percentile", "max"], rows), base, None)


def memory(name: str, base: str = "results/") -> str:
    d = load(name)
    body = table(["ctx-size", "peak RSS", "budget: 2 x file + 2 x KV cache + 300 MB", "within"],
                 [[str(d["settings"]["ctx_size"]), f"{d['peak_rss_mb']:.0f} MB",
                   f"2 x {d['model_file_mb']:.0f} + 2 x {d['kv_cache_mb']:.0f} + 300 = {d['budget_mb']:.0f} MB",
                   "yes" if d["within_budget"] else "**no**"]])  # fmt: skip
    return render(d, name, body, base, None)


def planted_bug(name: str, base: str = "results/") -> str:
    d = load(name)
    rows = [[r["engine"], str(r["position"]), str(r["n"]), f"{r['pvalue']:.3g}",
             "pass" if r["pvalue"] > d["settings"]["p_threshold"] else "**fail**"] for r in d["runs"]]  # fmt: skip
    body = table(["engine", "draft position", "samples", "chi-square p", f"p > {d['settings']['p_threshold']:g}"], rows)
    return render(d, name, body, base, None)


# ------------------------------------------------------------------ specdec heads train
def heads_train(names: Sequence[str], base: str = "results/") -> str:
    """Per training run: the data, held-out accuracy by head, the tokens a draft adds, time and memory."""
    files = [(n, load(n)) for n in names]
    k = max(len(d["held_out_accuracy"]) for _, d in files)
    rows = []
    for _, d in files:
        s = d["seconds"]
        target = d["stamp"]["models"]["target"]["file"]
        rows.append([f"`{target}`", str(d["texts"]), f"{d['tokens']:,}", f"{d['vocab']:,}",
                     f"{d['kept_epoch']} of {len(d['epochs'])}", *(pct(a) for a in d["held_out_accuracy"]),
                     f2(d["held_out_run"]), f"{s['generate'] / 60:.1f} + {s['read'] / 60:.1f} + {s['fit'] / 60:.1f} "
                     f"= **{sum(s.values()) / 60:.1f} min**", f"{d['peak_memory_mib']:,} MiB"])  # fmt: skip
    header = ["target", "texts", "tokens generated", "draftable tokens", "epoch kept",
              *(f"head {i + 1} (token +{i + 2})" for i in range(k)), "tokens a draft adds",
              "time: generate + read + fit", "peak memory"]  # fmt: skip
    captions = "\n\n".join(caption(d, n, base) for n, d in files)
    return f"{table(header, rows)}\n\n{captions}\n"


def heads_bound(bench_name: str, train_name: str) -> str:
    """What drafts of the heads could give under a bench run's measured costs: at the held-out chain rates
    of the training run, and with every guess right (drafting free in both)."""
    costs, chain = load(bench_name)["costs"], load(train_name)["held_out_chain"]
    c = {int(b): v for b, v in costs["verify"].items()}
    at = [(1 + sum(chain[:j])) / c[j + 1] for j in range(1, len(chain) + 1) if j + 1 in c]
    best = max(range(len(at)), key=lambda j: at[j])
    perfect = max((j + 1) / c[j + 1] for j in range(1, len(chain) + 1) if j + 1 in c)
    return (f"Under the costs [{bench_name}](results/{bench_name}) measured (one target token "
            f"{costs['target_ms']:.1f} ms; verifying 2, 3, 4 tokens costs "
            + ", ".join(f2(c[b]) for b in (2, 3, 4) if b in c)
            + f" single decodes), heads guessing as they did on held-out text "
            f"([{train_name}](results/{train_name}): all of the first j right "
            + ", ".join(pct(x) for x in chain)
            + f") can give at most **{at[best]:.2f}x** the target alone (drafting {best + 1}, guesses free); "
            f"heads that were always right, {perfect:.2f}x.\n")


def kept() -> list[str]:
    """Every results file kept in docs/results/."""
    return sorted(p.name for p in RESULTS.glob("*.json")) if RESULTS.is_dir() else []



# ------------------------------------------------------------------ benchmarks.fair_slots
def fair_slots(name: str, base: str = "results/") -> str:
    """Per server (fair slots on, off): a plain stream's gaps alone, beside a drafting request and beside the
    same request drafting nothing, and the pairs' aggregate tokens/s; then a chat's next turn's time to first
    token alone and beside its client's tasks."""
    data = load(name)
    st = data["settings"]
    groups = _by(data["rounds"], "server")
    gap_rows, turn_rows = [], []
    for label in st["servers"]:
        gaps = [r["gaps"] for r in groups.get((label,), [])]
        if not gaps:
            continue
        alone = [statistics.median(g["alone_gaps"]) for g in gaps]
        longest = [max(g["alone_gaps"]) for g in gaps]
        gap_rows.append([f"`{label}`", spread(alone, ms1), spread(longest, ms1),
                         spread([max(g["beside_gaps"]) for g in gaps], ms1),
                         spread([max(g["beside_gaps"]) / a for g, a in zip(gaps, alone, strict=True)], ratio),
                         spread([max(g["beside_gaps"]) / a for g, a in zip(gaps, longest, strict=True)], ratio),
                         spread([max(g["control_gaps"]) / a for g, a in zip(gaps, alone, strict=True)], ratio),
                         spread([max(g["control_gaps"]) / a for g, a in zip(gaps, longest, strict=True)], ratio),
                         spread([g["aggregate_tokens_per_second"] for g in gaps], f1),
                         spread([g["control_aggregate_tokens_per_second"] for g in gaps], f1)])  # fmt: skip
        row = [f"`{label}`"]
        for think in map(str, st["think"]):
            w = [r["webui"][think] for r in groups[(label,)]]
            row.append(f"{spread([x['alone']['ttft'] for x in w], ms)} / {spread([x['tasks']['ttft'] for x in w], ms)}"
                       f" (**{spread([x['tasks']['ttft'] / x['alone']['ttft'] for x in w], ratio)}**)")  # fmt: skip
        turn_rows.append(row)
    gap_header = ["server", "gap alone (median)", "longest gap alone", "longest gap beside the drafting request",
                  "longest beside / median alone", "longest beside / longest alone",
                  "beside it drafting nothing: longest / median alone", "... / longest alone",
                  "aggregate tok/s beside it", "aggregate tok/s, drafting nothing"]  # fmt: skip
    turn_header = ["server", *(f"next turn's first token, alone / beside the tasks: "
                               f"{'sent at once' if not float(t) else f'{float(t):g} s after the answer'}"
                               for t in st["think"])]  # fmt: skip
    by_round = _by(data["rounds"], "server", "round")

    def share(key: str) -> list[float]:
        return [by_round[("fair", i)][0]["gaps"][key] / by_round[("no-fair", i)][0]["gaps"][key]
                for i in range(st["rounds"]) if ("fair", i) in by_round and ("no-fair", i) in by_round]  # fmt: skip

    same = all(r["gaps"]["same_plain"] and r["gaps"]["same_copy"] for r in data["rounds"])
    pairs = [p for r in data.get("aggregate", []) for p in r["pairs"]]
    interleaved = (f"Aggregate tokens/s, fair over no-fair, in runs seconds apart ({st.get('interleaved')} pairs a "
                   f"round; geometric mean): beside the copying request **"
                   f"{interval([p['beside']['fair'] / p['beside']['no-fair'] for p in pairs], ratio)}**; beside it "
                   f"drafting nothing (the same requests; how the plain stream's prompt is read, and which slots the two "
                   f"take, may differ) "
                   f"{interval([p['control']['fair'] / p['control']['no-fair'] for p in pairs], ratio)}. "
                   if pairs else "")  # fmt: skip

    def per_step(label: str, where: str) -> str:
        return spread([r["gaps"]["copy_tokens_per_step"][where] for r in data["rounds"] if r["server"] == label
                       and r["gaps"]["copy_tokens_per_step"][where]], f1)  # fmt: skip

    note = (f"Pair {pair_label(data)}. {interleaved}Aggregate tokens/s of the plain stream and the drafting request, fair over "
            f"no-fair, in the runs above, a minute apart: {spread(share('aggregate_tokens_per_second'), ratio)}; the "
            f"same with the copying request drafting nothing: {spread(share('control_aggregate_tokens_per_second'), ratio)}. The copying request ({spread([r['gaps']['copy_tokens'] for r in data['rounds']], f1)} "
            f"tokens) emitted tokens per step alone: {per_step('fair', 'alone')}; beside the plain stream, fair: "
            f"{per_step('fair', 'beside')}, no-fair: {per_step('no-fair', 'beside')}. Every text the same "
            f"alone and beside: {'yes' if same else '**no**'}. Measured before the servers started: a target "
            f"token {data['costs']['target_ms']:.1f} ms; batches of 2, 3 and 5 tokens cost "
            + ", ".join(f2(data["costs"]["batch"][b]) for b in ("2", "3", "5")) + " single decodes.")  # fmt: skip
    body = table(gap_header, gap_rows) + "\n\n" + table(turn_header, turn_rows) + "\n\n" + note
    return render(data, name, body, base, st["rounds"])


def fair_cost(names: Sequence[str], base: str = "results/") -> str:
    """Per pair of models: aggregate tokens/s with fair slots over without, in one process (benchmarks.fair_cost),
    beside a drafting request and beside it drafting nothing."""
    rows, captions = [], []
    for name in names:
        data = load(name)
        cost = {d: interval([r["fair"]["tokens_per_second"] / r["no-fair"]["tokens_per_second"]
                             for r in data["rows"] if r["drafter"] == d], ratio) for d in ("auto", "none")}  # fmt: skip
        per_step = {k: spread([r[k]["copy_tokens_per_step"] for r in data["rows"] if r["drafter"] == "auto"], f1)
                    for k in ("fair", "no-fair")}  # fmt: skip
        rows.append([pair_label(data), f"**{cost['auto']}**", cost["none"], per_step["fair"], per_step["no-fair"],
                     "yes" if data["same_texts"] else "**no**"])  # fmt: skip
        captions.append(caption(data, name, base))
    header = ["pair", "aggregate tok/s, fair / no-fair: the copying request drafting (auto)",
              "... drafting nothing", "copying request's tokens a step, fair", "... no-fair", "same texts"]  # fmt: skip
    return table(header, rows) + "\n\n" + "\n\n".join(captions) + "\n"


def ms1(x: float) -> str:
    return f"{x * 1000:.1f} ms"

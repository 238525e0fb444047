"""Tables for docs/gpu.md from a kept `scripts/gpu-check.sh` results file (its `$OUT/gpu-check.json`, copied into
docs/results/): patch 0008's batch-invariant CUDA kernels against llama.cpp's own (bit-identity by width, costs,
llama-bench), greedy identity with a draft, and specdec beside llama.cpp's programs on the same GPU. Every figure
is read from the file; a table whose step did not run says so."""

from __future__ import annotations

from typing import Any

from benchmarks.report import f1, f2, load, ratio, table

STOCK, INVARIANT = "probe", "probe-inv"  # gpu-check.sh's labels: llama.cpp's kernels, patch 0008's


def caption(data: dict[str, Any], name: str, base: str = "results/") -> str:
    """The GPU, its driver and CUDA version, the host, the code and where the numbers are."""
    s = data["stamp"]
    commit = (s.get("commit") or "?")[:7] + (" + uncommitted changes" if s.get("dirty") else "")
    parts = [f"{s.get('gpu')} ({s.get('gpu_memory')})", f"driver {s.get('driver')}", f"CUDA {s.get('cuda_driver_version')}",
             f"nvcc {s.get('nvcc')}", f"{s.get('cpu')}, {s.get('cores')} cores", (s.get("date") or "")[:10],
             f"commit {commit}", f"build: {data.get('meta', {}).get('build', 'on the GPU machine')}"]  # fmt: skip
    return f"*{' · '.join(p for p in parts if p)}. `bash scripts/gpu-check.sh` · [{name}]({base}{name})*"


def _probes(data: dict[str, Any], label: str) -> list[dict[str, Any]]:
    return [p for p in data.get("probe") or [] if p.get("label") == label and "rows" in p]


def exactness(name: str, base: str = "results/") -> str:
    """Batch against one token at a time, flash attention on: the widths whose logits are bit-identical, per
    model and prefix, with llama.cpp's kernels and with patch 0008's."""
    data = load(name)
    rows = []
    for label, kernels in ((STOCK, "llama.cpp's"), (INVARIANT, "patch 0008")):
        for p in _probes(data, label):
            widths = sorted(int(b) for b in p["rows"])
            equal = sum(r["equal"] for r in p["rows"].values())
            worst = max(r["maxdiff"] for r in p["rows"].values())
            rows.append([kernels, p["model"].removesuffix(".gguf"), str(p["prefix"]), f"{widths[0]}-{widths[-1]}",
                         f"{equal} of {len(widths)}", "0" if worst == 0 else f"{worst:.3g}"])  # fmt: skip
    if not rows:
        return "*The probe did not run.*"
    return table(["kernels", "model", "prefix", "widths", "bit-identical widths", "max abs difference"], rows) + \
        "\n\n" + caption(data, name, base)


def costs(name: str, base: str = "results/") -> str:
    """What a batch costs with each kernel set (c(b) = a batch of b tokens over one token, after the shortest
    prefix), and llama-bench's single-stream and prompt speeds with each: the price of exactness."""
    data = load(name)
    out = []
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for label in (STOCK, INVARIANT):
        for p in _probes(data, label):
            if p.get("c"):
                by_model.setdefault(p["model"], {})[label] = p
    widths = ("2", "4", "5", "8", "9", "16", "17", "32", "33", "64")
    rows = []
    for model, got in by_model.items():
        for label, kernels in ((STOCK, "llama.cpp's"), (INVARIANT, "patch 0008")):
            if label in got:
                c = got[label]["c"]
                rows.append([model.removesuffix(".gguf"), kernels, f"{got[label]['ms_one']:.2f} ms",
                             *[f2(c[w]) if w in c else "-" for w in widths]])  # fmt: skip
    if rows:
        out.append(table(["model", "kernels", "one token", *[f"c({w})" for w in widths]], rows))
    bench = (data.get("tools") or {})
    stock, inv = bench.get("llama-bench-target") or [], bench.get("llama-bench-target-inv") or []
    pairs = []
    for s in stock:
        i = next((x for x in inv if x["n_prompt"] == s["n_prompt"] and x["n_gen"] == s["n_gen"]), None)
        if i and s.get("avg_ts") and i.get("avg_ts"):
            test = f"pp{s['n_prompt']}" if s["n_prompt"] else f"tg{s['n_gen']}"
            pairs.append([s["model"].removesuffix(".gguf"), test, f1(s["avg_ts"]), f1(i["avg_ts"]), ratio(i["avg_ts"] / s["avg_ts"])])
    if pairs:
        out.append(table(["llama-bench (flash attention on)", "test", "llama.cpp's kernels, tokens/s",
                          "patch 0008, tokens/s", "patch 0008 / llama.cpp's"], pairs))  # fmt: skip
    if not out:
        return "*No costs were measured.*"
    return "\n\n".join(out) + "\n\n" + caption(data, name, base)


def identity(name: str, base: str = "results/") -> str:
    """Greedy outputs with a draft (model:4) identical to the target alone's, per kernel set."""
    data = load(name)
    rows = []
    for key, v in (data.get("identity") or {}).items():
        if v.get("ok"):
            k = v.get("kernels") or {}
            rows.append([key, str(v.get("config")), f"{k.get('target')}", str(v.get("max_tokens")),
                         f"{v['identical']} of {v['prompts']}"])  # fmt: skip
    if not rows:
        return "*The identity check did not run.*"
    return table(["check", "drafter", "target's kernels", "tokens", "outputs identical to the target alone"], rows) + \
        "\n\n" + caption(data, name, base)


def speeds(name: str, base: str = "results/") -> str:
    """specdec on the 8B pair beside llama.cpp's programs on the same models and GPU: `specdec bench` (exact mode,
    warm, its prompts) and one `specdec run --kernels fast`, against llama-bench's single stream with the kernels
    specdec's target computes with and llama-speculative-simple at K = 4 (llama.cpp's own kernels)."""
    data = load(name)
    tools = data.get("tools") or {}
    tg = {key: next((x["avg_ts"] for x in tools.get(key) or [] if x.get("n_gen") and not x.get("n_prompt")), None)
          for key in ("llama-bench-target", "llama-bench-target-inv")}
    spec = (tools.get("spec-fa-on") or {}).get("tokens_per_second")
    bench = {r["config"]: r for r in ((data.get("bench") or {}).get("results") or []) if r.get("category") == "all"}
    kernels = (((data.get("bench") or {}).get("models") or {}).get("kernels") or {}).get("target")
    same = tg["llama-bench-target-inv" if kernels == "gpu" else "llama-bench-target"]
    rows = []

    def add(label: str, tps: float | None, accepted: str, versus: str, other: float | None) -> None:
        if tps:
            rows.append([label, f1(tps), accepted, versus, f1(other) if other else "-", ratio(tps / other) if other else "-"])

    for config, versus, other in (("target", "llama-bench tg128, the same kernels", same),
                                  ("model:4", "llama-speculative-simple K=4", spec),
                                  ("auto", "llama-speculative-simple K=4", spec)):  # fmt: skip
        r = bench.get(config)
        if r:
            rate = r.get("acceptance_rate")
            add(f"bench, exact ({kernels} kernels): {config}", r.get("tps_median"), "-" if rate is None else f2(rate),
                versus, other)  # fmt: skip
    fast = next((r for r in data.get("runs") or [] if r.get("pair") == "8b" and r.get("label") == "fast model k4 fixed"
                 and r.get("ok")), None)  # fmt: skip
    if fast:
        add("run --kernels fast: model:4", fast["tokens_per_second"], f2(fast["acceptance_rate"]) if fast.get(
            "acceptance_rate") is not None else "-", "llama-speculative-simple K=4", spec)  # fmt: skip
    if not rows:
        return "*specdec did not run on the GPU.*"
    return table(["specdec, 8B-shaped Q4_0 target and its 2-layer draft", "tokens/s", "acceptance", "llama.cpp",
                  "tokens/s", "specdec / llama.cpp"], rows) + "\n\n" + caption(data, name, base)  # fmt: skip


def chunks(name: str, earlier: str, base: str = "results/") -> str:
    """The same check's costs with patch 0008's wide batches in chunks of 8 columns (`name`, the patch as kept)
    and of 16 (`earlier`, a 16-column MMVQ since dropped), beside llama.cpp's: why 8."""
    rows = []
    widths = ("9", "16", "17", "32", "64")
    for file, label in ((name, "chunks of 8"), (earlier, "chunks of 16")):
        data = load(file)
        for p in _probes(data, INVARIANT):
            if p.get("c") and p["model"].startswith("r8b-q4_0"):
                rows.append([label, *[f2(p["c"][w]) if w in p["c"] else "-" for w in widths], f"[{file}]({base}{file})"])
        if file == name:
            for p in _probes(data, STOCK):
                if p.get("c") and p["model"].startswith("r8b-q4_0"):
                    rows.append(["llama.cpp's kernels", *[f2(p["c"][w]) if w in p["c"] else "-" for w in widths],
                                 f"[{file}]({base}{file})"])  # fmt: skip
    if not rows:
        return "*No costs were measured.*"
    return table(["8B-shaped Q4_0, flash attention on", *[f"c({w})" for w in widths], "results"], rows)


def streams(name: str, base: str = "results/") -> str:
    """Several sequences in one batch (a server's step: four sequences at different lengths, a KV stream each)
    against each sequence alone, per layout of tokens per sequence, with patch 0008's kernels and llama.cpp's."""
    data = load(name)
    rows = []
    for p in data.get("streams") or []:
        kernels = "patch 0008" if p.get("label") == "streams-inv" else "llama.cpp's"
        for layout, r in (p.get("rows") or {}).items():
            rows.append([kernels, p["model"].removesuffix(".gguf"), layout.replace("-", ", "),
                         "yes" if r["equal"] else "no", "0" if r["maxdiff"] == 0 else f"{r['maxdiff']:.3g}"])  # fmt: skip
    if not rows:
        return "*The several-sequence probe did not run.*"
    return table(["kernels", "model", "tokens of each sequence in the batch", "bit-identical to each alone",
                  "max abs difference"], rows) + "\n\n" + caption(data, name, base)  # fmt: skip


def host_time(name: str, base: str = "results/") -> str:
    """Host time per step on the GPU (`benchmarks.host_time` inside the check, 8B pair): wall time less the time
    inside llama_decode, per configuration, and a model:4 step's parts."""
    data = load(name)
    ht = data.get("host_time") or {}
    medians = ht.get("medians") or {}
    if not medians:
        return "*Host time was not measured on the GPU.*"
    out = table(["greedy, 8B-shaped Q4_0 on the GPU", "host per step", "inside llama_decode", "tokens/s"],
                [[k, f"{v['host_ms_per_step']:.3f} ms", f"{v['decode_ms_per_step']:.2f} ms", f1(v["tokens_per_second"])]
                 for k, v in medians.items()])  # fmt: skip
    tools = ht.get("llama_cpp") or {}
    versus = [(config, tool, tools.get(tool)) for config, tool in (("target alone", "llama-bench tokens/s"),
                                                                   ("model:4", "llama-speculative-simple K=4 tokens/s"))
              if config in medians and tools.get(tool)]  # fmt: skip
    side = ht.get("versus_llama_cpp") or {}  # each repeat's own ratio, where the run recorded them
    if versus:  # the same run's llama.cpp programs, same models, kernels and K (host_time's --llama-cpp-bin)
        out += "\n\n" + table(["specdec", "tokens/s", "llama.cpp, same models and kernels", "tokens/s", "specdec / llama.cpp"],
                              [[c, f1(medians[c]["tokens_per_second"]), t.removesuffix(" tokens/s"), f1(v),
                                ratio(side[c]["median"] if c in side else medians[c]["tokens_per_second"] / v)]
                               for c, t, v in versus])  # fmt: skip
    ways = [(label, ht[key]) for label, key in (("decodes queued ahead / in bursts", "ahead_over_not"),
                                                 ("in bursts / a token a call, neither ahead", "bursts_over_not"))
            if ht.get(key) is not None and "target alone (bursts)" in medians]  # fmt: skip
    if ways:  # host_time --ahead-too --bursts-too: the target alone's ways, each pair of runs side by side
        out += "\n\n" + table(["the target alone, tokens/s", "median of pairs"], [[k, ratio(v)] for k, v in ways])
    if ht.get("runs_over_not") is not None:  # --bursts-too: model:4 in runs of steps and a step a call
        out += "\n\n" + table(["model:4, tokens/s", "median of pairs"],
                              [["in runs of steps / a step a call", ratio(ht["runs_over_not"])]])  # fmt: skip
    parts = (ht.get("parts") or {}).get("us_per_step") or {}
    if parts:
        out += "\n\n" + table(["a model:4 step's host time, part by part", "per step"],
                              [[k, f"{v:.1f} us"] for k, v in parts.items()])  # fmt: skip
    return out + "\n\n" + caption(data, name, base)


def graph_shapes(name: str, base: str = "results/") -> str:
    """scripts/gpu/graph_shapes.py inside the check: the target's decode time per call at steady and alternating
    batch shapes, with llama.cpp's CUDA graphs (two runs, A B A) and without, from patch 0013 on with llama.cpp's
    key for captured graphs, from patch 0014 on with its parked graphs off, and how often a built graph was
    reused."""
    data = load(name)
    gs = data.get("graph_shapes") or {}
    if not gs.get("patterns"):
        return "*CUDA graphs across batch shapes were not measured in this run.*"
    rows = []
    given = [r for shapes in gs["patterns"].values() for r in shapes.values() if isinstance(r, dict)]
    keys = any("ms_node_key" in r for r in given)
    parked = any("ms_unparked" in r for r in given)
    for pattern, shapes in gs["patterns"].items():
        for n, r in shapes.items():
            if isinstance(r, dict):
                reused = shapes.get("graph_reused", "-")
                if parked:
                    reused += f" ({shapes.get('graph_reused_unparked', '-')})"
                rows.append([pattern, n, " / ".join(f"{x:.2f} ms" for x in r["ms_graphs"]), f"{r['ms_no_graphs']:.2f} ms",
                             ratio(r["off_over_on"])]
                            + ([f"{r['ms_node_key']:.2f} ms", ratio(r["node_key_over_on"])] if keys else [])
                            + ([f"{r['ms_unparked']:.2f} ms", ratio(r["unparked_over_on"])] if parked else [])
                            + [reused])  # fmt: skip
    key_cols = ["llama.cpp's key (patch 0013 off)", "its / patch 0013's"] if keys else []
    park_cols = ["not parked (patch 0014 off)", "its / patch 0014's"] if parked else []
    reused_col = "a built graph reused (not parked)" if parked else "llama.cpp's graph reused"
    return (table([f"target {gs.get('target')}: pattern", "tokens a call", "a call, CUDA graphs (A, A)", "without",
                   "without / with", *key_cols, *park_cols, reused_col], rows)
            + f"\n\n{gs.get('steps')} calls a pattern after 8 warm-up calls, medians per shape.\n\n"
            + caption(data, name, base))  # fmt: skip

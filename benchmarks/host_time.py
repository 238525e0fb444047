"""What specdec's loop costs outside llama.cpp: host time per step, beside llama.cpp's own programs.

    .venv/bin/python -m benchmarks.host_time [--pair NAME | --target T.gguf --draft D.gguf] [-n 128] [--repeats 3]
        [--llama-cpp-bin DIR] [--numpy-too] [--ahead-too] [--bursts-too]

For the pair (default: the embedded default), greedy: the target alone (one-token steps), the draft model
at a fixed K of 4, and the auto drafter (which plans every step, drafting or not), the same prompts, in
alternating order (model:4 in runs of steps, one call into llama.cpp each: engine/draft_runs.py); with
`--numpy-too`, each also on numpy's path (Python between every two decodes, as without
patch 0006's calls: engine/greedy.py), alternating with it, and the tokens/s ratio of the two. Host time is the
run's wall time (prompt included) less the seconds inside `llama_decode` (both models, prompt included), over
the steps: everything done between two decodes, the argmaxes, the cache bookkeeping, the events and stats. The
parts the stats name (sampling: the drafts' and the verification's maths; other: the rest of a step) are shown
beside it. With `--llama-cpp-bin`, `llama-speculative-simple` runs the same pair and K with the same kernels and
GPU layers (`bench.external.target_kernels`), and `llama-bench -n N` gives llama.cpp's single-stream tokens/s, so
each line has its llama.cpp counterpart in one run: after each repeat's runs, so that a machine whose speed drifts
(this project's do, by tens of percent) is compared with itself; `versus_llama_cpp` is the median over the repeats
of specdec's tokens/s in that repeat over the program's. A command, not a test: 2 cores time nothing while
anything else runs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import record
from specdec_cli import api
from specdec_cli.bench.external import target_kernels
from specdec_cli.engine.greedy import AHEAD_ENV

PROMPTS = [
    "Write a long story about a robot who learns to paint.",
    "Explain how a refrigerator works, step by step.",
    "Describe a walk through a busy market in the morning.",
    "List ten ideas for a science fair project and explain each one.",
]
COUNTERPARTS = {"target alone": "llama-bench tokens/s", "model:4": "llama-speculative-simple K=4 tokens/s"}
NUMPY = " (numpy's path)"
AHEAD = " (decodes ahead)"  # --ahead-too: the target alone with its decodes queued ahead (SPECDEC_DECODE_AHEAD=1)
BURSTS = " (bursts)"  # --bursts-too: ... in bursts, never ahead (SPECDEC_DECODE_AHEAD=0)
SINGLE = " (a token a call)"  # --bursts-too: ... neither (SPECDEC_DECODE_AHEAD=0, --burst-ms 0)
STEPWISE = " (a step a call)"  # --bursts-too: model:4 with --burst-ms 0: no runs of steps (engine/draft_runs.py)
VARIANTS = {AHEAD: ("1", None), BURSTS: ("0", None), SINGLE: ("0", 0.0)}  # SPECDEC_DECODE_AHEAD, burst seconds
MODEL4 = "model:4"
TARGET = "target alone"  # --numpy-too: the same configuration without patch 0006's calls (engine/greedy.py)
CONFIGS = {"target alone": {"drafter": "none"}, "model:4": {"drafter": "model", "draft_max": 4, "adaptive": False},
           "auto": {"drafter": "auto"}}


def one_run(spec: api.Speculator, prompt: str, n: int, config: dict[str, Any]) -> dict[str, float]:
    g = spec.generate(prompt, max_tokens=n, temperature=0, **config)
    s = g.stats
    inside = s.seconds.prefill + s.seconds.draft_decode + s.seconds.target_decode
    steps = max(1, s.steps)
    return {"steps": s.steps, "tokens": len(g.token_ids), "tokens_per_second": s.tokens_per_second,
            "host_ms_per_step": (s.wall_seconds - inside) / steps * 1000,
            "sampling_ms_per_step": s.seconds.sampling / steps * 1000, "other_ms_per_step": s.seconds.other / steps * 1000,
            "decode_ms_per_step": (s.seconds.draft_decode + s.seconds.target_decode) / steps * 1000}  # fmt: skip


# What a model:4 step runs outside llama_decode, part by part (docs/design.md#host-time): each a method timed by a
# wrapper, less the time its models spent inside llama_decode meanwhile. Inclusive: `verify` holds the target's
# rollback and `_emit`; the draft's `_fresh` its common prefix and rollback; `argmax_chain` the draft's catch-up
# decode and its K tokens (one call into llama.cpp, engine/greedy.py). In runs (engine/draft_runs.py), the steps
# after a generation's first: `StepRunner.run` holds the call (its C outside llama_decode) and `_fresh`, `_keep`
# a step's hand-over (`_emit`, the record); the other parts then run only for a generation's first step.
PARTS = {
    "a run: the call, its C and bookkeeping (StepRunner.run)": ("specdec_cli.engine.draft_runs", "StepRunner", "run"),
    "a run's step handed on (emit, the step's record)": ("specdec_cli.engine.speculative", "SpeculativeGenerator",
                                                         "_keep"),
    "draft: catch up (common prefix, rollback)": ("specdec_cli.engine.drafters.model", "ModelDrafter", "_fresh"),
    "draft: its catch-up decode and K tokens (argmax_chain)": ("specdec_cli.engine.model", "Model", "argmax_chain"),
    "target: the batch's decode and argmaxes (decode_argmax)": ("specdec_cli.engine.model", "Model", "decode_argmax"),
    "verification (argmax compare, rollback, emit, the step's record)": ("specdec_cli.engine.speculative",
                                                                         "SpeculativeGenerator", "verify"),
    "emitted tokens' text": ("specdec_cli.engine.speculative", "SpeculativeGenerator", "_emit"),
}  # fmt: skip


def parts(spec: api.Speculator, n: int) -> dict[str, Any]:
    """Microseconds per model:4 step in each of PARTS (the wrappers' own cost included), over the prompts."""
    import importlib

    spent = dict.fromkeys(PARTS, 0.0)
    originals = []
    for label, (module, cls_name, name) in PARTS.items():
        cls = getattr(importlib.import_module(module), cls_name)
        original = getattr(cls, name)
        originals.append((cls, name, original))

        def timed(self: Any, *a: Any, _f: Any = original, _label: str = label, **k: Any) -> Any:
            models = [m for m in (getattr(self, n, None) for n in ("model", "target", "draft")) if m is not None] or [self]
            d0, t0 = sum(m.decode_seconds for m in models), time.perf_counter()
            try:
                return _f(self, *a, **k)
            finally:
                spent[_label] += time.perf_counter() - t0 - (sum(m.decode_seconds for m in models) - d0)

        setattr(cls, name, timed)
    steps = 0
    try:
        for prompt in PROMPTS:
            steps += spec.generate(prompt, max_tokens=n, temperature=0, **CONFIGS["model:4"]).stats.steps
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)
    return {"steps": steps, "us_per_step": {label: round(v / steps * 1e6, 1) for label, v in spent.items()}}


def llama_cpp(bin_dir: Path, spec: api.Speculator, n: int, threads: int) -> dict[str, float]:
    """llama-bench's single-stream tokens/s and llama-speculative-simple's at K = 4, on specdec's kernels."""
    flags, kernel_env = target_kernels(spec.target.kernels, spec.gpu_layers[0])
    env = {**os.environ, **kernel_env}  # the tools' libraries may be found through LD_LIBRARY_PATH (a prebuilt one)
    target, draft = spec.choice.target, spec.choice.draft
    out: dict[str, float] = {}
    bench = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(target), "-p", "0", "-n", str(n), "-t", str(threads),
                            "-r", "3", "-o", "csv", *[g for f in flags for g in (["--repack", "0"] if f == "--no-repack" else [f])]],
                           capture_output=True, text=True, errors="replace", env=env, timeout=600)  # fmt: skip
    rows = [line.split(",") for line in bench.stdout.splitlines() if line.count(",") > 10]
    if len(rows) >= 2 and "avg_ts" in rows[0]:
        out["llama-bench tokens/s"] = float(rows[-1][rows[0].index("avg_ts")].strip('"'))
    speeds = []
    for prompt in PROMPTS:
        cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft), "-p", prompt, "-n",
               str(n), "--temp", "0", "-t", str(threads), "-td", str(threads), "--spec-type", "draft-simple",
               "--spec-draft-n-max", "4", "--spec-draft-p-min", "0", "-ngld", str(spec.gpu_layers[1]), *flags]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=600)
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", proc.stdout + proc.stderr)
        if m:
            speeds.append(int(m.group(1)) / float(m.group(2)))
    if speeds:
        out["llama-speculative-simple K=4 tokens/s"] = statistics.median(speeds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--target", default=None, help="a target file instead of --pair (scripts/gpu-check.sh's models)")
    ap.add_argument("--draft", default=None, help="its draft, with --target")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-cpp-bin", type=Path, default=None, help="folder with llama-bench and llama-speculative-simple")
    ap.add_argument("--numpy-too", action="store_true",
                    help="each configuration also on numpy's path (no patch 0006 calls), alternating with it")
    ap.add_argument("--ahead-too", action="store_true",
                    help="the target alone also with each decode queued before its last token goes out "
                         "(SPECDEC_DECODE_AHEAD=1, Model.decodes_ahead: for a GPU), alternating with it")  # fmt: skip
    ap.add_argument("--bursts-too", action="store_true",
                    help="the target alone also in bursts with its decodes never queued ahead, and a token a call "
                         "(--burst-ms 0: SpeculativeGenerator._bursts), alternating with it; model:4 also a step "
                         "a call (--burst-ms 0: no runs of steps), right after it")  # fmt: skip
    record.add_option(ap)
    args = ap.parse_args()
    paths = ["", NUMPY] if args.numpy_too else [""]
    runs: dict[str, list[dict[str, float]]] = {name + path: [] for name in CONFIGS for path in paths}
    external_runs: list[dict[str, float]] = []  # llama.cpp's programs after each repeat
    versus: dict[str, list[float]] = {}  # specdec's tokens/s over its llama.cpp counterpart's, per repeat
    with api.load(args.target, args.draft, pair=None if args.target else args.pair, n_threads=args.threads,
                  drafter="model") as spec:
        spec.remember = False
        spec.generate(PROMPTS[0], max_tokens=16)  # warm-up: first decodes, threads started
        native = {m: m._native for m in (spec.target, spec.draft) if m is not None}
        variants = ([AHEAD] if args.ahead_too else []) + ([BURSTS, SINGLE] if args.bursts_too else [])
        for v in variants:
            runs[TARGET + v] = []
        if args.bursts_too:
            runs[MODEL4 + STEPWISE] = []
        for rep in range(args.repeats):
            for prompt in PROMPTS:
                order = list(CONFIGS)[rep % len(CONFIGS):] + list(CONFIGS)[: rep % len(CONFIGS)]
                for name in order:
                    for path in paths if rep % 2 == 0 else paths[::-1]:
                        for m, calls in native.items():
                            m._native = None if path else calls
                        runs[name + path].append(one_run(spec, prompt, args.n, CONFIGS[name]))
                    for m, calls in native.items():  # the variants below run on the calls, not numpy's path
                        m._native = calls
                    if name == MODEL4 and args.bursts_too:  # its steps a call each, right after
                        burst, spec.burst_seconds = spec.burst_seconds, 0.0
                        try:
                            runs[MODEL4 + STEPWISE].append(one_run(spec, prompt, args.n, CONFIGS[name]))
                        finally:
                            spec.burst_seconds = burst
                    for v in variants if name == TARGET else ():  # the target alone the other ways, right after
                        ahead, seconds = VARIANTS[v]
                        was, burst = os.environ.get(AHEAD_ENV), spec.burst_seconds
                        os.environ[AHEAD_ENV] = ahead
                        spec.burst_seconds = burst if seconds is None else seconds
                        try:
                            runs[TARGET + v].append(one_run(spec, prompt, args.n, CONFIGS[name]))
                        finally:
                            os.environ.pop(AHEAD_ENV) if was is None else os.environ.update({AHEAD_ENV: was})
                            spec.burst_seconds = burst
            if args.llama_cpp_bin:
                external_runs.append(llama_cpp(args.llama_cpp_bin, spec, args.n, args.threads))
                for config, tool in COUNTERPARTS.items():
                    if tool in external_runs[-1]:
                        ours = statistics.median(r["tokens_per_second"] for r in runs[config][-len(PROMPTS):])
                        versus.setdefault(config, []).append(ours / external_runs[-1][tool])
        for m, calls in native.items():
            m._native = calls
        profile = parts(spec, args.n)
        external = {tool: round(statistics.median(r[tool] for r in external_runs if tool in r), 1)
                    for tool in COUNTERPARTS.values() if any(tool in r for r in external_runs)}  # fmt: skip
        files = {"target": spec.choice.target, "draft": spec.choice.draft}
    summary = {name: {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0]} for name, rs in runs.items()}
    ratios = {name: round(statistics.median(a["tokens_per_second"] / b["tokens_per_second"]
                                            for a, b in zip(runs[name], runs[name + NUMPY], strict=True)), 3)
              for name in CONFIGS if name + NUMPY in runs}  # fmt: skip
    def over(a: str, b: str) -> float | None:
        """The median of a's tokens/s over b's, pair by pair (run side by side); None where a was not run."""
        return (round(statistics.median(x["tokens_per_second"] / y["tokens_per_second"]
                                        for x, y in zip(runs[a], runs[b], strict=True)), 3) if a in runs else None)

    ahead_ratio = over(TARGET + AHEAD, TARGET + BURSTS) if TARGET + BURSTS in runs else over(TARGET + AHEAD, TARGET)
    bursts_ratio = over(TARGET + BURSTS, TARGET + SINGLE)
    runs_ratio = over(MODEL4, MODEL4 + STEPWISE) if MODEL4 + STEPWISE in runs else None
    for name, s in summary.items():
        print(f"{name:14s} host {s['host_ms_per_step']:.3f} ms/step (sampling {s['sampling_ms_per_step']:.3f}, "
              f"other {s['other_ms_per_step']:.3f}; decode {s['decode_ms_per_step']:.2f})  "
              f"{s['tokens_per_second']:.1f} tokens/s")  # fmt: skip
    for name, ratio in ratios.items():
        print(f"{name}: tokens/s on patch 0006's calls / on numpy's path, median of pairs run side by side: {ratio:.3f}")
    if ahead_ratio is not None:
        print(f"{TARGET}: tokens/s with its decodes queued ahead / in bursts (or the default without --bursts-too), "
              "median of pairs run side by side: "
              f"{ahead_ratio:.3f}")
    if bursts_ratio is not None:
        print(f"{TARGET}: tokens/s in bursts / a token a call, median of pairs run side by side: {bursts_ratio:.3f}")
    if runs_ratio is not None:
        print(f"{MODEL4}: tokens/s in runs / a step a call, median of pairs run side by side: {runs_ratio:.3f}")
    for name, value in external.items():
        print(f"{name}: {value:.1f}")
    side = {config: {"beside": COUNTERPARTS[config], "median": round(statistics.median(r), 3),
                     "repeats": [round(x, 3) for x in r]} for config, r in versus.items()}  # fmt: skip
    for config, v in side.items():
        print(f"{config} / {v['beside'].removesuffix(' tokens/s')}, median of the repeats: {v['median']:.3f} "
              f"({', '.join(f'{x:.3f}' for x in v['repeats'])})")
    for label, us in profile["us_per_step"].items():
        print(f"model:4 part: {label}: {us:.1f} us/step")
    record.save(args, "host-time", threads=args.threads, models=files,
                data={"settings": {"n": args.n, "repeats": args.repeats, "prompts": PROMPTS, "configs": CONFIGS},
                      "medians": summary, "native_over_numpy": ratios, "ahead_over_not": ahead_ratio, "bursts_over_not": bursts_ratio, "runs_over_not": runs_ratio, "llama_cpp": external, "versus_llama_cpp": side,
                      "llama_cpp_runs": external_runs, "parts": profile, "runs": runs})  # fmt: skip


if __name__ == "__main__":
    main()

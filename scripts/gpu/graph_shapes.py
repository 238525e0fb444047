"""Whether CUDA graphs survive specdec's batch shapes, for scripts/gpu-check.sh.

    python scripts/gpu/graph_shapes.py OUT.json TARGET.gguf [STEPS] [THREADS (0: specdec's default)]

llama.cpp captures a decode's CUDA graph and replays it while the graph's shape stays the same; a decode of
another shape resets it (it runs without a graph until two calls in a row agree again). specdec's target
alternates shapes where speculation does: a verification of K drafts is K + 1 tokens, a step without a draft
is one, adaptive K varies K. This decodes the target (every layer on the GPU, exact mode, greedy as specdec's
loop does: `Model.decode_argmax`, the next token fed back) in patterns of batch shapes:

    steady 1     one token a step (the target alone, a draft model's chain)
    steady 5     five a step (every step a K = 4 verification)
    1,5          one and five in turn (drafts paused on every other step)
    2,3,4,5      adaptive K cycling

and times each decode call in six child processes, in this order: with CUDA graphs and graph parking as the
build has them; with parking off (`LLAMA_GRAPH_PARK=0`: patch 0014 keeps a graph of a few tokens built, with
its own scheduler, when the shape changes, where llama.cpp keeps only its last one and builds the graph again on
the host at each change of shape); without CUDA graphs (`GGML_CUDA_DISABLE_GRAPHS=1`); with llama.cpp's own key
for its captured graphs (`GGML_CUDA_GRAPH_KEY_NODE=1`: the first node's address, where patch 0013 keys a
captured graph by its shape too, so that each shape keeps its own); with graphs again (the machine's drift
shows); and with llama.cpp's graph built again on the host at every call (`LLAMA_GRAPH_REUSE_DISABLE=1`), whose
steady rows against the first run's are what that rebuild costs a call. On a build without CUDA graphs (the CPU)
the runs with and without graphs are the same code: their ratios read 1.0 within noise.

Each pattern's count of calls that reused a built graph (llama.cpp's last one, or a parked one) says how often
the host built none, in the first run and with parking off. Writes OUT.json: per pattern and shape, the median
milliseconds of a decode call in each run, and the ratios. A shape's calls slower in a pattern than steady, and
as slow as without graphs, lose their graph there.

Last, in each process, MANY_SHAPES shapes in turn, three calls each (the second captures its graph), then
one-token calls again: more shapes than patch 0013 keeps captured graphs for (the least recently used go past
32), so the one-token graph went and is captured again; `many_shapes` has those calls' median beside the
run's steady ones (on a CPU, a short run of three shapes: the same calls, no graphs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

PATTERNS = {"steady 1": [1], "steady 5": [5], "1,5": [1, 5], "2,3,4,5": [2, 3, 4, 5]}
PROMPT = "Write a long story about a robot who learns to paint, with many details about colours and light."
MANY_SHAPES = 40  # shapes in turn after the patterns: more than patch 0013 keeps captured graphs for (32)
# the runs timed beside the graphs runs: the key of their call time (ms_KEY) and of its ratio (RATIO_over_on)
BESIDE = (("no_graphs", "off", "no graphs"), ("node_key", "node_key", "graphs, llama.cpp's key"),
          ("rebuilt", "rebuilt", "rebuilt each call"), ("unparked", "unparked", "not parked"))  # fmt: skip
CHILD = "child"  # argv[1] of the process that measures
# the child processes in order, each with the variable it sets and its value (None: the build as it is)
RUNS = (("graphs", None, ""), ("not parked", "LLAMA_GRAPH_PARK", "0"), ("no graphs", "GGML_CUDA_DISABLE_GRAPHS", "1"),
        ("graphs, llama.cpp's key", "GGML_CUDA_GRAPH_KEY_NODE", "1"), ("graphs again", None, ""),
        ("rebuilt each call", "LLAMA_GRAPH_REUSE_DISABLE", "1"))  # fmt: skip


def measure(target: str, steps: int, threads: int) -> dict[str, Any]:
    """Per pattern and batch shape, the median milliseconds of a decode call (`steps` calls after a warm-up of 8)."""
    from specdec_cli.engine import kernels, native
    from specdec_cli.engine.model import Model

    C = native.bindings()  # noqa: N806

    gpu = bool(native.gpu_devices())
    out: dict[str, Any] = {"gpu": gpu, "patterns": {}}
    # threads 0: specdec's own default, as gpu-check's runs use it (its kernel probe's verdict is kept per thread count)
    with Model(target, n_ctx=4096, n_threads=threads or None, n_gpu_layers=kernels.ALL_LAYERS if gpu else 0) as m:
        out["kernels"] = m.kernels
        prompt = m.tokenize(PROMPT, add_special=True, parse_special=False)
        nxt = prompt[-1]

        def call(n: int) -> float:
            """One decode of the pending token and n - 1 more (as drafts would be: here the same token again, all
            rejected), its greedy token the next pending one; its seconds."""
            nonlocal nxt
            t0 = time.perf_counter()
            tops = m.decode_argmax([nxt] * n, n)
            t = time.perf_counter() - t0
            if tops is None:
                raise SystemExit(f"graph_shapes: {target}: a row was not finite")
            m.rollback(len(m.tokens) - n + 1)  # keep the pending token, as a step that accepted no draft
            nxt = tops[0]
            if len(m.tokens) + MANY_SHAPES + 8 >= m.n_ctx:
                m.rollback(len(prompt) - 1)
            return t

        def start() -> None:
            nonlocal nxt
            m.reset()
            m.prefill(prompt[:-1])
            C.llama_perf_context_reset(m._ctx)
            nxt = prompt[-1]

        for name, shapes in PATTERNS.items():
            start()
            seconds: dict[int, list[float]] = {n: [] for n in shapes}
            for i in range(8 + steps):
                n = shapes[i % len(shapes)]
                t = call(n)
                if i >= 8:
                    seconds[n].append(t)
            out["patterns"][name] = {str(n): round(statistics.median(t) * 1000, 4) for n, t in seconds.items()}
            # llama.cpp's own graph reuse (host side: the graph built again on a change of shape)
            out["patterns"][name]["reused"] = C.llama_perf_context(m._ctx).n_reused
            out["patterns"][name]["calls"] = 8 + steps
        # more shapes than patch 0013 keeps captured graphs for, each three calls in a row (the second captures
        # it), then one-token calls again: the least recently used graphs went, the one-token one among them
        start()
        many = MANY_SHAPES if gpu else 3  # on a CPU the same calls without graphs: a short run of them
        for n in range(1, many + 1):
            for _ in range(3):
                call(n)
        after = [call(1) for _ in range(16)]
        out["many_shapes"] = {"shapes": many, "ms_1": round(statistics.median(after[8:]) * 1000, 4)}
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out_path, target = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    runs: dict[str, Any] = {}
    switches = {var for _, var, _ in RUNS if var}
    for label, var, value in RUNS:
        env = {k: v for k, v in os.environ.items() if k not in switches}
        if var:
            env[var] = value
        proc = subprocess.run([sys.executable, __file__, CHILD, target, str(steps), str(threads)], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"graph_shapes ({label}): {proc.stderr.strip().splitlines()[-1:]}")
        runs[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    table: dict[str, Any] = {}
    for name, shapes in PATTERNS.items():
        table[name] = {}
        for n in map(str, shapes):
            on = [runs[k]["patterns"][name][n] for k in ("graphs", "graphs again")]
            row: dict[str, Any] = {"ms_graphs": on}
            for key, ratio_key, label in BESIDE:  # each other run's call time, and over the graphs runs' mean
                ms = runs[label]["patterns"][name][n]
                row[f"ms_{key}"], row[f"{ratio_key}_over_on"] = ms, round(ms / statistics.mean(on), 4)
            table[name][n] = row
            print(f"{name:9s} {n}-token calls: with graphs {on[0]:.3f} / {on[1]:.3f} ms, without "
                  f"{row['ms_no_graphs']:.3f}: {row['off_over_on']:.3f}x; with llama.cpp's key {row['ms_node_key']:.3f}: "
                  f"{row['node_key_over_on']:.3f}x; not parked {row['ms_unparked']:.3f}: {row['unparked_over_on']:.3f}x; "
                  f"rebuilt each call {row['ms_rebuilt']:.3f}")  # fmt: skip
        p, q = runs["graphs"]["patterns"][name], runs["rebuilt each call"]["patterns"][name]
        u = runs["not parked"]["patterns"][name]
        table[name]["graph_reused"] = f"{p['reused']}/{p['calls']}"
        table[name]["graph_reused_unparked"] = f"{u['reused']}/{u['calls']}"
        table[name]["graph_reused_when_rebuilt"] = f"{q['reused']}/{q['calls']}"
        print(f"{name:9s} llama.cpp reused a built graph in {p['reused']} of {p['calls']} calls "
              f"({u['reused']} not parked)")
    # one-token calls after more shapes than patch 0013 keeps graphs for: in each run, beside its steady ones
    many = {label: runs[label]["many_shapes"]["ms_1"] for label, _, _ in RUNS}
    steady = {label: runs[label]["patterns"]["steady 1"]["1"] for label, _, _ in RUNS}
    n_many = runs["graphs"]["many_shapes"]["shapes"]
    print(f"after {n_many} shapes, 3 calls each: 1-token calls " + ", ".join(
        f"{label} {ms:.3f} ms (steady {steady[label]:.3f})" for label, ms in many.items()))
    result = {"target": os.path.basename(target), "gpu": runs["graphs"]["gpu"], "kernels": runs["graphs"]["kernels"],
              "steps": steps, "patterns": table,
              "many_shapes": {"shapes": n_many, "ms_1": many, "ms_1_steady": steady}}  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""What exact mode's kernels cost: the batch-invariant ones beside the reference ones and llama.cpp's own.

    .venv/bin/python -m benchmarks.kernels [--threads 2] [--rounds 5]

For the packaged models and SmolLM2's requantizations (Q4_0 and Q4_K_M are the quantizations llama.cpp
repacks on x86; Q8_0 and F32 go through llamafile's sgemm; Q4_1, the packaged SmolLM2, through ggml's own
matrix multiply, its Q8_0 output matrix through llamafile's), each file is loaded twice in this process, as
a target is: with the reference kernels (repacked weights and flash attention off) and with the invariant
ones (patches/llama.cpp/). The third set is llama.cpp's own: the invariant-loaded model with patch 0001's
switch (`ggml_cpu_batch_invariant`) turned off for its rounds, so every patched kernel computes as stock
llama.cpp does (flash attention on, repacked weights in groups of 4 rows, llamafile's sgemm from 2 rows).
The tiled K-quant matmul is off in all three (a process-wide variable, engine/native.py). Rounds alternate
between the sets. Per round: a single-token decode after 100 cells (median of 15) and after 1000 (attention's
share grows with the cells), a verification batch of 9 tokens after 100, and a 512-token prompt prefill.
The reference and invariant sets must compute a batch exactly as single tokens (checked on each).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks import record
from specdec_cli.calibration import BASE_TEXT
from specdec_cli.engine import kernels, native
from specdec_cli.engine.model import Model
from specdec_cli.models import packaged

LLAMA_CPP = "llama.cpp"  # llama.cpp's own kernels: the invariant-loaded model with the patches switched off
SETS = (kernels.REFERENCE, kernels.INVARIANT, LLAMA_CPP)
CONTEXT, LONG, BATCH, PREFILL = 100, 1000, 9, 512


def models() -> dict[str, str]:
    smol = packaged.smollm2_path()
    return {
        "SmolLM2-135M Q4_1 (packaged)": str(smol),
        "SmolLM2-135M Q4_0": str(packaged.derived_draft(smol, "Q4_0")),
        "SmolLM2-135M Q4_K_M": str(packaged.derived_draft(smol, "Q4_K_M")),
        "SmolLM2-135M Q8_0": str(packaged.derived_draft(smol, "Q8_0")),
        "SmolLM2-135M F32": str(packaged.derived_draft(smol, "F32")),
        "Gemma-3-270M Q4_K_M (packaged)": str(packaged.gemma3_path()),
    }


@contextmanager
def loaded(path: str, which: str, threads: int) -> Iterator[Model]:
    """A target's `Model` on the kernel set named (this benchmark picks it; specdec picks invariant)."""
    real = kernels.choose
    kernels.choose = lambda *a, **k: (which, None)  # type: ignore[assignment]
    try:
        m = Model(path, n_ctx=LONG + 64, n_threads=threads)
    finally:
        kernels.choose = real  # type: ignore[assignment]
    try:
        assert m.kernels == which, (m.kernels, m.warnings)
        yield m
    finally:
        m.close()


def timed(m: Model, tokens: list[int], keep: int, n: int, repeats: int) -> float:
    """Median seconds to decode tokens[keep:keep + n] after the first `keep` (logits at every row)."""
    m.prefill(tokens[:keep])
    times = []
    for _ in range(repeats):
        m.rollback(keep)
        t0 = time.perf_counter()
        m.decode(tokens[keep : keep + n], n_logits=min(n, m.n_batch))
        times.append(time.perf_counter() - t0)
    m.rollback(keep)
    return statistics.median(times)


def one_round(m: Model, tokens: list[int]) -> dict[str, float]:
    one = timed(m, tokens, CONTEXT, 1, 15)
    batch = timed(m, tokens, CONTEXT, BATCH, 5)
    long = timed(m, tokens, LONG, 1, 15)
    m.reset()
    t0 = time.perf_counter()
    m.prefill(tokens[:PREFILL])
    prefill = time.perf_counter() - t0
    m.reset()
    return {"one_token_s": one, "one_token_long_s": long, "batch_s": batch, "prefill_tokens_per_s": PREFILL / prefill}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    record.add_option(ap)
    args = ap.parse_args()
    rows, files = [], models()
    switch = native.batch_invariant_switch()
    for name, path in files.items():
        with loaded(path, kernels.REFERENCE, args.threads) as ref, loaded(path, kernels.INVARIANT, args.threads) as inv:
            models_of = {kernels.REFERENCE: ref, kernels.INVARIANT: inv, LLAMA_CPP: inv}
            assert switch.value, "the patched kernels are not on (set by ggml's CPU backend once a model is loaded)"
            tokens = ref.tokenize(BASE_TEXT * 30, add_special=True, parse_special=False)[: LONG + 1]
            assert len(tokens) > LONG, len(tokens)
            rounds: dict[str, list[dict[str, float]]] = {k: [] for k in SETS}
            for r in range(args.rounds):
                for which in SETS if r % 2 == 0 else reversed(SETS):
                    switch.value = which != LLAMA_CPP
                    try:
                        rounds[which].append(one_round(models_of[which], tokens))
                    finally:
                        switch.value = True
            exact = {which: kernels.batch_equals_single(m) for which, m in models_of.items() if which != LLAMA_CPP}
        rows.append({"model": name, "file": path.rsplit("/", 1)[-1], "rounds": rounds, "batch_equals_single": exact})
        med = {w: {k: statistics.median(x[k] for x in rounds[w]) for k in rounds[w][0]} for w in SETS}
        print(f"{name:32s} " + "  ".join(
            f"{w}: one token {m['one_token_s'] * 1e3:.2f} ms, after {LONG} {m['one_token_long_s'] * 1e3:.2f} ms, "
            f"batch of {BATCH} {m['batch_s'] * 1e3:.1f} ms, prefill {m['prefill_tokens_per_s']:.1f} tok/s"
            for w, m in med.items()) + f"  batch==single {exact}", flush=True)  # fmt: skip
    record.save(args, "kernels", threads=args.threads, models=files,
                data={"settings": {"rounds": args.rounds, "context": CONTEXT, "long_context": LONG, "batch": BATCH,
                                   "prefill": PREFILL},
                      "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()

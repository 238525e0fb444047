"""What a token costs: one-token decode time and the cost of verification batches.

    .venv/bin/python benchmarks/decode_cost.py [--threads 2] [--repeats 40]

For each packaged model: the median time of a single-token decode, and the time
of a batch of 2, 5, 9 and 16 tokens relative to it (what verifying K = b - 1
drafted tokens costs, in units of one target token). Also checks that the batched
logits are bit-identical to single-token decoding (exact mode).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from specdec_cli.engine.model import Model
from specdec_cli.models import packaged


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    for name in ("smollm2-135m-instruct", "gemma3-270m"):
        with Model(packaged.packaged_path(name), n_ctx=1024, n_threads=args.threads) as m:
            toks = m.tokenize("The history of the printing press begins", add_special=True, parse_special=True)
            m.prefill(toks)
            base = len(m.tokens)
            times: dict[int, float] = {}
            for b in (1, 2, 5, 9, 16):
                samples = []
                for _ in range(args.repeats):
                    m.rollback(base)
                    t0 = time.perf_counter()
                    m.decode(list(range(1000, 1000 + b)), n_logits=b)
                    samples.append(time.perf_counter() - t0)
                times[b] = statistics.median(samples)
            m.rollback(base)
            single = [m.decode([1000 + i])[0].copy() for i in range(9)]
            m.rollback(base)
            batch = m.decode(list(range(1000, 1009)), n_logits=9)
            exact = all(np.array_equal(batch[i], single[i]) for i in range(9))
            ratios = "  ".join(f"batch {b}: {times[b] / times[1]:.2f}x" for b in (2, 5, 9, 16))
            print(f"{name:22s} 1 token {times[1] * 1e3:6.2f} ms  {ratios}  batch==single: {exact}")


if __name__ == "__main__":
    main()

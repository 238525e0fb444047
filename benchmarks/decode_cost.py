"""What a token costs on this machine: one-token decode time and verification batch costs, per model.

    .venv/bin/python -m benchmarks.decode_cost [--threads 2] [--repeats 25]

For the packaged models and the files specdec derives from SmolLM2 (its Q2_K and Q8_0 requantizations,
and F32: bandwidth-bound, as a large model is on a CPU): the median time of a single-token decode in
exact mode (as a target runs), and c(b), the time of a batch of b tokens with logits at every row (a
verification of b - 1 drafted tokens) over it. From those, the most a perfect drafter could give:
max over K of (K + 1) / c(K + 1), every drafted token accepted and drafting free. Also checks that a
batch's logits are bit-identical to decoding its tokens one at a time (exact mode).
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks import record
from specdec_cli.calibration import BASE_TEXT
from specdec_cli.engine.costs import batch_costs
from specdec_cli.engine.model import Model
from specdec_cli.models import packaged

SIZES = (2, 3, 5, 9, 17)


def models() -> dict[str, str]:
    smol = packaged.smollm2_path()
    return {
        "SmolLM2-135M Q4_1 (packaged)": str(smol),
        "SmolLM2-135M Q2_K": str(packaged.derived_draft(smol, "Q2_K")),
        "SmolLM2-135M Q8_0": str(packaged.derived_draft(smol, "Q8_0")),
        "SmolLM2-135M F32": str(packaged.derived_draft(smol, "F32")),
        "Gemma-3-270M Q4_K_M (packaged)": str(packaged.gemma3_path()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=25)
    record.add_option(ap)
    args = ap.parse_args()
    rows, files = [], models()
    for name, path in files.items():
        with Model(path, n_ctx=1024, n_threads=args.threads) as m:
            base = m.tokenize(BASE_TEXT * 2, add_special=True, parse_special=False)
            one, cost = batch_costs(m, base, base[-max(SIZES):], max(SIZES), repeats=args.repeats, sizes=SIZES)
            m.prefill(base)
            single = [m.decode([t])[0].copy() for t in base[-9:]]
            m.rollback(len(base))
            batch = m.decode(base[-9:], n_logits=9)
            exact = all(np.array_equal(batch[i], single[i]) for i in range(9))
        k, best = max(((b - 1, b / cost[b]) for b in SIZES), key=lambda kb: kb[1])
        rows.append({"model": name, "file": path.rsplit("/", 1)[-1], "one_token_ms": round(one * 1000, 3),
                     "batch": {str(b): round(cost[b], 4) for b in SIZES}, "perfect_drafter": round(best, 4),
                     "perfect_k": k, "batch_equals_single": exact})  # fmt: skip
        print(f"{name:32s} 1 token {one * 1e3:6.2f} ms  " + "  ".join(f"c({b}) {cost[b]:5.2f}" for b in SIZES)
              + f"  perfect drafter {best:.2f}x (K={k})  batch==single: {exact}", flush=True)  # fmt: skip
    record.save(args, "decode-cost", threads=args.threads, models=files,
                data={"settings": {"repeats": args.repeats, "sizes": list(SIZES)}, "rows": rows})


if __name__ == "__main__":
    main()

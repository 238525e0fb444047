"""What a token-pool lookup costs per step (a command, not a test).

    .venv/bin/python -m benchmarks.pool_cost

Fills a pool with this repository's documentation and sources in SmolLM2's tokens (500-token texts), once and
six times over (about 150k and 900k tokens: the default 64 MB budget holds about 900k), and times
`TokenPool.propose` for 8 tokens on 2000 contexts of 40 tokens: taken from a text the pool holds (long
matches, many occurrences) and from a text it does not. Prints median, 90th percentile and maximum.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from benchmarks import record
from specdec_cli.engine.drafters.pool import TokenPool
from specdec_cli.engine.model import Model
from specdec_cli.models import packaged

ROOT = Path(__file__).resolve().parent.parent
UNRELATED = " ".join(f"Item {i}: a {w} of {i * 7 % 13} parts, sent on day {i % 31}." for i, w in
                     zip(range(2000), ["box", "crate", "bag", "case"] * 500, strict=True))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    record.add_option(ap)
    args = ap.parse_args()
    model = Model(packaged.smollm2_path(), n_ctx=256, n_threads=2, vocab_only=True)
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "specdec_cli").rglob("*.py"))]
    rows = []
    texts = [model.tokenize(f.read_text(), add_special=False, parse_special=False) for f in files]
    unrelated = model.tokenize(UNRELATED, add_special=False, parse_special=False)
    for copies in (1, 6):
        pool = TokenPool(1 << 30)
        for _ in range(copies):
            for t in texts:
                for i in range(0, len(t), 500):
                    pool.add(t[i : i + 500])
        rng = random.Random(0)
        for label, src in (("contexts from a held text", texts[0]), ("contexts from another text", unrelated)):
            times = []
            for _ in range(2000):
                j = rng.randrange(40, len(src))
                t0 = time.perf_counter()
                pool.propose(src[j - 40 : j], 8)
                times.append(time.perf_counter() - t0)
            times.sort()
            print(f"{len(pool):7d} tokens, {label:27s}: median {times[1000] * 1e3:.3f} ms, "
                  f"p90 {times[1800] * 1e3:.3f} ms, max {times[-1] * 1e3:.2f} ms")  # fmt: skip
            rows.append({"pool_tokens": len(pool), "contexts": label, "median_ms": round(times[1000] * 1e3, 4),
                         "p90_ms": round(times[1800] * 1e3, 4), "max_ms": round(times[-1] * 1e3, 4)})  # fmt: skip
    record.save(args, "pool-cost", threads=1, models={"vocabulary": packaged.smollm2_path()},
                data={"settings": {"lookups": 2000, "context_tokens": 40, "draft": 8}, "rows": rows})


if __name__ == "__main__":
    main()

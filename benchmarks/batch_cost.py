"""Verification batch cost relative to one token, with logits for every row and for one row.

.venv/bin/python benchmarks/batch_cost.py
"""

import statistics
import time

from specdec_cli.engine.model import Model
from specdec_cli.models import packaged

m = Model(packaged.smollm2_path(), n_ctx=1024, n_threads=2)
toks = m.tokenize(
    "The history of the printing press begins with a long story about " * 4, add_special=True, parse_special=True
)
m.prefill(toks)
base = len(m.tokens)


def t(b: int, nl: int, reps: int = 25) -> float:
    s = []
    for _ in range(reps):
        m.rollback(base)
        t0 = time.perf_counter()
        m.decode(list(range(1000, 1000 + b)), n_logits=nl)
        s.append(time.perf_counter() - t0)
    return statistics.median(s)


one = t(1, 1)
print(f"1 token {one * 1e3:.2f} ms")
for b in (2, 3, 5, 9):
    print(b, f"all-logits {t(b, b) / one:.2f}x  one-logit {t(b, 1) / one:.2f}x")

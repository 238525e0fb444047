"""What decoding costs on this machine: time a batch of b tokens against one token.

Speculation pays only when verifying b tokens in one batch costs much less
than b single decodes. These timings are the c_v(b) and c_draft of the
speedup model (docs/design.md, "The speedup model"); pair-check's probe, bench's
limits and the auto drafter's starting estimates all come from here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from specdec_cli.engine.protocol import LanguageModel

DENSE = 9  # batch sizes up to this are all measured; above it (a parallel server's batches, long drafts), a few
SPARSE = (12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def sizes_for(max_batch: int) -> list[int]:
    """The batch sizes worth timing up to max_batch: every one up to DENSE, then a few, then max_batch
    (costs grow about linearly past a few tokens: the sizes between are interpolated)."""
    sizes = list(range(2, min(max_batch, DENSE) + 1))
    sizes += [b for b in SPARSE if DENSE < b < max_batch]
    return sizes + ([max_batch] if max_batch > DENSE else [])


def median_decode_seconds(m: LanguageModel, base: Sequence[int], batch: Sequence[int], repeats: int) -> float:
    """Median time to decode `batch` after `base`, logits at every row (a verification batch)."""
    m.prefill(base)
    times = []
    for _ in range(repeats):
        m.rollback(len(base))
        t0 = time.perf_counter()
        m.decode(batch, n_logits=len(batch))
        times.append(time.perf_counter() - t0)
    m.rollback(len(base))
    return statistics.median(times)


def batch_costs(
    m: LanguageModel, base: Sequence[int], probe: Sequence[int], max_batch: int, repeats: int = 9,
    sizes: Sequence[int] | None = None,
) -> tuple[float, dict[int, float]]:
    """(seconds for one token, {b: cost of a batch of b in single-token units}) for b = 1..max_batch
    (or for `sizes` only: the large batches a parallel server reaches are measured sparsely)."""
    one = median_decode_seconds(m, base, probe[:1], max(repeats, 15))
    costs = {1: 1.0}
    for b in sizes if sizes is not None else range(2, max_batch + 1):
        costs[b] = median_decode_seconds(m, base, probe[:b], repeats) / one
    return one, costs


def draft_token_seconds(m: LanguageModel, base: Sequence[int], token: int, repeats: int = 15) -> float:
    """Median time of one single-token draft decode after `base` (what drafting a token costs)."""
    return median_decode_seconds(m, base, [token], repeats)

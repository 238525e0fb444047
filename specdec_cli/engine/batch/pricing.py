"""How the planner prices a step: llama.cpp's micro-batches of a multi-sequence batch, their cost in
single-token decodes, filler tokens that make one micro-batch of a split, and the fair count of a plan's
expected tokens (engine/batch/plan.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdec_cli.engine.estimates import BatchCosts


@dataclass(frozen=True)
class Choice:
    """One slot's draft in a plan."""

    source: str  # NGRAM, MODEL or "plain"
    n: int  # tokens to draft
    expected: float  # tokens the slot is expected to emit


def ubatch_sizes(counts: Sequence[int], n_ubatch: int) -> list[int]:
    """The micro-batches llama.cpp makes of a multi-stream batch with counts[s] tokens of sequence s
    (ordered by sequence, as the engine builds it): llama_batch_allocr::split_equal(sequential=true)
    takes a run of consecutive sequence ids and the same number of tokens from each."""
    rem = list(counts)
    sizes: list[int] = []
    while any(rem):
        start = next(s for s, c in enumerate(rem) if c)
        run = [start]
        while run[-1] + 1 < len(rem) and rem[run[-1] + 1] and len(run) < n_ubatch:
            run.append(run[-1] + 1)
        n = max(1, min(min(rem[s] for s in run), n_ubatch // len(run)))
        for s in run:
            rem[s] -= n
        sizes.append(n * len(run))
    return sizes


def batch_cost(counts: Sequence[int], costs: BatchCosts, n_ubatch: int) -> float:
    """What decoding these counts costs, in single-token decodes: one pass per micro-batch."""
    return sum(costs.relative(b) for b in ubatch_sizes(counts, n_ubatch))


def filled(counts: Sequence[int], gen: Sequence[int]) -> list[int]:
    """`counts` with every sequence from the first to the last generating one raised to the largest
    generating count (a gap or a short proposal filled), so that they make one micro-batch."""
    if not gen:
        return list(counts)
    lo, hi = min(gen), max(gen)
    top = max(counts[s] for s in gen)
    out = list(counts)
    for s in range(lo, hi + 1):
        if s in gen or counts[s] == 0:
            out[s] = top
    return out


def fair_tokens(plan: dict[int, Choice]) -> float:
    """The plan's expected tokens as the planner counts them: the slots' geometric mean times their number.
    Over the sum, a plan cannot buy one stream's tokens with the others' time: every slot pays for the larger
    batch, so a slot that drafts must gain more than the others lose (in proportion to each one's rate), and
    drafting into what filler tokens would cost anyway stays free. With one slot, or every slot gaining
    alike, it is the sum."""
    if not plan:
        return 0.0
    return len(plan) * math.exp(math.fsum(math.log(c.expected) for c in plan.values()) / len(plan))

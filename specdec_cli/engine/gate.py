"""Cost-aware draft length for free drafters (the n-gram lookup).

A verification batch is not free: on a CPU in exact mode, verifying b tokens
costs close to b single-token decodes (see README, "The speedup model"). A
free drafter's proposal is only worth verifying when the tokens it is expected
to add pay for the larger batch. The gate keeps two estimates, both learned
during the run:

- how proposals fare, by position: P(the first i proposed tokens are right).
  Every proposal is scored against the tokens the target actually produced,
  whether it was verified or not (shadow scoring: free, because the drafter
  costs nothing). In sampling mode a point-mass proposal x is accepted with
  probability p(x), the probability that the target alone samples x, so
  "equals the actual next token" is the same event in distribution.
- what a batch of b tokens costs relative to one: the target's decode time
  per batch size, as exponential moving averages; sizes not seen yet follow
  the average marginal cost of the sizes seen, starting from an optimistic
  prior so that drafting gets tried and measured.

It verifies the first j proposed tokens, j maximising
(1 + sum_{i<=j} P(first i right)) / cost(j + 1), and j = 0 (a plain decode)
when nothing beats it. The choice depends only on the past, so the output
(greedy) or its distribution (sampling) is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

DECAY = 0.97  # weight of older observations, per scored proposal
PRIOR_MARGINAL = 0.3  # assumed cost of each extra token in a batch, before any is measured
EMA = 0.2


class CostGate:
    def __init__(self) -> None:
        self.tries: list[float] = []  # tries[i]: proposals that reached position i + 1
        self.hits: list[float] = []  # hits[i]: ... and were right there
        self.cost: dict[int, float] = {}  # batch size -> EMA seconds
        self._pending: tuple[int, list[int]] | None = None  # (context length, proposal)

    # ------------------------------------------------------------ estimates
    def _p_run(self, n: int) -> list[float]:
        """P(the first i tokens are right) for i = 1..n (Laplace-smoothed conditional rates)."""
        out, p = [], 1.0
        for i in range(n):
            t = self.tries[i] if i < len(self.tries) else 0.0
            h = self.hits[i] if i < len(self.hits) else 0.0
            p *= (h + 1.0) / (t + 2.0)
            out.append(p)
        return out

    def relative_cost(self, b: int) -> float:
        one = self.cost.get(1)
        if b == 1:
            return 1.0
        if one and b in self.cost:
            return self.cost[b] / one
        slopes = [(self.cost[s] / one - 1.0) / (s - 1) for s in self.cost if s > 1] if one else []
        marginal = sum(slopes) / len(slopes) if slopes else PRIOR_MARGINAL
        return 1.0 + max(marginal, 0.0) * (b - 1)

    def choose(self, n_proposed: int) -> int:
        best_j, best = 0, 1.0
        expected = 1.0
        for j, p in enumerate(self._p_run(n_proposed), start=1):
            expected += p
            value = expected / self.relative_cost(j + 1)
            if value > best:
                best_j, best = j, value
        return best_j

    # ------------------------------------------------------------- learning
    def observe_cost(self, batch: int, seconds: float) -> None:
        old = self.cost.get(batch)
        self.cost[batch] = seconds if old is None else (1 - EMA) * old + EMA * seconds

    def propose(self, context_len: int, proposal: Sequence[int]) -> None:
        """Remember a proposal to score once its tokens are known (one at a time)."""
        if self._pending is None and proposal:
            self._pending = (context_len, list(proposal))

    def score(self, context: Sequence[int]) -> None:
        """Score the pending proposal against what the target produced, once decided."""
        if self._pending is None:
            return
        pos, prop = self._pending
        actual = context[pos : pos + len(prop)]
        run = 0
        while run < len(actual) and actual[run] == prop[run]:
            run += 1
        if run == len(actual) and len(actual) < len(prop):
            return  # all right so far, not all known yet
        self._pending = None
        n = min(len(prop), run + 1)  # positions that were reached
        while len(self.tries) < n:
            self.tries.append(0.0)
            self.hits.append(0.0)
        self.tries = [t * DECAY for t in self.tries]
        self.hits = [h * DECAY for h in self.hits]
        for i in range(n):
            self.tries[i] += 1.0
            if i < run:
                self.hits[i] += 1.0

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

from specdec_cli.engine.estimates import Acceptance, BatchCosts, best_length


class ShadowScore:
    """Scores a free drafter's proposals against the tokens the target produced, verified or not."""

    def __init__(self, acceptance: Acceptance) -> None:
        self.acceptance = acceptance
        self._pending: tuple[int, list[int]] | None = None  # (context length, proposal)

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
        self.acceptance.observe(len(prop), run)


class CostGate:
    def __init__(self, costs: BatchCosts | None = None) -> None:
        self.acceptance = Acceptance()
        self.shadow = ShadowScore(self.acceptance)
        self.costs = costs or BatchCosts()

    def choose(self, n_proposed: int) -> int:
        return best_length(self.acceptance, self.costs, n_proposed)[0]

    def observe_cost(self, batch: int, seconds: float) -> None:
        self.costs.observe(batch, seconds)

    def propose(self, context_len: int, proposal: Sequence[int]) -> None:
        self.shadow.propose(context_len, proposal)

    def score(self, context: Sequence[int]) -> None:
        self.shadow.score(context)

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

from collections import deque
from collections.abc import Sequence

from specdec_cli.engine.estimates import Acceptance, BatchCosts, best_length


class ShadowScore:
    """Scores a free drafter's proposals against the tokens the target produced, verified or not.

    Every step's proposal is queued and scored once decided (its first wrong token,
    or all of it, known), so unverified proposals teach as fast as verified ones.
    Acceptance is kept in two tables, by regime: whether the latest proposal's
    first token turned out right. Copying is bimodal (inside a repeated passage
    every proposal is right, outside nearly none is); one table would average the
    two and verify neither well.
    """

    MAX_PENDING = 16

    def __init__(self) -> None:
        self.tables = {True: Acceptance(), False: Acceptance()}
        self.last_ok = False
        self._pending: deque[tuple[int, list[int], bool]] = deque()  # (context length, proposal, regime)

    @property
    def acceptance(self) -> Acceptance:
        """The table for the regime the next proposal is in."""
        return self.tables[self.last_ok]

    def clear(self) -> None:
        """A new text begins: pending proposals go, and what was learned on earlier texts
        counts for a quarter (how well copying works depends on the text)."""
        self._pending.clear()
        self.last_ok = False
        for table in self.tables.values():
            table.forget(0.25)

    def propose(self, context_len: int, proposal: Sequence[int]) -> None:
        if proposal:
            if len(self._pending) >= self.MAX_PENDING:
                self._pending.popleft()
            self._pending.append((context_len, list(proposal), self.last_ok))

    def score(self, context: Sequence[int]) -> None:
        """Score every pending proposal that is decided; the newest decided first token sets the regime."""
        keep: deque[tuple[int, list[int], bool]] = deque()
        for pos, prop, regime in self._pending:
            actual = context[pos : pos + len(prop)]
            if actual:
                self.last_ok = actual[0] == prop[0]
            run = 0
            while run < len(actual) and actual[run] == prop[run]:
                run += 1
            if run == len(actual) and len(actual) < len(prop):
                keep.append((pos, prop, regime))  # all right so far, not all known yet
            else:
                self.tables[regime].observe(len(prop), run)
        self._pending = keep


class CostGate:
    def __init__(self, costs: BatchCosts | None = None) -> None:
        self.shadow = ShadowScore()
        self.costs = costs or BatchCosts()

    @property
    def acceptance(self) -> Acceptance:
        return self.shadow.acceptance

    def choose(self, n_proposed: int) -> int:
        return best_length(self.shadow.acceptance, self.costs, n_proposed)[0]

    def observe_cost(self, batch: int, seconds: float) -> None:
        self.costs.observe(batch, seconds)

    def propose(self, context_len: int, proposal: Sequence[int]) -> None:
        self.shadow.propose(context_len, proposal)

    def score(self, context: Sequence[int]) -> None:
        self.shadow.score(context)

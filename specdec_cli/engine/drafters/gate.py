"""Cost-aware draft length for free drafters (the n-gram lookup).

A verification batch is not free: on a CPU in exact mode, verifying b tokens
costs close to b single-token decodes (docs/design.md, "The speedup model"). A
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
  per batch size, as medians of recent timings (estimates.BatchCosts); sizes
  not timed yet follow the calibration, else the mean marginal cost of the
  sizes seen, else an optimistic prior so that drafting gets tried and measured.

It verifies the first j proposed tokens, j maximising
(1 + sum_{i<=j} P(first i right)) / cost(j + 1), and j = 0 (a plain decode)
when nothing beats it. The choice depends only on the past, so the output
(greedy) or its distribution (sampling) is unchanged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from specdec_cli.engine.estimates import Acceptance, BatchCosts, best_length

REPEAT, LONG, HIT, MISS = "repeat so far", "long pool match", "after a right first token", "after a wrong one"


class ShadowScore:
    """Scores a free drafter's proposals against the tokens the target produced, verified or not.

    Every step's proposal is queued and scored position by position as the text
    reaches it (a position is known once the target has produced the token there),
    until its first wrong token or its end: unverified proposals teach as fast as
    verified ones, and a proposal whose first tokens come true teaches that at once,
    not only when all of it is known (inside a repeated passage, verifying one token
    a step until eight-token proposals were whole cost five steps per text).
    Acceptance is kept in tables by regime: a proposal that continues a long match in the
    token pool (pool.py: a passage of an earlier text, matched on at least LONG_MATCH tokens), and
    the others split by whether the latest proposal's first token turned out right. In-context
    copying is bimodal (inside a repeated passage every proposal is right, outside nearly none is);
    one table would average the two and verify neither well. A long earlier match is other
    evidence: on the repeats of benchmarks/repeats.py every long-match proposal came out right at
    90-100% of its positions, after a miss as after a hit, so those share one table, and what they are
    worth is a property of the workload (are requests repeated?), not of one text: that table is
    kept across texts and starts from a higher prior (LONG_PRIOR: suffix decoding drafts a single
    earlier occurrence's continuation whole); the others are mostly forgotten when a new text begins.
    A match that covers the whole context (the text so far is, word for word, the beginning of an
    earlier one: a retried request, a regenerated answer) has a table of its own, REPEAT, also kept:
    with greedy decoding such a text goes on as before, so its drafts come true to their end, while a
    long match inside a changed text (the code ask with one name changed) breaks within a few tokens;
    in one table the retries priced the changed texts' long matches as retries (49 tokens drafted, 4
    right, on the F32 pair's code repeat with drafts of up to 64).
    """

    MAX_PENDING = 16
    LONG_MATCH = 16
    LONG_PRIOR = 0.8
    # In-context copies: a position no proposal has reached yet counts as UNSEEN times the one before
    # (estimates.Acceptance). Without it, two or three right proposals of a few tokens priced a 40-token
    # copy at 0.99 a position (the first run's prompt: a repeated clause, then 40 drafted, 0 accepted).
    UNSEEN = 0.8

    def __init__(self, tables: dict[str, Acceptance] | None = None) -> None:
        """`tables`: another score's, to learn into together (the heads' one table across the batch's slots)."""
        self.tables = tables if tables is not None else {
            REPEAT: Acceptance(prior=self.LONG_PRIOR), LONG: Acceptance(prior=self.LONG_PRIOR),
            HIT: Acceptance(unseen=self.UNSEEN), MISS: Acceptance(unseen=self.UNSEEN)}  # fmt: skip
        self.last_ok = False
        self.long = False  # the latest proposal continues a long pool match
        self.repeat = False  # ... one that covers the whole context: the text so far repeats an earlier one
        # (context length, proposal, regime, positions recorded so far)
        self._pending: deque[tuple[int, list[int], str, int]] = deque()

    @property
    def regime(self) -> str:
        """The latest proposal's regime: REPEAT, else LONG, else HIT or MISS by the latest known first token."""
        return REPEAT if self.repeat else LONG if self.long else HIT if self.last_ok else MISS

    @property
    def acceptance(self) -> Acceptance:
        """The table for the latest proposal's regime (the one about to be priced)."""
        return self.tables[self.regime]

    def clear(self, keep: float = 0.25) -> None:
        """A new text begins: pending proposals go, and what in-context copying taught on earlier
        texts counts for a quarter (how well it works depends on the text); `keep`: that share."""
        self._pending.clear()
        self.last_ok = self.long = self.repeat = False
        if keep < 1.0:
            self.tables[HIT].forget(keep)
            self.tables[MISS].forget(keep)

    def propose(self, context_len: int, proposal: Sequence[int], pool_match: int = 0) -> None:
        """Queue a proposal for scoring; `pool_match`: the length of the pool match it continues."""
        self.long = pool_match >= self.LONG_MATCH
        self.repeat = pool_match >= max(1, context_len)
        if proposal:
            if len(self._pending) >= self.MAX_PENDING:
                self._pending.popleft()
            self._pending.append((context_len, list(proposal), self.regime, 0))

    def score(self, context: Sequence[int]) -> None:
        """Record every position the text has reached since the last call; the newest proposal
        with a known first token sets the regime."""
        if not self._pending:  # nothing proposed (a job that never looks up): every step's case there
            return
        keep: deque[tuple[int, list[int], str, int]] = deque()
        for pos, prop, regime, done in self._pending:
            actual = context[pos : pos + len(prop)]
            if not actual:
                keep.append((pos, prop, regime, done))
                continue
            self.last_ok = actual[0] == prop[0]
            table = self.tables[regime]
            if done == 0:
                table.begin_proposal()
            i, missed = done, False
            while i < len(actual) and not missed:
                missed = actual[i] != prop[i]
                table.record(i, not missed)
                i += 1
            if not missed and i < len(prop):
                keep.append((pos, prop, regime, i))  # all right so far, not all known yet
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

    def propose(self, context_len: int, proposal: Sequence[int], pool_match: int = 0) -> None:
        self.shadow.propose(context_len, proposal, pool_match)

    def score(self, context: Sequence[int]) -> None:
        self.shadow.score(context)

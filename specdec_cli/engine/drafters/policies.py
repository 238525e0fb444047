"""Policies that wrap a drafter: how long a draft is, and how much of it is verified.

`compose(inner, config)` is the one place that assembles them, as the API,
bench, the tests and the benchmarks all want the same thing: a fixed K, or
(adaptive) K following acceptance, plus, for a free drafter, the cost gate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from specdec_cli.engine.drafters import Drafter, DraftRequest, Outcome, Proposal
from specdec_cli.engine.drafters.auto import SHADOW_SHARE
from specdec_cli.engine.drafters.base import hidden_wanted
from specdec_cli.engine.drafters.gate import CostGate
from specdec_cli.engine.settings import GenerateOptions


def compose(inner: Drafter, config: GenerateOptions, gate: CostGate | None = None) -> Drafter:
    """`gate`: a cost gate kept from earlier generations (what batches cost, how drafts fare), else a new one."""
    if not config.adaptive:
        return inner
    adaptive = AdaptiveLength(inner, config.draft_min, config.k_max)
    return CostGated(adaptive, learn_costs=not config.reproducible, gate=gate) if inner.free else adaptive


class AdaptiveLength:
    """K up by one after a draft the target accepted whole, down by one after a
    rejection, within [lo, hi].

    A draft that stopped short on its own (p-min, no n-gram match) and was
    accepted whole says nothing about K and leaves it alone.
    """

    def __init__(self, inner: Drafter, lo: int, hi: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.free = inner.free
        self.wants_hidden = hidden_wanted(inner)
        self.lo, self.hi = lo, hi
        self.k = hi
        self._asked = 0

    def decode_seconds(self) -> float:
        return self.inner.decode_seconds()

    @property
    def proposal_seconds(self) -> float:
        """The inner drafter's last proposal's time, when proposing costs time (the heads)."""
        return float(getattr(self.inner, "proposal_seconds", 0.0))

    def begin(self, prompt: Sequence[int]) -> None:
        self.inner.begin(prompt)

    def propose(self, req: DraftRequest) -> Proposal:
        self._asked = min(self.k, req.k)
        return self.inner.propose(dataclasses.replace(req, k=self._asked))

    def accept(self, outcome: Outcome) -> None:
        n_drafted = len(outcome.proposal.tokens)
        if n_drafted:
            if outcome.n_accepted < n_drafted:
                self.k = max(self.lo, self.k - 1)
            elif n_drafted >= self._asked:
                self.k = min(self.hi, self.k + 1)
        self.inner.accept(outcome)


class CostGated:
    """A free drafter whose proposals are trimmed by a `CostGate` (the n-gram drafter with adaptive K, the heads)."""

    def __init__(self, inner: Drafter, learn_costs: bool = True, gate: CostGate | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.free = inner.free
        self.wants_hidden = hidden_wanted(inner)
        self.gate = gate or CostGate()
        self.learn_costs = learn_costs  # False: a seeded sampled run must not depend on timings
        # A proposal that costs time (the heads' guesses: `proposal_seconds`) is skipped while the gate
        # verifies none of it, as often as keeps that time under SHADOW_SHARE (auto.py does the same).
        self._skip = 0

    def decode_seconds(self) -> float:
        return self.inner.decode_seconds()

    def begin(self, prompt: Sequence[int]) -> None:
        self.gate.shadow.clear()
        self._skip = 0
        self.inner.begin(prompt)

    def propose(self, req: DraftRequest) -> Proposal:
        if self._skip > 0:  # a proposal that costs time, and the last ones did not pay: skip this one
            self._skip -= 1
            return Proposal(k=req.k)
        proposal = self.inner.propose(req)
        self.gate.propose(len(req.context), proposal.tokens, proposal.pool_match)
        n = self.gate.choose(len(proposal.tokens))
        seconds, one = getattr(self.inner, "proposal_seconds", 0.0), self.gate.costs.one
        if n == 0 and seconds and one and self.learn_costs:
            self._skip = max(0, math.ceil(seconds / (SHADOW_SHARE * one)) - 1)
        return proposal.cut(n)

    def accept(self, outcome: Outcome) -> None:
        if self.learn_costs:
            self.gate.observe_cost(len(outcome.proposal.tokens) + 1, outcome.t_target)
        self.gate.score(outcome.context)
        self.inner.accept(outcome)

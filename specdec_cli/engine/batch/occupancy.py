"""How long the batch keeps its current number of requests: measured, to price a draft cache's catch-up.

A slot's draft cache falls behind while the planner leaves the draft model out (every
step with others beside it, on most CPUs). Catching up costs a draft batch of up to
`WINDOW` tokens, about as much per token as the target's own prefill on a CPU: it pays
only if the model then drafts for many steps. It stops paying for drafts the moment
another request joins (the model rarely pays in a fuller batch), so the planner
spreads that one-time cost over the steps expected before the batch grows, not over
the whole request.

That expectation is measured: each number of busy slots n has a growth rate, the
arrivals seen while n slots were busy over the steps spent at n (the maximum-likelihood
rate of a memoryless arrival process, with steps that ended otherwise counted as
time without an arrival). Both counts decay, so the estimate follows the load. A
server that takes one request at a time never sees its one slot joined: the horizon
is unbounded and catch-up is spread over the request, as in a solo run. Clients
taking turns (measured with two) see the alone state end within a few steps: catch-up is not bought then.
"""

from __future__ import annotations

import math

DECAY = 0.995  # per step: the counts remember about the last 200 steps


class Occupancy:
    def __init__(self) -> None:
        self.steps: dict[int, float] = {}  # steps spent with n busy slots (decayed)
        self.growths: dict[int, float] = {}  # arrivals seen while n slots were busy (decayed)
        self.last = 0

    def observe(self, busy: int) -> None:
        """One step with `busy` slots holding a request (called once per step, before planning it)."""
        for counts in (self.steps, self.growths):
            for n in counts:
                counts[n] *= DECAY
        if busy > self.last:
            self.growths[self.last] = self.growths.get(self.last, 0.0) + 1.0
        self.steps[busy] = self.steps.get(busy, 0.0) + 1.0
        self.last = busy

    def steps_until_growth(self, busy: int) -> float:
        """Expected steps before another request joins `busy` busy slots (inf: none ever seen to)."""
        g = self.growths.get(busy, 0.0)
        return self.steps.get(busy, 0.0) / g if g > 0 else math.inf

"""Drafters propose tokens; the verifier decides. Any proposal is safe.

A drafter returns the tokens it proposes and, for sampling, the distribution q
each was drawn from (the verifier's acceptance test needs q(x)). A deterministic
drafter can return point masses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from specdec_cli.engine.model import Model
from specdec_cli.engine.sampling import Dist, SamplerSettings, process, sample


class Drafter(Protocol):
    def prefill(self, prompt: Sequence[int]) -> None: ...

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: SamplerSettings,
        rng: np.random.Generator,
        stop_ids: frozenset[int],
    ) -> tuple[list[int], list[Dist]]: ...

    def decode_seconds(self) -> float: ...


class ModelDrafter:
    """A smaller model with the same vocabulary, run in its own context.

    Its cache follows the conversation through common-prefix `sync`: after a
    rejection the rejected tail is dropped and only the accepted tokens (and the
    target's token) are evaluated on the next step.
    """

    def __init__(self, model: Model) -> None:
        self.model = model

    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    def prefill(self, prompt: Sequence[int]) -> None:
        # The last prompt token is decoded by the first `propose`, with logits.
        self.model.prefill(prompt[:-1])

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: SamplerSettings,
        rng: np.random.Generator,
        stop_ids: frozenset[int],
    ) -> tuple[list[int], list[Dist]]:
        keep = min(self.model.common_prefix(context), len(context) - 1)
        fresh = context[keep:]
        if any(t >= self.model.n_vocab for t in fresh):
            return [], []  # a padded target token the draft cannot read: no draft this step
        self.model.rollback(keep)
        rows = self.model.decode(fresh)
        drafted: list[int] = []
        dists: list[Dist] = []
        for j in range(k):
            row = rows[0]
            if sampler.greedy:
                tok = int(np.argmax(row))
                q = Dist.point(tok)
            else:
                q = process(row, sampler)
                tok = sample(q, rng)
            drafted.append(tok)
            dists.append(q)
            if tok in stop_ids or j == k - 1:
                break
            rows = self.model.decode([tok])
        return drafted, dists

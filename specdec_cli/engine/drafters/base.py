"""Drafters propose tokens; the verifier decides. Any proposal is safe.

A drafter has a lifecycle, as llama.cpp's common_speculative does (begin, draft,
accept): `begin(prompt)` once per generation, then per step `propose(request)`
and, after verification, `accept(outcome)` with what the target kept. Wrappers
add policy without touching the loop (policies.py): `AdaptiveLength` moves K
with acceptance, `CostGated` trims a free drafter's proposals to what pays.

A proposal carries, for sampling, the distribution q each token was drawn from
(the acceptance test needs q(x)). A deterministic drafter (the n-gram lookup)
gives point masses: the target then accepts x with probability p(x) and, on
rejection, resamples from p with x removed, the ordinary rejection rule with
q = 1 at x. `free` says whether proposing costs a model decode. A drafter with
`wants_hidden` true (the heads, and auto when it holds them) is given the target's
hidden state in each `Outcome` (`hidden_wanted` reads the flag; it is optional).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specdec_cli.engine.sampling import Dist, SamplerSettings


@dataclass(frozen=True)
class DraftRequest:
    context: Sequence[int]  # prompt + output so far: the draft continues it
    k: int  # at most this many tokens (the room left and --max-tokens already applied)
    sampler: SamplerSettings
    rng: np.random.Generator
    stop_ids: frozenset[int]


@dataclass(frozen=True)
class Proposal:
    tokens: list[int] = field(default_factory=list)
    dists: list[Dist] = field(default_factory=list)  # q for each token (sampling's; a greedy draft may leave it empty)
    k: int = 0  # the length the drafter aimed for (the live panel's K)
    source: str | None = None  # which drafter proposed: MODEL or NGRAM
    predicted_speedup: float | None = None  # the cost model's prediction for this choice (auto drafter)
    note: str | None = None  # why the drafter chose as it did, when it has something to say
    pool_match: int = 0  # the length of the token-pool match this draft continues (0: not from the pool)

    def cut(self, n: int) -> Proposal:
        return dataclasses.replace(self, tokens=self.tokens[:n], dists=self.dists[:n])


# No drafts: the proposal of a plain step, shared (its lists are never changed: a proposal is read, and `cut` or
# `dataclasses.replace` make new ones). One per step cost several microseconds in the caches a decode just swept.
NO_DRAFT = Proposal()


@dataclass(frozen=True)
class Outcome:
    """What verification did with a proposal; `context` already holds the step's tokens."""

    context: Sequence[int]
    proposal: Proposal
    n_accepted: int
    t_target: float  # seconds the target took for the batch of len(proposal.tokens) + 1
    # The target's hidden state at the row whose logits gave the step's last token (the heads read it:
    # drafters/medusa.py); only for a drafter that `wants_hidden`, else None.
    hidden: np.ndarray | None = None


class DraftUnusable(Exception):
    """The drafter cannot go on (its model produced non-finite logits).

    `fallback` is what the run goes on with (None: the target alone).
    """

    def __init__(self, reason: str, fallback: Drafter | None = None) -> None:
        super().__init__(reason)
        self.fallback = fallback


class Drafter(Protocol):
    name: str
    free: bool  # proposing costs no model decode

    def begin(self, prompt: Sequence[int]) -> None: ...

    def propose(self, req: DraftRequest) -> Proposal: ...

    def accept(self, outcome: Outcome) -> None: ...

    def decode_seconds(self) -> float: ...


def hidden_wanted(drafter: Drafter | None) -> bool:
    """Whether the loop should return the target's hidden states to this drafter (drafters/medusa.py)."""
    return bool(getattr(drafter, "wants_hidden", False))

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
q = 1 at x. `free` says whether proposing costs a model decode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specdec_cli.engine.protocol import LanguageModel
from specdec_cli.engine.sampling import Dist, SamplerSettings, process, rows_finite, sample

MODEL = "model"
NGRAM = "ngram"


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
    dists: list[Dist] = field(default_factory=list)  # q for each token
    k: int = 0  # the length the drafter aimed for (the live panel's K)
    source: str | None = None  # which drafter proposed: MODEL or NGRAM
    predicted_speedup: float | None = None  # the cost model's prediction for this choice (auto drafter)
    note: str | None = None  # why the drafter chose as it did, when it has something to say

    def cut(self, n: int) -> Proposal:
        return dataclasses.replace(self, tokens=self.tokens[:n], dists=self.dists[:n])


@dataclass(frozen=True)
class Outcome:
    """What verification did with a proposal; `context` already holds the step's tokens."""

    context: Sequence[int]
    proposal: Proposal
    n_accepted: int
    t_target: float  # seconds the target took for the batch of len(proposal.tokens) + 1


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


def check_finite(model: LanguageModel, row: np.ndarray) -> None:
    if not rows_finite(row):
        # Corrupt weights: a NaN q would make min(1, p/q) accept anything.
        raise DraftUnusable(
            f"the draft model {model.name} produced non-finite logits (NaN or infinity); "
            "its weights are probably corrupt"
        )


def pick(model: LanguageModel, row: np.ndarray, req: DraftRequest, p_min: float) -> tuple[int, Dist] | None:
    """The draft token after `row` (the draft's logits) and the q it was drawn from; None where
    the draft's top probability is below `p_min` (the draft stops there)."""
    check_finite(model, row)
    if req.sampler.greedy:
        tok = int(np.argmax(row))
        # The top token's softmax probability, without materialising the softmax.
        if p_min > 0.0 and 1.0 / float(np.exp(row - row[tok]).sum()) < p_min:
            return None
        return tok, Dist.point(tok)
    q = process(row, req.sampler)
    if p_min > 0.0 and q.probs[0] < p_min:
        return None
    return sample(q, req.rng), q


class ModelDrafter:
    """A smaller model with the same vocabulary, run in its own context.

    Its cache follows the conversation through common-prefix sync: after a
    rejection the rejected tail is dropped and only the accepted tokens (and the
    target's token) are evaluated on the next step. `p_min` stops a draft where
    the draft's top probability falls below it.
    """

    name: str = MODEL
    free = False

    def __init__(self, model: LanguageModel, p_min: float = 0.0, window: int | None = None) -> None:
        self.model = model
        self.p_min = p_min
        # With a window, a cache that fell more than `window` tokens behind (the auto
        # drafter paused it) re-reads only the last `window` tokens of the context:
        # a draft is only a proposal, so a shorter history costs acceptance, never correctness.
        self.window = window
        self.offset = 0  # the cache holds context[offset:]
        self.last_catch_up = (0, 0.0)  # (tokens, seconds) evaluated by the last catch-up

    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    def begin(self, prompt: Sequence[int]) -> None:
        # The last prompt token is decoded by the first `propose`, with logits.
        self.offset = 0
        self.model.prefill(prompt[:-1])

    def accept(self, outcome: Outcome) -> None:
        """Nothing now: the next `propose` catches the cache up through the common prefix."""

    def catch_up(self, context: Sequence[int]) -> np.ndarray | None:
        """Make the cache hold `context` and return the logits after it (None: a token it cannot read)."""
        ctx = context[self.offset :]
        keep = min(self.model.common_prefix(ctx), len(ctx) - 1)
        if self.window is not None and len(ctx) - keep > self.window:
            self.offset = len(context) - self.window
            ctx = context[self.offset :]
            keep = min(self.model.common_prefix(ctx), len(ctx) - 1)
        fresh = ctx[keep:]
        if any(t >= self.model.n_vocab for t in fresh):
            return None  # a padded target token the draft cannot read
        self.model.rollback(keep)
        t0 = self.model.decode_seconds
        rows = self.model.decode(fresh)
        self.last_catch_up = (len(fresh), self.model.decode_seconds - t0)
        return rows

    def propose(self, req: DraftRequest) -> Proposal:
        rows = self.catch_up(req.context)
        if rows is None:
            return Proposal(k=req.k, source=MODEL)
        drafted: list[int] = []
        dists: list[Dist] = []
        for j in range(req.k):
            picked = pick(self.model, rows[0], req, self.p_min)
            if picked is None:
                break
            tok, q = picked
            drafted.append(tok)
            dists.append(q)
            if tok in req.stop_ids or j == req.k - 1:
                break
            rows = self.model.decode([tok])
        return Proposal(drafted, dists, req.k, MODEL)


class NgramDrafter:
    """Prompt lookup: no model, proposals copied from the context itself.

    The last n tokens of the context (prompt + generated) are looked up among
    its earlier n-grams, for n from `n_max` down to `n_min`: the longest n with
    a match wins, and among matches of that length the most recent. The draft
    is what followed that match, up to k tokens; where the copy reaches the end
    of the context it goes on copying its own output (a repeating pattern keeps
    repeating). No match: an empty draft, and the step is a plain target decode.

    An index from each n-gram to the position after its latest occurrence is
    kept up to date as the context grows, so a lookup costs n_max dict probes.
    """

    name: str = NGRAM
    free = True

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        self.n_min = n_min
        self.n_max = n_max
        self._tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        self._reset()

    def _reset(self) -> None:
        self._tokens = []
        self._index = {n: {} for n in range(self.n_min, self.n_max + 1)}

    def _extend(self, tokens: Sequence[int]) -> None:
        toks = self._tokens
        for tok in tokens:
            i = len(toks)  # the n-grams ending just before i are followed by tok
            for n, index in self._index.items():
                if i >= n:
                    index[tuple(toks[i - n : i])] = i
            toks.append(tok)

    def sync(self, context: Sequence[int]) -> None:
        """Make the index cover exactly `context` (extend it when the context only grew).

        Within a generation the context only grows, so checking its first and last
        indexed tokens (not all of them: this runs every step) tells growth from a new text.
        """
        toks = self._tokens
        m = len(toks)
        if m and not (len(context) >= m and context[m - 1] == toks[-1] and context[0] == toks[0]):
            self._reset()
            m = 0
        self._extend(context[m:])

    def lookup(self, k: int) -> list[int]:
        toks = self._tokens
        end = len(toks)
        for n in range(self.n_max, self.n_min - 1, -1):
            if end <= n:
                continue
            start = self._index[n].get(tuple(toks[end - n :]))
            if start is None:
                continue
            out: list[int] = []
            for j in range(k):
                pos = start + j
                out.append(toks[pos] if pos < end else out[pos - end])
            return out
        return []

    def decode_seconds(self) -> float:
        return 0.0  # no model: the lookup's own time is counted with the step's other work

    def begin(self, prompt: Sequence[int]) -> None:
        self._reset()
        self._extend(prompt)

    def accept(self, outcome: Outcome) -> None:
        """Nothing now: the next `propose` extends the index with the new tokens."""

    def propose(self, req: DraftRequest) -> Proposal:
        self.sync(req.context)
        drafted = self.lookup(req.k)
        for j, tok in enumerate(drafted):
            if tok in req.stop_ids:
                del drafted[j + 1 :]
                break
        return Proposal(drafted, [Dist.point(t) for t in drafted], req.k, NGRAM)

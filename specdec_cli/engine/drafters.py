"""Drafters propose tokens; the verifier decides. Any proposal is safe.

A drafter returns the tokens it proposes and, for sampling, the distribution q
each was drawn from (the verifier's acceptance test needs q(x)). A deterministic
drafter (the n-gram lookup) returns point masses: the target then accepts x with
probability p(x) and, on rejection, resamples from p with x removed, which is
the ordinary rejection rule with q = 1 at x.

`p_min` (both drafters take it; only a model has probabilities to compare) stops
a draft early when the draft model's top probability falls below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from specdec_cli.engine.model import Model
from specdec_cli.engine.sampling import Dist, SamplerSettings, process, rows_finite, sample


class DraftUnusable(Exception):
    """The drafter cannot go on (its model produced non-finite logits): drop it for the run."""


class Drafter(Protocol):
    def prefill(self, prompt: Sequence[int]) -> None: ...

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: SamplerSettings,
        rng: np.random.Generator,
        stop_ids: frozenset[int],
        p_min: float = 0.0,
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
        p_min: float = 0.0,
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
            if not rows_finite(row):
                # Corrupt weights: a NaN q would make min(1, p/q) accept anything.
                raise DraftUnusable(
                    f"the draft model {self.model.path.name} produced non-finite logits (NaN or infinity); "
                    "its weights are probably corrupt"
                )
            if sampler.greedy:
                tok = int(np.argmax(row))
                # The top token's softmax probability, without materialising the softmax.
                if p_min > 0.0 and 1.0 / float(np.exp(row - row[tok]).sum()) < p_min:
                    break
                q = Dist.point(tok)
            else:
                q = process(row, sampler)
                if p_min > 0.0 and q.probs[0] < p_min:
                    break
                tok = sample(q, rng)
            drafted.append(tok)
            dists.append(q)
            if tok in stop_ids or j == k - 1:
                break
            rows = self.model.decode([tok])
        return drafted, dists


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

    free = True  # proposing costs no model decode (the cost-aware gate may trim proposals)

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes need 1 <= ngram-min <= ngram-max, got {n_min} and {n_max}")
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
        """Make the index cover exactly `context` (extend it when the context only grew)."""
        m = len(self._tokens)
        if not (len(context) >= m and list(context[:m]) == self._tokens):
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

    def prefill(self, prompt: Sequence[int]) -> None:
        self._reset()
        self._extend(prompt)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        sampler: SamplerSettings,
        rng: np.random.Generator,
        stop_ids: frozenset[int],
        p_min: float = 0.0,
    ) -> tuple[list[int], list[Dist]]:
        self.sync(context)
        drafted = self.lookup(k)
        for j, tok in enumerate(drafted):
            if tok in stop_ids:
                del drafted[j + 1 :]
                break
        return drafted, [Dist.point(t) for t in drafted]

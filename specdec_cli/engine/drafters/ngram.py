"""The n-gram lookup drafts: what followed the latest earlier match of the last tokens (prompt lookup)."""

from __future__ import annotations

from collections.abc import Sequence

from specdec_cli.engine.drafters.base import DraftRequest, Outcome, Proposal
from specdec_cli.engine.drafters.pool import TokenPool
from specdec_cli.engine.sampling import Dist
from specdec_cli.engine.settings import NGRAM


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

    With a `pool` (pool.py: what earlier generations read and wrote), the pool is asked too, and its
    draft is taken when its match is longer than the context's.
    """

    name: str = NGRAM
    free = True

    def __init__(self, n_min: int = 2, n_max: int = 4, pool: TokenPool | None = None) -> None:
        self.n_min = n_min
        self.n_max = n_max
        self.pool = pool
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
        return self.match(k)[0]

    def match(self, k: int) -> tuple[list[int], int]:
        """The draft from the context, and the length of the match it follows (0: none)."""
        toks = self._tokens
        end = len(toks)
        for n in range(self.n_max, self.n_min - 1, -1):
            if end <= n:
                continue
            start = self._index[n].get(tuple(toks[end - n :]))
            if start is None:
                continue
            # what followed the earlier occurrence; past the end of the text, the draft goes on repeating itself
            # (out[j] = out[j - (end - start)]), the period of the copy
            seg = toks[start:end]
            return (seg * (k // len(seg) + 1))[:k], n
        return [], 0

    def decode_seconds(self) -> float:
        return 0.0  # no model: the lookup's own time is counted with the step's other work

    def begin(self, prompt: Sequence[int]) -> None:
        self._reset()
        self._extend(prompt)

    def accept(self, outcome: Outcome) -> None:
        """Nothing now: the next `propose` extends the index with the new tokens."""

    def propose(self, req: DraftRequest) -> Proposal:
        self.sync(req.context)
        drafted, n = self.match(req.k)
        pool_match = 0
        if self.pool is not None:
            pooled, m = self.pool.propose(req.context, req.k)
            if m > n:
                drafted, pool_match = pooled, m
        if not req.stop_ids.isdisjoint(drafted):  # one C-level check on most steps, the loop only where one is
            for j, tok in enumerate(drafted):
                if tok in req.stop_ids:
                    del drafted[j + 1 :]
                    break
        return Proposal(drafted, [Dist.point(t) for t in drafted], req.k, NGRAM, pool_match=pool_match)

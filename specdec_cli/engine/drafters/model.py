"""The draft model drafts: K tokens from a smaller model of the same vocabulary, with the q each was drawn from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdec_cli.engine.drafters.base import DraftRequest, DraftUnusable, Outcome, Proposal
from specdec_cli.engine.protocol import LanguageModel
from specdec_cli.engine.sampling import Dist, finite_argmax, process, rows_finite, sample
from specdec_cli.engine.settings import MODEL


def non_finite(model: LanguageModel) -> DraftUnusable:
    # Corrupt weights: a NaN q would make min(1, p/q) accept anything.
    return DraftUnusable(f"the draft model {model.name} produced non-finite logits (NaN or infinity); "
                         "its weights are probably corrupt")  # fmt: skip


def check_finite(model: LanguageModel, row: np.ndarray) -> None:
    if not rows_finite(row):
        raise non_finite(model)


def pick(model: LanguageModel, row: np.ndarray, req: DraftRequest, p_min: float) -> tuple[int, Dist] | None:
    """The draft token after `row` (the draft's logits) and the q it was drawn from; None where
    the draft's top probability is below `p_min` (the draft stops there)."""
    if req.sampler.greedy:
        top = finite_argmax(row)  # one pass over the logits: the argmax sees a NaN or an infinity too
        if top is None:
            raise non_finite(model)
        tok = int(top)
        # The top token's softmax probability, without materialising the softmax.
        if p_min > 0.0 and 1.0 / float(np.exp(row - row[tok]).sum()) < p_min:
            return None
        return tok, Dist.point(tok)
    check_finite(model, row)
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
        self.last_catch_up = (0, 0.0)  # (tokens, seconds) of the last catch-up (greedy, 1-2 tokens: its chain's)

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
        fresh = self._fresh(context)
        if fresh is None:
            return None
        t0 = self.model.decode_seconds
        rows = self.model.decode(fresh)
        self.last_catch_up = (len(fresh), self.model.decode_seconds - t0)
        return rows

    def _fresh(self, context: Sequence[int]) -> Sequence[int] | None:
        """Roll the cache back to what it shares with `context`; the tokens left to decode (None: one it cannot
        read, a padded target token)."""
        ctx = context[self.offset :] if self.offset else context  # a copy of the whole context only when needed
        keep = min(self.model.common_prefix(ctx), len(ctx) - 1)
        if self.window is not None and len(ctx) - keep > self.window:
            self.offset = len(context) - self.window
            ctx = context[self.offset :]
            keep = min(self.model.common_prefix(ctx), len(ctx) - 1)
        fresh = ctx[keep:]
        if any(t >= self.model.n_vocab for t in fresh):
            return None  # a padded target token the draft cannot read
        self.model.rollback(keep)
        return fresh

    def propose(self, req: DraftRequest) -> Proposal:
        if req.sampler.greedy and self.p_min <= 0.0:
            return self._propose_greedy(req)
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

    def _propose_greedy(self, req: DraftRequest) -> Proposal:
        """Greedy, no p_min: each draft token is the draft's argmax, and the catch-up and the K tokens are one
        `argmax_chain` (engine/greedy.py: one call into llama.cpp, each token the graph's argmax on a GPU, the
        loop's own of the logits on a CPU). A catch-up of more than two tokens (after a pause) is decoded on its
        own first, so that auto's costs keep a batch's time apart from drafting's (`last_catch_up`)."""
        fresh = self._fresh(req.context)
        if fresh is None:
            return Proposal(k=req.k, source=MODEL)
        t0, whole = self.model.decode_seconds, len(fresh) <= 2
        drafted = self.model.argmax_chain(fresh, req.k, req.stop_ids) if whole else self.model.decode_argmax(fresh)
        self.last_catch_up = (len(fresh), self.model.decode_seconds - t0)  # one call: the whole chain's time
        if not whole and drafted is not None and req.k > 1 and drafted[0] not in req.stop_ids:
            rest = self.model.argmax_chain(drafted, req.k - 1, req.stop_ids)
            drafted = None if rest is None else drafted + rest
        if drafted is None:
            raise non_finite(self.model)
        return Proposal(drafted, [], req.k, MODEL)  # greedy verification reads the tokens only: no q to build

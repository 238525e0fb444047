"""The heads drafter: Medusa heads (engine/heads.py) guess the next tokens from the target's own hidden state.

Each verification batch returns, beside its logits, the hidden state of every row (the loop turns llama.cpp's
embeddings output on after the prompt's prefill when a drafter `wants_hidden`). The row whose logits gave the
step's last token holds the state the heads read: head 1 guesses the token after it, head 2 the one after that,
and so on, a chain of up to K tokens from one state. The state comes with the step's `Outcome`; a drafter that
has none for the current context (the first step, or a context it did not see verified) proposes nothing, and
the step is a plain decode.

The guesses are point masses, as the n-gram lookup's are: the target accepts a guess x with probability p(x) and
on a rejection resamples from p with x removed, the ordinary rejection rule with q = 1 at x, so sampled output
keeps the target's distribution; greedy output is the target's argmax whatever is proposed. A guess costs a
few small matrix products (no model decode): the drafter is `free`, and its time is the step's own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from specdec_cli.engine.drafters.base import DraftRequest, Outcome, Proposal
from specdec_cli.engine.heads import Heads, one_blas_thread
from specdec_cli.engine.sampling import Dist
from specdec_cli.engine.settings import HEADS


class HeadsDrafter:
    name: str = HEADS
    free = True
    wants_hidden = True  # the loop passes each step's hidden state in its Outcome

    def __init__(self, heads: Heads) -> None:
        one_blas_thread()  # its guesses run between llama.cpp's decodes: numpy's threads must not spin on the cores
        self.heads = heads
        self._hidden: np.ndarray | None = None  # the state whose logits gave the context's last token
        self._at = -1  # the length of the context it belongs to
        self.head_seconds = 0.0  # the last guess's time per head (the auto drafter prices the heads with it)
        self.proposal_seconds = 0.0  # ... and in all (the cost gate skips guesses that do not pay: policies.py)

    def decode_seconds(self) -> float:
        return 0.0  # no model decode: a guess is counted with the step's other work

    def begin(self, prompt: Sequence[int]) -> None:
        self._hidden, self._at = None, -1

    def ready(self, context_len: int) -> bool:
        """Whether a hidden state for this context is held (the last step's)."""
        return self._hidden is not None and self._at == context_len

    def propose(self, req: DraftRequest) -> Proposal:
        if not self.ready(len(req.context)) or req.k <= 0:
            return Proposal(k=req.k)
        assert self._hidden is not None
        t0 = time.perf_counter()
        drafted = self.heads.guess(self._hidden, req.k)
        self.proposal_seconds = time.perf_counter() - t0
        self.head_seconds = self.proposal_seconds / max(1, len(drafted))
        for j, tok in enumerate(drafted):
            if tok in req.stop_ids:
                del drafted[j + 1 :]
                break
        return Proposal(drafted, [Dist.point(t) for t in drafted], req.k, HEADS)

    def accept(self, outcome: Outcome) -> None:
        self.observe(outcome.hidden, len(outcome.context))

    def observe(self, hidden: np.ndarray | None, context_len: int) -> None:
        """The hidden state that gave the last token of a context of `context_len` tokens (None: none)."""
        self._hidden, self._at = hidden, (context_len if hidden is not None else -1)

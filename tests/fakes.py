"""A numpy-backed `LanguageModel` for testing the loop's properties without GGUF files.

The logits at a position are a fixed function of the last `window` tokens of the
context up to that position (seeded per context), so they do not depend on how
tokens were batched: a batch of k tokens gives exactly the rows k single decodes
would. A draft fake shares the target's function plus `noise` times another one,
so it agrees with the target often but not always. The cache is checked as the
real one is: decodes append at the next position, never past `n_ctx`, and a
rollback never keeps more than the cache holds. Decode time is simulated (a cost
per call plus one per token), so policies that read costs are deterministic.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from specdec_cli.errors import ContextError


class FakeModel:
    def __init__(
        self,
        n_vocab: int = 24,
        n_ctx: int = 512,
        *,
        seed: int = 0,
        window: int = 2,
        scale: float = 3.0,
        noise: float = 0.0,
        noise_seed: int = 1,
        eog: Sequence[int] = (),
        name: str = "fake.gguf",
        call_cost: float = 1.0,
        token_cost: float = 0.1,
    ) -> None:
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.seed, self.window, self.scale = seed, window, scale
        self.noise, self.noise_seed = noise, noise_seed
        self._eog = frozenset(eog)
        self._name = name
        self.call_cost, self.token_cost = call_cost, token_cost
        self.tokens: list[int] = []
        self.decode_seconds = 0.0
        self.decoded_tokens = 0
        self.batches: list[int] = []  # size of every decode call, in order
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    # ------------------------------------------------------------ the model
    def _gauss(self, seed: int, key: tuple[int, ...]) -> np.ndarray:
        h = zlib.crc32(np.asarray((seed, *key), dtype=np.int64).tobytes())
        return np.random.default_rng(h).standard_normal(self.n_vocab)

    def logits_after(self, context: Sequence[int]) -> np.ndarray:
        """The logits for the token after `context` (a pure function of its last `window` tokens)."""
        key = tuple(context[-self.window :])
        row = self._rows.get(key)
        if row is None:
            row = self.scale * self._gauss(self.seed, key)
            if self.noise:
                row = row + self.noise * self.scale * self._gauss(self.noise_seed, key)
            row = row.astype(np.float32)
            self._rows[key] = row
        return row

    # ------------------------------------------------------ the protocol
    @property
    def name(self) -> str:
        return self._name

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog

    def token_text(self, token: int) -> bytes:
        return b" t%d" % token

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        n = len(tokens)
        assert 0 < n_logits <= n, (n, n_logits)
        assert all(0 <= t < self.n_vocab for t in tokens), tokens
        if len(self.tokens) + n > self.n_ctx:
            raise ContextError(f"the context is full: {len(self.tokens)} + {n} tokens > {self.n_ctx}")
        self.tokens.extend(int(t) for t in tokens)
        self.batches.append(n)
        self.decoded_tokens += n
        self.decode_seconds += self.call_cost + self.token_cost * n
        end = len(self.tokens)
        return np.stack([self.logits_after(self.tokens[:i]) for i in range(end - n_logits + 1, end + 1)])

    def rollback(self, n_keep: int) -> None:
        assert n_keep >= 0
        del self.tokens[n_keep:]

    def common_prefix(self, tokens: Sequence[int]) -> int:
        n = 0
        for a, b in zip(self.tokens, tokens, strict=False):
            if a != b:
                break
            n += 1
        return n

    def prefill(self, tokens: Sequence[int]) -> None:
        keep = self.common_prefix(tokens)
        self.rollback(keep)
        if keep < len(tokens):
            self.decode(tokens[keep:])


def greedy_reference(model: FakeModel, prompt: Sequence[int], max_tokens: int) -> tuple[list[int], str]:
    """What the target alone generates greedily: one token per decode, same stop rules as the loop."""
    context = list(prompt)
    out: list[int] = []
    while len(context) - 1 < model.n_ctx:  # the pending token still fits in the cache
        tok = int(np.argmax(model.logits_after(context)))
        if tok in model.eog_ids:
            return out, "eos"
        out.append(tok)
        context.append(tok)
        if len(out) >= max_tokens:
            return out, "length"
    return out, "context"

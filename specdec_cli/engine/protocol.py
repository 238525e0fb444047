"""What the draft-then-verify loop needs of a model, as a protocol.

`engine.model.Model` (llama.cpp) satisfies it; so does the numpy-backed fake in
tests/fakes.py, which lets the loop's properties (greedy identity, stops,
limits, rollback positions, cache contents) be tested in seconds without GGUF
files. The cache is a single sequence: `tokens` lists what it holds, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class LanguageModel(Protocol):
    n_vocab: int
    n_ctx: int

    @property
    def tokens(self) -> list[int]:
        """What the cache holds, in order."""
        ...

    @property
    def decode_seconds(self) -> float:
        """Time spent inside decode, for stats."""
        ...

    @property
    def decoded_tokens(self) -> int:
        """Tokens evaluated so far (shows cache reuse)."""
        ...

    @property
    def name(self) -> str:
        """The model file's name, for messages."""
        ...

    @property
    def eog_ids(self) -> frozenset[int]: ...

    def token_text(self, token: int) -> bytes: ...

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append `tokens` to the cache; return logits for the last `n_logits` of them."""
        ...

    def rollback(self, n_keep: int) -> None:
        """Forget every cached position from `n_keep` on."""
        ...

    def common_prefix(self, tokens: Sequence[int]) -> int: ...

    def prefill(self, tokens: Sequence[int]) -> None:
        """Make the cache hold exactly `tokens`, reusing the common prefix."""
        ...

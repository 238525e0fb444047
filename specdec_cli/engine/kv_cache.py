"""A model's KV cache bookkeeping, as `Model` keeps it: which tokens each sequence holds, rollback to a
position, the common prefix with what comes next (so callers reuse it), moving a sequence's cells."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specdec_cli.errors import InternalError, UnsupportedModelError


class CacheMethods:
    """The cache methods of `engine.model.Model` (a mixin: the context, the memory handle and the decodes are
    the model's)."""

    _C: Any
    _mem: Any
    _ctx: Any
    _native: Any
    _stale: bool
    _defer_rollback: bool
    path: Path
    seq_tokens: list[list[int]]
    pending_moves: set[int]

    if TYPE_CHECKING:  # the model's

        def _context(self, settle: bool = True) -> Any: ...

        def _decode(self, tokens: Sequence[int], n_logits: int, seq: int, view: bool = True) -> np.ndarray: ...

        def decode(self, tokens: Sequence[int], n_logits: int = 1, seq: int = 0) -> np.ndarray: ...

    def _resync(self, seq: int = 0) -> None:
        pos_max = int(self._C.llama_memory_seq_pos_max(self._mem, seq))
        del self.seq_tokens[seq][pos_max + 1 :]

    def rollback(self, n_keep: int, seq: int = 0) -> None:
        """Forget every cached position from `n_keep` on. Sequence 0's cells may go later, in the next call into
        llama.cpp (patch 0006's calls remove them as they decode there, `_context` before any other call): a step
        saves a call of its own, tens of microseconds after a decode. The first rollback goes at once (a model
        that cannot roll back says so there)."""
        tokens = self.seq_tokens[seq]
        if n_keep >= len(tokens):
            return
        if seq == 0 and self._defer_rollback:
            self._context(settle=False)
            del tokens[n_keep:]
            self._stale = True
            return
        self._context()
        ok = self._C.llama_memory_seq_rm(self._mem, seq, n_keep, -1)
        if not ok:
            raise UnsupportedModelError(f"{self.path.name}: this architecture cannot roll its cache back (recurrent or "
                                        "hybrid model); speculative decoding needs that, so run it with --no-draft")  # fmt: skip
        del tokens[n_keep:]
        self._defer_rollback = seq == 0 and self._native is not None and self._native.removes_stale

    def move_seq(self, src: int, dst: int) -> None:
        """Move `src`'s cache to `dst` (dropping `dst`'s), leaving `src` empty. llama.cpp copies the whole KV stream
        cell for cell as the next decode starts, before it places a token: `dst` computes bit for bit as `src`."""
        self._context()
        C = self._C  # noqa: N806
        self.pending_moves.update((src, dst))  # until that decode, neither stream's cells are what they will be
        C.llama_memory_seq_rm(self._mem, dst, -1, -1)
        C.llama_memory_seq_cp(self._mem, src, dst, -1, -1)
        C.llama_memory_seq_rm(self._mem, src, -1, -1)
        self.seq_tokens[dst][:] = self.seq_tokens[src]
        self.seq_tokens[src].clear()

    def save_seq(self, seq: int = 0) -> bytearray:
        """`seq`'s cache as bytes (llama.cpp's sequence state: its cells' keys and values), for `restore_seq`: one
        copy, into a buffer kept as it is. Not while `seq` is in `pending_moves`: a moved stream's cells are
        copied as the next decode starts."""
        self._context()
        C = self._C  # noqa: N806
        size = int(C.llama_state_seq_get_size(self._ctx, seq))
        data = bytearray(size)
        if int(C.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq)) != size:
            raise InternalError(f"{self.path.name}: llama.cpp could not save sequence {seq}'s cache")
        return data

    def restore_seq(self, seq: int, data: bytearray, tokens: Sequence[int]) -> bool:
        """Make `seq`'s cache what `save_seq` saved (`tokens`, the tokens it held); False, and `seq` empty,
        where llama.cpp cannot place it (no room). Its cells land from the stream's first one on, in order, as
        a prefill into an empty sequence puts them: the next decodes compute bit for bit as after that prefill
        (tests/test_batch.py)."""
        self._context()
        C = self._C  # noqa: N806
        C.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self.seq_tokens[seq].clear()
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)  # no copy
        if int(C.llama_state_seq_set_data(self._ctx, buf, len(data), seq)) != len(data):
            C.llama_memory_seq_rm(self._mem, seq, -1, -1)
            return False
        self.seq_tokens[seq].extend(tokens)
        return True

    def common_prefix(self, tokens: Sequence[int], seq: int = 0) -> int:
        """How many leading tokens the cache already holds (called every step: list comparisons, which run in C)."""
        held = self.seq_tokens[seq]
        n = min(len(tokens), len(held))
        head = tokens if n == len(tokens) and isinstance(tokens, list) else list(tokens[:n])  # no copy if whole
        if (held if n == len(held) else held[:n]) == head:
            return n
        return first_difference(held, head, n)


    def sync(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Make the cache hold exactly `tokens` and return the last logits.

        Only the tokens after the common prefix are evaluated. At least one
        token is always (re)decoded so that fresh logits exist.
        """
        keep = min(self.common_prefix(tokens), len(tokens) - n_logits)
        self.rollback(keep)
        return self.decode(tokens[keep:], n_logits)

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        """Make the cache hold exactly `tokens` (no logits needed); reuse the common prefix."""
        keep = self.common_prefix(tokens, seq)
        self.rollback(keep, seq)
        if keep < len(tokens):
            self._decode(tokens[keep:], 1, seq, view=False)  # logits unread: a greedy sampler may stay attached

    def reset(self) -> None:
        self._context()
        self._C.llama_memory_clear(self._mem, True)
        for tokens in self.seq_tokens:
            tokens.clear()


def first_difference(a: Sequence[int], b: Sequence[int], n: int) -> int:
    """The first index below `n` where `a` and `b` differ, knowing one does. A step's caches differ near their
    ends (rejected drafts), so the equal prefix is found from the end in growing strides, each a comparison of
    two slices in C, and only the last stride is scanned in Python (numpy's conversion of two lists of a long
    context cost tens of microseconds a step)."""
    lo, hi, stride = 0, n, 8  # a[:lo] == b[:lo]; they differ below hi
    while hi - lo > stride:
        mid = hi - stride
        if a[lo:mid] == b[lo:mid]:
            lo = mid
            break
        hi, stride = mid, stride * 8
    return next(i for i in range(lo, hi) if a[i] != b[i])

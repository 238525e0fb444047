"""A context's `llama_batch` and output buffer, as numpy: what runs between two `llama_decode` calls.

Every step writes a few tokens into the batch and reads a few rows of logits back. Those are the host's
work around each decode (docs/design.md#host-time), and after a decode has swept the caches they run cold, so
they are kept to a handful of numpy writes and no ctypes object per call: the batch's arrays are numpy views
made once, and a logits view is made once per address and row count of llama.cpp's output buffer (it moves
only when llama.cpp reallocates it), then reused.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

Part = tuple[int, Sequence[int], int, int]  # (seq, tokens, n_logits, tail): `Model.decode_many`'s


def part_seqs(parts: Sequence[Part], n_batch: int) -> list[int]:
    """The sequences of `decode_many`'s parts, once each, after checking that the parts fit one batch."""
    if sum(len(toks) for _, toks, _, _ in parts) > n_batch:
        raise ValueError(f"decode_many takes at most {n_batch} tokens, got {sum(len(p[1]) for p in parts)}")
    if len({p[0] for p in parts}) != len(parts):
        raise ValueError("decode_many takes one part per sequence")
    if any(not (0 <= n_logits and 0 <= tail and n_logits + tail <= len(toks)) for _, toks, n_logits, tail in parts):
        raise ValueError("more logits than tokens requested")
    return [p[0] for p in parts]


class LlamaBatch:
    """`n_batch` rows of one sequence id each, for the context `ctx` of a model with `n_vocab` logits a row;
    `several`: the context holds several sequences (continuous batching), whose rows change their id."""

    def __init__(self, C: Any, ctx: Any, n_batch: int, n_vocab: int, several: bool = False) -> None:  # noqa: N803
        self.handle = C.llama_batch_init(n_batch, 0, 1)
        self._C, self._ctx, self.n_batch, self.n_vocab, self.several = C, ctx, n_batch, n_vocab, several
        b = self.handle
        self.token = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self.wants = np.ctypeslib.as_array(ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n_batch,))
        self.seq = np.zeros(n_batch, dtype=np.int32)  # the seq id each row holds now
        for i in range(n_batch):
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
        # llama_get_logits as an address (an int), not a ctypes pointer object to cast
        self._logits_at = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", C._lib))
        self._views: dict[tuple[int, int], np.ndarray] = {}

    def fill(self, row: int, seq: int, p0: int, tokens: Sequence[int], n_logits: int, tail: int, every: bool) -> None:
        """Write `tokens` of sequence `seq`, from position `p0`, into rows from `row`: logits for the `n_logits`
        before the last `tail` tokens, or for every row (`every`: hidden states on)."""
        n = len(tokens)
        end = row + n
        if n == 1:  # a one-token step: plain stores, no temporary arrays
            self.token[row], self.pos[row] = tokens[0], p0
            self.wants[row] = every or n_logits == 1
        else:
            self.token[row:end] = tokens
            self.pos[row:end] = np.arange(p0, p0 + n, dtype=np.int32)
            self.wants[row:end] = every
            if n_logits and not every:
                self.wants[end - tail - n_logits : end - tail] = 1
        if not self.several:
            return
        seq_id = self.handle.seq_id  # rows that held another sequence change their id
        if n == 1:
            if self.seq[row] != seq:
                seq_id[row][0] = seq
                self.seq[row] = seq
            return
        for i in np.flatnonzero(self.seq[row:end] != seq) + row:
            seq_id[i][0] = seq
        self.seq[row:end] = seq

    def claimed(self, n: int, seq: int | Sequence[int] = 0) -> None:
        """Rows 0..n-1 were written for sequence `seq` (or row i for `seq[i]`) outside `fill` (engine/native_greedy.py's
        calls, in C)."""
        if self.several:
            self.seq[:n] = seq

    def logits(self, first: int, n_logits: int) -> np.ndarray:
        """Rows first..first+n_logits of the last decode's outputs: a zero-copy view, valid until the next decode."""
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        rows = first + n_logits
        key = (self._logits_at(self._ctx), rows)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 1024:  # addresses of buffers llama.cpp has since reallocated
                self._views.clear()
            buf = (ctypes.c_float * (rows * self.n_vocab)).from_address(key[0])
            view = self._views[key] = np.frombuffer(memoryview(buf), dtype=np.float32).reshape(rows, self.n_vocab)
        return view[first:]

    def free(self) -> None:
        self._C.llama_batch_free(self.handle)
        self._views.clear()

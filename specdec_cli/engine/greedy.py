"""A model's greedy tokens, each the cheapest way there is: `GreedyMethods`, a mixin of `engine.model.Model`.

Greedy decoding needs one number per row of logits, its argmax. Where it is computed: in llama.cpp's graph, by a
greedy backend sampler, where the logits are on a GPU (engine/backend_argmax.py); else on the host, over the
logits in host memory. Either way, a step's decode and its argmaxes are one call into llama.cpp (patches/llama.cpp/
0006, 0010, 0011: engine/native_greedy.py), and so are a lone greedy generation's tokens in bursts (`greedy_run`)
and several generations' plain steps (`greedy_runs`). Between two decodes Python costs tens of
microseconds of host time, most of it in cold caches (the decode has just swept the weights through them): the
batch written, the call, the logits row found and reduced, the bookkeeping (docs/design.md#host-time). In C
that is a few stores and a vectorised argmax, the one numpy's path takes: the first maximum, and a row with a NaN
anywhere, or an infinite maximum, gives no token.

Where the library lacks the calls (not specdec's build), numpy's argmax over the logits, one decode at a time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from specdec_cli.engine.backend_argmax import BackendArgmax
from specdec_cli.engine.llama_batch import LlamaBatch
from specdec_cli.engine.native_greedy import NO_TOKEN, NOT_FINITE, ROW_NO_TOKEN, ROW_NOT_FINITE, NativeGreedy
from specdec_cli.engine.protocol import LanguageModel, argmax_rows, chain_by_steps

AHEAD_ENV = "SPECDEC_DECODE_AHEAD"  # 1 / 0: the target alone's loop queues each decode ahead / not (decodes_ahead)
T = TypeVar("T")


class GreedyMethods:
    """The greedy paths of `engine.model.Model` (a mixin: the context, the batch and the decodes are the model's)."""

    _argmax: BackendArgmax | None
    _native: NativeGreedy | None
    _batch: LlamaBatch
    _logits_seen: bool
    _stale: bool
    hidden_on: bool
    n_batch: int
    n_ctx: int
    seq_tokens: list[list[int]]
    pending_moves: set[int]
    decode_seconds: float
    decoded_tokens: int
    _C: Any
    _mem: Any
    _ctx: Any
    _ahead: int = 0  # 1: a decode queued by `start_next`, its token not taken yet; 2: ... by the graph's sampler

    if TYPE_CHECKING:  # the model's

        def _decode(self, tokens: Sequence[int], n_logits: int, seq: int, view: bool = True) -> Any: ...

        def decode(self, tokens: Sequence[int], n_logits: int = 1, seq: int = 0) -> Any: ...

        def _context(self, settle: bool = True) -> Any: ...

        def _check_room(self, seq: int, n: int) -> None: ...

        def _switch_kernels(self) -> None: ...

        def _failed(self, ret: int, seqs: tuple[int, ...]) -> None: ...

        def decode_many(self, parts: Sequence[Any], greedy: Any = ()) -> list[Any]: ...

        def rollback(self, n_keep: int, seq: int = 0) -> None: ...

        def _run_batch(self, n_tokens: int, seqs: tuple[int, ...], sync: bool = True) -> None: ...

    def _in_c(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)`, one of `NativeGreedy`'s calls, as `_run_batch` makes llama_decode's: this model's kernels
        switched on, its seconds inside llama_decode counted, the cache's pending moves applied."""
        g = self._native
        assert g is not None
        self._switch_kernels()
        t0 = g.decode_seconds
        out = call(*args)
        self._stale = False  # seq 0's cells past its tokens: removed in the call (decode_rows settled first)
        self.decode_seconds += g.decode_seconds - t0
        self.pending_moves.clear()
        return out

    def _decode_rows(self, n_tokens: int, seqs: tuple[int, ...], rows: Sequence[int], sampled: Sequence[bool]) -> list[int]:
        """`_run_batch` for `decode_many`'s batch as filled, with the greedy tokens of its output rows `rows` taken
        in the same call (`NativeGreedy.rows`)."""
        assert self._native is not None
        tokens, ret = self._in_c(self._native.rows, self._batch, n_tokens, rows, sampled)
        if self._argmax is not None:
            self._argmax.decoded()
        if ret != 0:
            self._failed(ret, seqs)
        self.decoded_tokens += n_tokens
        return tokens

    def decode_next(self, seq: int, token: int) -> list[int] | None:
        """`decode_many([(seq, [token], 1, 0)], {seq})[0]` without its generality: one sequence's next token in the
        batch, decoded, and its greedy token out of the same call (`NativeGreedy.last`), the graph's where its
        sampler is attached. The batch engine's plain step at one slot, where the host's part of a step shows most
        (`decode_many`'s lists and loops for its one part cost it tens of microseconds after a decode)."""
        g = self._native
        if g is None or self.hidden_on:
            return self.decode_many([(seq, (token,), 1, 0)], (seq,))[0]
        self._context()
        held = self.seq_tokens[seq]
        self._check_room(seq, 1)
        self._batch.fill(0, seq, len(held), (token,), 1, 0, False)
        a = self._argmax
        sampled = a is not None and seq in a.prepare((seq,), (seq,), self._logits_seen)
        got, ret = self._in_c(g.last, self._batch, 1, sampled)
        if a is not None:
            a.decoded()
        if ret != 0:
            self._failed(ret, (seq,))
        self.decoded_tokens += 1
        held.append(token)
        return self._greedy_rows([got])

    def greedy_run(self, seq: int, token: int, k: int, stop: frozenset[int], seconds: float) -> tuple[list[int], bool]:
        """A lone greedy generation's next tokens on sequence `seq`: `token` decoded, then each greedy token in turn,
        one decode each, in one call into llama.cpp (`NativeGreedy.chain`), until `k` tokens, one in `stop`, a full
        context, or the decode that brings the call's time in llama_decode to `seconds`; the last token returned is
        not decoded. The same tokens as `decode_next` one at a time (each decode the same one-token batch, each token
        the same argmax). Returns the tokens and False where the decode after them gave no finite row (its cells
        removed, as `decode_next` would leave them for its caller's error). `decode_next` once where the library
        lacks the call or hidden states are on."""
        g = self._native
        if g is None or not g.runs or self.hidden_on or k <= 1:
            top = self.decode_next(seq, token)
            return (top, True) if top is not None else ([], False)
        self._context()
        held = self.seq_tokens[seq]
        self._check_room(seq, 1)
        a = self._argmax
        sampled = a is not None and seq in a.prepare((seq,), (seq,), self._logits_seen)
        n_held = len(held)
        out, status = self._in_c(g.chain, self._batch, (token,), held, min(k, self.n_ctx - n_held), sampled, stop, seq,
                                 seconds)  # fmt: skip
        self.decoded_tokens += len(held) - n_held
        if a is not None and (out or status in (NO_TOKEN, NOT_FINITE)):
            a.decoded()
        if status not in (0, NOT_FINITE):
            self._failed(status, (seq,))
        self._logits_seen = self._logits_seen or bool(out)
        return out, status == 0

    def greedy_runs(self, seqs: Sequence[int], tokens: Sequence[int], caps: Sequence[int], stop: frozenset[int],
                    seconds: float, interrupt: Any = None) -> tuple[list[list[int]], bool] | None:  # fmt: skip
        """Several greedy generations' plain steps in one call into llama.cpp (`NativeGreedy.many`): each step
        decodes the pending token of each of `seqs` (`tokens` first) in one batch, as `decode_many` would, and
        takes each row's greedy token, until one sequence's token is in `stop` or is its `caps`-th (each cap also
        bounded by the context), the decode that brings the call's time in llama_decode to `seconds`, or a step
        during which `interrupt` (a ctypes.c_int32) was set; the last token of each is not decoded. Returns each
        sequence's tokens (as many each) and False where the step after them failed (a row not finite, no token,
        llama_decode's failure): its cells removed, for the caller to make that step the usual way, which meets
        the failure as it would have. None where the library lacks the call or hidden states are on."""
        g = self._native
        if g is None or not g.runs_many or self.hidden_on:
            return None
        self._context()
        held = [len(self.seq_tokens[seq]) for seq in seqs]
        caps = [min(cap, self.n_ctx - n) for cap, n in zip(caps, held, strict=True)]
        if min(caps) < 1:
            return None
        a = self._argmax
        graph = a.prepare(seqs, seqs, self._logits_seen) if a is not None else frozenset()
        outs, status = self._in_c(g.many, self._batch, seqs, tokens, held, caps, [s in graph for s in seqs], max(caps),
                                  stop, seconds, interrupt)  # fmt: skip
        n = len(outs[0])
        for seq, token, out in zip(seqs, tokens, outs, strict=True):  # decoded and kept: the first and all but the last
            self.seq_tokens[seq].extend([token, *out][:n])
        self.decoded_tokens += n * len(seqs)
        if a is not None:
            a.decoded()
        if status != 0:
            for seq in seqs:  # the failed step's cells, where its decode went in
                self._C.llama_memory_seq_rm(self._mem, seq, len(self.seq_tokens[seq]), -1)
        self._logits_seen = self._logits_seen or n > 0
        return outs, status == 0

    def _greedy_rows(self, got: list[int]) -> list[int] | None:
        """A part's tokens out of `_decode_rows`: None where a row was not finite, as numpy's path gives."""
        if ROW_NO_TOKEN in got:
            raise RuntimeError("llama.cpp sampled no token for one of a batch's outputs (backend sampling)")
        if ROW_NOT_FINITE in got:
            return None
        self._logits_seen = self._logits_seen or bool(got)
        return got

    def _sampled(self) -> bool:
        """Sequence 0's greedy tokens are the graph's: a sampler attached, or attached now, the logits having been
        seen finite (engine/backend_argmax.py)."""
        a = self._argmax
        return a is not None and not self.hidden_on and (a.on or (self._logits_seen and a.attach()))

    def decode_argmax(self, tokens: Sequence[int], n_logits: int = 1) -> list[int] | None:
        """As `decode` (sequence 0), but each of the last `n_logits` rows' argmax: the decode and the argmaxes in
        one call (`NativeGreedy.decode`), the graph's where `_sampled`, else the call's own; numpy's where there
        is no such call or every row is an output (hidden states on). None: a row not finite."""
        n, a, g, held = len(tokens), self._argmax, self._native, self.seq_tokens[0]
        sampled = self._sampled()
        if g is None or self.hidden_on or not 0 < n_logits <= n <= self.n_batch:
            if not sampled:
                top = argmax_rows(self.decode(tokens, n_logits))
                self._logits_seen = self._logits_seen or top is not None
                return top
            self._decode(tokens, n_logits, 0, view=False)
            return a.tokens(n_logits)  # type: ignore[union-attr]
        self._context(settle=False)  # a closed model raises here, before its freed context reaches C
        self._check_room(0, n)
        out, status = self._in_c(g.decode, self._batch, tokens, len(held), n_logits, sampled)
        if status not in (0, NO_TOKEN, NOT_FINITE):
            self._failed(status, (0,))  # nothing went in
        held.extend(tokens)
        self.decoded_tokens += n
        if a is not None:
            a.decoded()
        if status == NO_TOKEN:
            self._failed(status, (0,))
        if status == NOT_FINITE:
            return None
        self._logits_seen = True  # the call's argmax checked them, or the graph's took over from numpy's
        return out

    def argmax_chain(self, tokens: Sequence[int], k: int, stop: frozenset[int]) -> list[int] | None:
        """Greedy drafting: decode `tokens` (sequence 0), take the argmax, decode it, and so on until `k` tokens or
        one in `stop` (the last one is not decoded). None: a row not finite (`decode_argmax`). In one call into
        llama.cpp: no Python between a draft's decodes (`NativeGreedy.chain`, docs/design.md#host-time)."""
        n, a, g, held = len(tokens), self._argmax, self._native, self.seq_tokens[0]
        if g is None or self.hidden_on or not 0 < n <= self.n_batch or k < 1:
            return chain_by_steps(cast(LanguageModel, self), tokens, k, stop)
        self._context(settle=False)
        self._check_room(0, n)
        sampled, n_held = self._sampled(), len(held)
        out, status = self._in_c(g.chain, self._batch, tokens, held, min(k, self.n_ctx - n_held - n + 1), sampled, stop)
        self.decoded_tokens += len(held) - n_held
        if a is not None and (out or status in (NO_TOKEN, NOT_FINITE)):
            a.decoded()  # a decode went in
        if status == NOT_FINITE:
            return None
        if status != 0:
            self._failed(status, (0,))
        self._logits_seen = True
        return out

    # ------------------------------------------------------------ a decode queued ahead (a GPU's)
    def decodes_ahead(self) -> bool:
        """Whether the target alone's greedy loop queues each decode before it hands on the previous token
        (`start_next`, `finish_next`): where the logits are on a GPU (`BackendArgmax`), or SPECDEC_DECODE_AHEAD=1;
        never with SPECDEC_DECODE_AHEAD=0. On a GPU llama_decode returns once the work is queued, and the device
        computes while the host verifies, emits and relays the last token (bursts leave the device idle while the
        host hands a burst's tokens on: gpu-check's `host_time --ahead-too --bursts-too` times the ways side by
        side); on a CPU llama_decode computes before it returns, and a token would reach its reader a decode late,
        so bursts serve there."""
        asked = os.environ.get(AHEAD_ENV, "")
        return (asked == "1" or (asked != "0" and self._argmax is not None)) and not self.hidden_on

    @property
    def decoding_ahead(self) -> bool:
        """A decode is queued (`start_next`) and its token not taken yet."""
        return self._ahead != 0

    def start_next(self, token: int) -> None:
        """Queue the decode of `token` after sequence 0's tokens, one output row: `finish_next` takes its greedy
        token. The cache holds the token from here on; nothing else decodes in between (`cancel_next` where
        nobody will take it)."""
        self._context()  # a rollback left to the next call settled first
        held = self.seq_tokens[0]
        self._check_room(0, 1)
        self._batch.fill(0, 0, len(held), (token,), 1, 0, False)
        sampled = self._sampled()
        self._run_batch(1, (0,), sync=False)  # `finish_next` waits
        held.append(token)
        self._ahead = 2 if sampled else 1

    def finish_next(self) -> list[int] | None:
        """The queued decode's greedy token, once the device is done (its wait counted as decode time): the graph
        sampler's where one was attached, else numpy's argmax of the logits; None where they are not finite."""
        sampled, self._ahead = self._ahead == 2, 0
        t0 = time.perf_counter()
        self._C.llama_synchronize(self._ctx)
        self.decode_seconds += time.perf_counter() - t0
        if sampled:
            assert self._argmax is not None
            return self._argmax.tokens(1)
        top = argmax_rows(self._batch.logits(0, 1))
        self._logits_seen = self._logits_seen or top is not None
        return top

    def cancel_next(self) -> None:
        """Forget a queued decode nobody will take (its generation ended first): waited for, its token rolled back."""
        if self._ahead:
            self._ahead = 0
            self._C.llama_synchronize(self._ctx)
            self.rollback(len(self.seq_tokens[0]) - 1)

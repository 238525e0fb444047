"""A model's greedy tokens, each the cheapest way there is: `GreedyMethods`, a mixin of `engine.model.Model`.

Greedy decoding needs one number per row of logits, its argmax. Where it is computed: in llama.cpp's graph, by a
greedy backend sampler, where the logits are on a GPU (engine/backend_argmax.py); else on the host, over the
logits in host memory. Either way, a step's decode and its argmaxes are one call into llama.cpp (patches/llama.cpp/
0006): `llama_specdec_decode_argmax` decodes a batch and writes its output rows' greedy tokens,
`llama_specdec_decode_rows` does the same for chosen rows of a batch of several sequences (the batched server's),
and `llama_specdec_argmax_chain` runs a greedy draft's catch-up and K tokens, one decode each, until K tokens or
a stop token; `llama_specdec_greedy_run` (patch 0010) does the same on any sequence for up to a given time, the
tokens of a lone greedy generation in bursts (`greedy_run`). Between two decodes Python costs tens of
microseconds of host time, most of it in cold caches (the decode has just swept the weights through them): the
batch written, the call, the logits row found and reduced, the bookkeeping (docs/design.md#host-time). In C
that is a few stores and a vectorised argmax, the one numpy's path takes: the first maximum, and a row with a NaN
anywhere, or an infinite maximum, gives no token.

Where the library lacks the calls (not specdec's build), numpy's argmax over the logits, one decode at a time.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from specdec_cli.engine.backend_argmax import BackendArgmax
from specdec_cli.engine.llama_batch import LlamaBatch
from specdec_cli.engine.protocol import LanguageModel, argmax_rows, chain_by_steps

NO_TOKEN = -100  # a row gave no sampled token (backend sampling)
NOT_FINITE = -101  # a row of logits held a NaN or an infinite maximum
ROW_NOT_FINITE, ROW_NO_TOKEN = -1, -2  # `NativeGreedy.rows`' tokens for such rows
AHEAD_ENV = "SPECDEC_DECODE_AHEAD"  # 1 / 0: the target alone's loop queues each decode ahead / not (decodes_ahead)
T = TypeVar("T")


def _bare(lib: Any, name: str) -> Any:
    """`llama_specdec_<name>` as a function pointer of its own, no argtypes, returning an int32."""
    fn = lib[f"llama_specdec_{name}"] if hasattr(lib, "__getitem__") else getattr(lib, f"llama_specdec_{name}")
    fn.restype = ctypes.c_int32
    return fn


class NativeGreedy:
    """The patches' calls for one context, with their buffers: the tokens in, the stop set, the tokens out."""

    @staticmethod
    def of(C: Any, ctx: Any) -> NativeGreedy | None:  # noqa: N803
        """None where the library lacks the calls: not specdec's build, or one from before they took catch-up
        tokens and their own argmax (other signatures: a call through these would write past its arguments)."""
        lib = C._lib
        names = ("argmax", "decode_argmax", "decode_rows", "argmax_chain")
        if not all(hasattr(lib, f"llama_specdec_{name}") for name in names):
            return None
        return NativeGreedy(C, ctx)

    def __init__(self, C: Any, ctx: Any) -> None:  # noqa: N803
        lib = C._lib
        # Function pointers of their own, without argtypes: ctypes' conversion of each argument cost several
        # microseconds a call in the caches a decode leaves (twelve arguments: about half of the call). The calls
        # below pass exactly the C types: ints (int32), bools, the batch by value, arrays and pointers.
        self._decode_fn, self._rows_fn = _bare(lib, "decode_argmax"), _bare(lib, "decode_rows")
        self._chain_fn = _bare(lib, "argmax_chain")
        # version 2: decode_argmax and the chain remove seq 0's cells from where they decode (a deferred rollback)
        version = _bare(lib, "version") if hasattr(lib, "llama_specdec_version") else None
        self.removes_stale = version is not None and version() >= 2
        # version 3 (patches/llama.cpp/0010): a lone generation's greedy tokens in one call, any sequence, for a time
        self._run_fn = _bare(lib, "greedy_run") if version is not None and version() >= 3 else None
        self._C, self._ctx, self._mem = C, ctx, C.llama_get_memory(ctx)
        self._ctx_p = ctx if isinstance(ctx, ctypes.c_void_p) else ctypes.c_void_p(ctx)
        self._in = (ctypes.c_int32 * 8)()
        self._out = (ctypes.c_int32 * 65)()
        self._status = ctypes.c_int32(0)
        self._stop: tuple[frozenset[int], Any] | None = None
        self._seconds = ctypes.c_double(0.0)  # in llama_decode, over every call: `decode_seconds`
        self._status_p, self._seconds_p = ctypes.pointer(self._status), ctypes.pointer(self._seconds)
        self._sampled = (ctypes.c_bool * 8)()

    @property
    def decode_seconds(self) -> float:
        """Seconds inside llama_decode during these calls, so far: what the calls spend besides (the argmaxes, the
        loop) is host time, as numpy's would be."""
        return self._seconds.value

    def _buffers(self, tokens: Sequence[int], n_out: int) -> None:
        n = len(tokens)
        if len(self._in) < n or len(self._out) < n_out:
            self._in, self._out = (ctypes.c_int32 * max(n, len(self._in)))(), (ctypes.c_int32 * max(n_out, len(self._out)))()
        self._in[:n] = tokens if isinstance(tokens, list) else list(tokens)

    def decode(self, batch: LlamaBatch, tokens: Sequence[int], pos: int, n_out: int, sampled: bool) -> tuple[list[int], int]:
        """Decode `tokens` (sequence 0) from `pos`, and take the greedy tokens of the last `n_out` rows (`sampled`:
        the attached backend sampler's). Returns them and the status: 0, llama_decode's failure (nothing went
        in), NO_TOKEN or NOT_FINITE (the decode went in, no tokens)."""
        self._buffers(tokens, n_out)
        status = self._decode_fn(self._ctx_p, batch.handle, self._in, len(tokens), int(pos), int(n_out), bool(sampled),
                                 self._out, self._seconds_p)  # int(): no argtypes to take a numpy integer
        batch.claimed(len(tokens))
        return (self._out[:n_out] if status == 0 else []), status

    def rows(self, batch: LlamaBatch, n_tokens: int, rows: Sequence[int], sampled: Sequence[bool]) -> tuple[list[int], int]:
        """Decode the batch as filled (`n_tokens` rows, any sequences), and take the greedy tokens of the output
        rows `rows` (negative: from the last output), each the backend sampler's where `sampled`. Returns them
        (ROW_NOT_FINITE, ROW_NO_TOKEN where a row gave none) and llama_decode's return (0: decoded)."""
        self._buffers(rows, len(rows))
        if len(self._sampled) < len(rows):
            self._sampled = (ctypes.c_bool * len(rows))()
        self._sampled[: len(rows)] = list(sampled)
        ret = self._rows_fn(self._ctx_p, batch.handle, int(n_tokens), self._in, self._sampled, len(rows), self._out,
                            self._seconds_p)  # fmt: skip
        return (self._out[: len(rows)] if ret == 0 else []), ret

    def last(self, batch: LlamaBatch, n_tokens: int, sampled: bool) -> tuple[int, int]:
        """`rows(batch, n_tokens, [-1], [sampled])` without lists: the last output row's greedy token, and
        llama_decode's return (the batch engine's plain step at one slot, `GreedyMethods.decode_next`)."""
        self._in[0], self._sampled[0] = -1, sampled
        ret = self._rows_fn(self._ctx_p, batch.handle, n_tokens, self._in, self._sampled, 1, self._out, self._seconds_p)
        return self._out[0], ret

    def chain(self, batch: LlamaBatch, first: Sequence[int], held: list[int], k: int, sampled: bool,
              stop: frozenset[int], seq: int = 0, seconds: float = 0.0) -> tuple[list[int], int]:  # fmt: skip
        """Decode `first` on sequence `seq` after the `held` tokens the cache holds, then each token taken after it,
        until `k` tokens or a stop token, or (`seconds` > 0) after the decode that brings this call's seconds in
        llama_decode to `seconds`. Returns the tokens written and the status (`decode`'s), and extends `held` with
        what was decoded and kept: `first` and every token written but the last. A decode whose token did not come
        out (NO_TOKEN, NOT_FINITE) is not kept: its cells are removed, as numpy's path would not have decoded on.
        Another sequence than 0, or a time, takes patch 0010's `llama_specdec_greedy_run` (`runs`)."""
        self._buffers(first, k)
        if self._stop is None or self._stop[0] is not stop:  # a generation's stop set: one array for its steps
            ids: Sequence[int] = sorted(stop)
            self._stop = (stop, (ctypes.c_int32 * max(1, len(ids)))(*ids))
        if seq == 0 and seconds <= 0:
            n = self._chain_fn(self._ctx_p, batch.handle, self._in, len(first), len(held), int(k), bool(sampled),
                               self._stop[1], len(stop), self._out, self._status_p, self._seconds_p)  # fmt: skip
        else:
            assert self._run_fn is not None
            n = self._run_fn(self._ctx_p, batch.handle, int(seq), self._in, len(first), len(held), int(k),
                             bool(sampled), self._stop[1], len(stop), ctypes.c_double(seconds), self._out,
                             self._status_p, self._seconds_p)  # fmt: skip
        batch.claimed(len(first), seq)
        out = self._out[:n]
        held.extend([*first, *out][: len(first) + n - 1] if n else ())
        status = self._status.value
        if status in (NO_TOKEN, NOT_FINITE):
            self._C.llama_memory_seq_rm(self._mem, seq, len(held), -1)
        return out, status

    @property
    def runs(self) -> bool:
        """The library has `llama_specdec_greedy_run`: `chain` on any sequence, in a time."""
        return self._run_fn is not None


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

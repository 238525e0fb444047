"""The patches' greedy calls into llama.cpp for one context (`NativeGreedy`), used by engine/greedy.py's
`GreedyMethods`: `llama_specdec_decode_argmax` decodes a batch and writes its output rows' greedy tokens,
`llama_specdec_decode_rows` does the same for chosen rows of a batch of several sequences (the batched server's),
`llama_specdec_argmax_chain` runs a greedy draft's catch-up and K tokens, one decode each, until K tokens or a
stop token (patch 0006); `llama_specdec_greedy_run` does the same on any sequence for up to a given time (patch
0010), and `llama_specdec_greedy_runs` for several sequences at once, a token of each a decode (patch 0011).
`llama_specdec_spec_run` (patch 0012, `NativeSpec`) makes greedy speculative steps with two contexts, a draft's and a
target's (engine/draft_runs.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import partial
from typing import Any

from specdec_cli.engine.llama_batch import LlamaBatch

NO_TOKEN = -100  # a row gave no sampled token (backend sampling)
NOT_FINITE = -101  # a row of logits held a NaN or an infinite maximum
ROW_NOT_FINITE, ROW_NO_TOKEN = -1, -2  # `NativeGreedy.rows`' tokens for such rows


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
        # version 4 (patches/llama.cpp/0011): several greedy generations' plain steps in one call
        self._runs_fn = _bare(lib, "greedy_runs") if version is not None and version() >= 4 else None
        # version 5 (patches/llama.cpp/0012): a draft model's and a target's greedy speculative steps in one call
        self.spec_fn = _bare(lib, "spec_run") if version is not None and version() >= 5 else None
        self._many: tuple[Any, ...] = ()  # `many`'s arrays (seq ids, first tokens, positions, caps, sampled, out)
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
        stop_ids = self._stop_ids(stop)
        if seq == 0 and seconds <= 0:
            n = self._chain_fn(self._ctx_p, batch.handle, self._in, len(first), len(held), int(k), bool(sampled),
                               stop_ids, len(stop), self._out, self._status_p, self._seconds_p)  # fmt: skip
        else:
            assert self._run_fn is not None
            n = self._run_fn(self._ctx_p, batch.handle, int(seq), self._in, len(first), len(held), int(k),
                             bool(sampled), stop_ids, len(stop), ctypes.c_double(seconds), self._out,
                             self._status_p, self._seconds_p)  # fmt: skip
        batch.claimed(len(first), seq)
        out = self._out[:n]
        held.extend([*first, *out][: len(first) + n - 1] if n else ())
        status = self._status.value
        if status in (NO_TOKEN, NOT_FINITE):
            self._C.llama_memory_seq_rm(self._mem, seq, len(held), -1)
        return out, status

    def _stop_ids(self, stop: frozenset[int]) -> Any:
        """The stop set as a C array, made once for a generation's (or a server's) set."""
        if self._stop is None or self._stop[0] is not stop:
            ids: Sequence[int] = sorted(stop)
            self._stop = (stop, (ctypes.c_int32 * max(1, len(ids)))(*ids))
        return self._stop[1]

    def many(self, batch: LlamaBatch, seqs: Sequence[int], first: Sequence[int], pos: Sequence[int],
             caps: Sequence[int], sampled: Sequence[bool], k: int, stop: frozenset[int], seconds: float,
             interrupt: Any = None) -> tuple[list[list[int]], int]:  # fmt: skip
        """Plain greedy steps of several sequences at once (patch 0011's `llama_specdec_greedy_runs`): each step
        decodes one token of each of `seqs` (`first`'s at `pos`, then each one's last token taken) and takes its
        greedy token, until `k` steps, a step in which one sequence's token is in `stop` or its cap's, the step
        that brings the call's llama_decode seconds to `seconds` (> 0), or a step during which `interrupt` (a
        ctypes.c_int32, or None) was set. Returns each sequence's tokens (as many each: the steps written) and
        the status of the step that ended the call (`decode`'s; its tokens went into the cache, not written)."""
        n = len(seqs)
        if len(self._many) == 0 or len(self._many[0]) < n or len(self._many[5]) < n * k:
            m = max(n, len(self._many[0]) if self._many else 0)
            self._many = (*((ctypes.c_int32 * m)() for _ in range(4)), (ctypes.c_bool * m)(),
                          (ctypes.c_int32 * max(n * k, 256))())  # fmt: skip
        seq_a, first_a, pos_a, caps_a, sampled_a, out = self._many
        seq_a[:n], first_a[:n], pos_a[:n], caps_a[:n], sampled_a[:n] = seqs, first, pos, caps, sampled
        assert self._runs_fn is not None
        steps = self._runs_fn(self._ctx_p, batch.handle, n, seq_a, first_a, pos_a, caps_a, sampled_a, int(k),
                              self._stop_ids(stop), len(stop), ctypes.c_double(seconds),
                              None if interrupt is None else ctypes.byref(interrupt), out, self._status_p,
                              self._seconds_p)  # fmt: skip
        batch.claimed(n, seqs)
        return [out[j * k : j * k + steps] for j in range(n)], self._status.value

    @property
    def runs_many(self) -> bool:
        """The library has `llama_specdec_greedy_runs`: `many`."""
        return self._runs_fn is not None

    @property
    def runs(self) -> bool:
        """The library has `llama_specdec_greedy_run`: `chain` on any sequence, in a time."""
        return self._run_fn is not None


class SpecIO(ctypes.Structure):
    """`struct llama_specdec_spec_io` (patches/llama.cpp/0012): a run's state, in and out, and its limits."""

    _fields_ = [(name, ctypes.c_int32) for name in (
        "t_held", "pending", "d_held", "n_fresh", "before", "k", "status", "k_max", "k_lo", "k_hi", "adaptive",
        "max_tokens", "max_steps", "t_ctx", "d_ctx", "t_sampled", "d_sampled", "t_kernels", "d_kernels")]  # fmt: skip


class SpecArgs(ctypes.Structure):
    """`struct llama_specdec_spec_args`: the call's arguments, addresses the caller keeps alive."""

    _fields_ = [("tctx", ctypes.c_void_p), ("tbatch", ctypes.c_void_p), ("dctx", ctypes.c_void_p),
                ("dbatch", ctypes.c_void_p), ("io", ctypes.c_void_p), ("stop", ctypes.c_void_p),
                ("n_stop", ctypes.c_int32), ("max_seconds", ctypes.c_double), ("kernels", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("steps", ctypes.c_void_p), ("seconds", ctypes.c_void_p),
                ("t_target", ctypes.c_void_p), ("t_draft", ctypes.c_void_p)]  # fmt: skip


class NativeSpec:
    """Patch 0012's `llama_specdec_spec_run` for a target's and a draft's contexts, with its buffers: greedy
    speculative steps, one after another in one call (engine/draft_runs.py). `limits` are SpecIO's fields that
    stay the same for a generation (k_max, k_lo, k_hi, adaptive, max_steps, t_ctx, d_ctx, t_kernels, d_kernels);
    `switch` is patch 0008's kernel switch, or None."""

    def __init__(self, target: NativeGreedy, t_batch: LlamaBatch, draft: NativeGreedy, d_batch: LlamaBatch,
                 stop: frozenset[int], seconds: float, switch: Any, **limits: int) -> None:  # fmt: skip
        assert target.spec_fn is not None
        self.io = io = SpecIO(**limits)
        self._out = (ctypes.c_int32 * (io.max_steps * (io.k_max + 1)))()
        self._steps = (ctypes.c_int32 * (3 * io.max_steps))()
        self._secs = (ctypes.c_double * (3 * io.max_steps))()
        p, self._stop = ctypes.addressof, draft._stop_ids(stop)  # kept here: the draft's may change to another set
        self._args = SpecArgs(target._ctx_p.value, p(t_batch.handle), draft._ctx_p.value, p(d_batch.handle), p(io),
                              p(self._stop), len(stop), seconds, None if switch is None else p(switch),
                              p(self._out), p(self._steps), p(self._secs), p(target._seconds), p(draft._seconds))  # fmt: skip
        self._call = partial(target.spec_fn, ctypes.byref(self._args))  # one argument to convert, not fourteen

    def run(self) -> tuple[list[int], list[int], list[float]]:
        """The call, on the state set in `io`: each step's (k, drafted, accepted), the tokens written (each step's
        drafts, then the target's token) and each step's (draft seconds, target seconds, wall seconds). `io` then
        holds the state after the last step (and `status` a failed decode's)."""
        n = self._call()
        if n == 0:
            return [], [], []
        steps = self._steps[: 3 * n]
        return steps, self._out[: sum(steps[1::3]) + n], self._secs[: 3 * n]

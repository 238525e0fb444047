"""Greedy tokens in one call into llama.cpp (engine/greedy.py, patch 0006): the call's argmax is numpy's (the first
maximum; a NaN or an infinite maximum no token), a decode's tokens are numpy's argmaxes of its logits, a draft's
chain is the same chain taken one decode at a time from Python, and a row that is not finite leaves the cache as
numpy's path would."""

from __future__ import annotations

import ctypes
import itertools
import math
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from specdec_cli.engine import greedy
from specdec_cli.engine.drafters import Proposal
from specdec_cli.engine.events import Step
from specdec_cli.engine.model import Model
from specdec_cli.engine.native import bindings
from specdec_cli.engine.protocol import argmax_rows, chain_by_steps
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator, generate
from specdec_cli.errors import ContextError, UsageError
from tests.conftest import THREADS

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where"


def test_the_loops_argmax_is_numpys_first_maximum_or_none() -> None:
    """Random rows of every length around the vector widths, with ties, NaNs, infinities and rows of -inf."""
    f = bindings()._lib.llama_specdec_argmax  # specdec's build (patch 0006)
    f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_int32
    rng = np.random.default_rng(7)
    for trial in range(3000):
        n = 49152 if trial % 10 == 0 else int(rng.integers(1, 100))
        x = rng.standard_normal(n).astype(np.float32)
        if trial % 3 == 0:
            x[rng.integers(0, n, size=2)] = x.max()  # a tie: the first one wins
        if trial % 7 == 0:
            x[rng.integers(0, n)] = np.nan
        if trial % 11 == 0:
            x[rng.integers(0, n)] = np.inf
        if trial % 13 == 0:
            x[rng.integers(0, n)] = -np.inf
        if trial % 29 == 0:
            x[:] = -np.inf
        top = int(np.argmax(x))  # numpy's: the first maximum, or the first NaN
        want = top if math.isfinite(x[top]) else -1
        assert f(x.ctypes.data, n) == want, (trial, n)
    assert f(np.zeros(1, np.float32).ctypes.data, 0) == -1


def test_a_library_without_the_calls_or_with_their_first_form_has_none() -> None:
    """Not specdec's build, or one from before the chain took catch-up tokens and its own argmax (another
    signature: a call through this one's would write past its arguments)."""
    from types import SimpleNamespace

    for lib in (SimpleNamespace(), SimpleNamespace(llama_specdec_argmax_chain=object())):
        assert greedy.NativeGreedy.of(SimpleNamespace(_lib=lib), ctx=None) is None


@pytest.mark.parametrize("n_logits", [1, 3])
def test_a_decodes_tokens_are_numpys_argmaxes_of_its_logits(smol_path: Path, n_logits: int) -> None:
    with Model(smol_path, n_ctx=512, n_threads=THREADS) as a, Model(smol_path, n_ctx=512, n_threads=THREADS) as b:
        assert a._native is not None and a._argmax is None  # a CPU: the call's own argmax
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)
        for part in (ids[:7], ids[7:12], ids[12:13]):
            k = min(n_logits, len(part))
            d0, t0 = a.decode_seconds, time.perf_counter()
            top = a.decode_argmax(part, k)
            assert 0 < a.decode_seconds - d0 < time.perf_counter() - t0  # llama_decode's share of the call, timed in C
            assert top == np.argmax(b.decode(part, k), axis=-1).tolist()
        assert a.tokens == b.tokens == ids[:13]
        a.close()
        with pytest.raises(UsageError, match="closed"):  # not its freed context handed to C
            a.decode_argmax(ids[13:14])


@pytest.mark.parametrize("first_len", [1, 2, 5])
def test_the_chain_is_the_same_chain_taken_decode_by_decode(smol_path: Path, first_len: int) -> None:
    """Catch-up tokens first, then K tokens, stopping at a stop token; the tokens, the cache's contents and the
    next decode's logits are those of Python's loop (numpy's argmax, one decode at a time)."""
    with Model(smol_path, n_ctx=512, n_threads=THREADS) as a, Model(smol_path, n_ctx=512, n_threads=THREADS) as b:
        assert a._native is not None
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)
        a.decode(ids[:-first_len])
        b.decode(ids[:-first_len])
        got = a.argmax_chain(ids[-first_len:], 6, frozenset())
        want = chain_by_steps(b, ids[-first_len:], 6, frozenset())
        assert got == want and got is not None and len(got) == 6
        assert a.tokens == b.tokens == ids + got[:-1]  # the last token taken is not decoded
        assert int(a._C.llama_memory_seq_pos_max(a._mem, 0)) == len(a.tokens) - 1
        stop = frozenset({got[2]})
        a.rollback(len(ids) - first_len)
        assert a.argmax_chain(ids[-first_len:], 6, stop) == got[:3]  # the stop token ends it, undecoded
        assert a.tokens == ids + got[:2]
        b.rollback(len(a.tokens))
        assert np.array_equal(a.decode([got[2]]), b.decode([got[2]]))


def test_each_greedy_part_of_a_batch_gets_numpys_argmaxes(smol_path: Path) -> None:
    """Several sequences in one batch (the server's), greedy parts among others whose logits are read, fillers
    behind one: each greedy part's tokens are numpy's argmaxes of its rows, the others' logits the same."""
    with (Model(smol_path, n_ctx=256, n_threads=THREADS, n_seq=3) as a,
          Model(smol_path, n_ctx=256, n_threads=THREADS, n_seq=3) as b):  # fmt: skip
        b._native = None  # numpy's path
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)
        for parts in ([(0, ids[:5], 2, 0), (1, ids[5:9], 1, 1), (2, ids[9:12], 3, 0)],
                      [(0, ids[5:6], 1, 0), (1, ids[9:10], 1, 0), (2, ids[12:14], 0, 0)]):  # fmt: skip
            got, want = a.decode_many(parts, greedy={0, 2}), b.decode_many(parts, greedy={0, 2})
            assert got[0] == want[0] and got[2] == want[2] and got[0] and len(got[0]) == parts[0][2]
            assert np.array_equal(got[1], want[1])  # type: ignore[arg-type]
        assert a.seq_tokens == b.seq_tokens


def test_one_sequences_next_token_is_numpys_argmax_and_goes_where_decode_many_puts_it(smol_path: Path) -> None:
    """`decode_next` (the batch engine's plain step at one slot) on sequence 1 of three, after sequence 0 wrote the
    batch's first row in C: numpy's argmax of the token's logits, the token held by that sequence alone, the
    others' caches untouched (each decodes on as the numpy path's)."""
    with (Model(smol_path, n_ctx=256, n_threads=THREADS, n_seq=3) as a,
          Model(smol_path, n_ctx=256, n_threads=THREADS, n_seq=3) as b):  # fmt: skip
        b._native = None
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)
        for m in (a, b):
            m.decode_many([(0, ids[:4], 1, 0), (1, ids[:6], 1, 0)], greedy={0, 1})
            m.decode_argmax(ids[4:5])  # sequence 0's row written in C (`claimed`)
        tok = ids[6]
        for _ in range(4):
            got, want = a.decode_next(1, tok), b.decode_many([(1, [tok], 1, 0)], greedy={1})[0]
            assert got == want and got is not None and len(got) == 1
            tok = got[0]
        assert a.seq_tokens == b.seq_tokens and a.seq_tokens[2] == []
        assert a.decode_many([(0, ids[5:6], 1, 0)], greedy={0}) == b.decode_many([(0, ids[5:6], 1, 0)], greedy={0})


def test_the_next_token_past_the_context_is_a_context_error(smol_path: Path) -> None:
    with Model(smol_path, n_ctx=256, n_threads=THREADS, n_seq=2) as m:
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        m.decode_many([(1, (ids * 20)[: m.n_ctx], 1, 0)])
        with pytest.raises(ContextError):
            m.decode_next(1, ids[0])
        assert len(m.seq_tokens[1]) == m.n_ctx


def test_the_chain_stops_where_the_context_does(smol_path: Path) -> None:
    with Model(smol_path, n_ctx=256, n_threads=THREADS) as m:
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        m.decode(ids * (240 // len(ids)))
        room = m.n_ctx - len(m.tokens)
        out = m.argmax_chain([ids[0]], room + 5, frozenset())
        assert out is not None and len(out) == room and len(m.tokens) == m.n_ctx


def test_a_row_that_is_not_finite_is_no_token_and_is_not_kept(corrupt_draft_path: Path) -> None:
    """The corrupt draft's logits hold NaNs (test_hostile): None, as `decode_argmax` gives, and the cache holds
    what the model says it holds (the decode whose row was not finite forgotten)."""
    with Model(corrupt_draft_path, n_ctx=256, n_threads=THREADS) as m:
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        m.decode(ids[:-1])
        assert m.argmax_chain(ids[-1:], 4, frozenset()) is None
        assert m.tokens == ids[:-1]
        assert int(m._C.llama_memory_seq_pos_max(m._mem, 0)) == len(ids) - 2
        assert m.decode_argmax(ids[-1:]) is None  # as numpy's path: the decode went in, no token
        assert m.tokens == ids and int(m._C.llama_memory_seq_pos_max(m._mem, 0)) == len(ids) - 1
    with Model(corrupt_draft_path, n_ctx=256, n_threads=THREADS, n_seq=2) as m:  # a batch's greedy part
        assert m.decode_many([(0, ids, 1, 0), (1, ids[:3], 1, 0)], greedy={0, 1}) == [None, None]
        assert m.decode_next(1, ids[3]) is None and m.seq_tokens[1] == ids[:4]  # decode_many's None, the token held


def test_rows_the_loop_wrote_keep_their_sequence_ids_right(smol_path: Path) -> None:
    """On a context of several sequences the loop writes rows for sequence 0 in C: the batch's record of which
    sequence each row holds follows, so the next batch for another sequence rewrites its ids."""
    with Model(smol_path, n_ctx=256, n_threads=THREADS, n_seq=2) as m:
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        m.decode_many([(1, ids[:3], 1, 0)])
        assert m._batch.handle.seq_id[0][0] == 1
        m.argmax_chain(ids[:3], 2, frozenset())
        assert m._batch.handle.seq_id[0][0] == 0 and list(m._batch.seq[:3]) == [0, 0, 0]
        m.decode_many([(1, ids[3:5], 1, 0)])
        assert [m._batch.handle.seq_id[i][0] for i in range(2)] == [1, 1]


def test_a_rollback_left_to_the_next_call_removes_the_same_cells(smol_path: Path) -> None:
    """After a model's first rollback (made at once: a model that cannot roll back says so there), sequence 0's
    rollbacks wait for the next call into llama.cpp: patch 0006's calls remove the cells where they decode, any
    other call first. Either way the tokens, the cells and the logits are those of rollbacks made at once."""
    with Model(smol_path, n_ctx=256, n_threads=THREADS) as a, Model(smol_path, n_ctx=256, n_threads=THREADS) as b:
        b._native = None  # numpy's path: every rollback at once
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)

        def last(m: Model) -> int:
            return int(m._C.llama_memory_seq_pos_max(m._mem, 0))

        for m in (a, b):
            m.decode(ids[:10])
            m.rollback(8)
        assert a._native is not None and a._native.removes_stale
        assert a._defer_rollback and not a._stale and not b._defer_rollback and last(a) == 7
        a.decode(ids[8:12])
        b.decode(ids[8:12])
        a.rollback(9)
        b.rollback(9)
        assert a._stale and a.tokens == b.tokens == ids[:9] and last(a) == 11 and last(b) == 8  # cells still there
        assert a.decode_argmax(ids[9:11], 2) == np.argmax(b.decode(ids[9:11], 2), axis=-1).tolist()
        assert not a._stale and last(a) == last(b) == 10
        a.rollback(9)
        b.rollback(9)
        assert a.argmax_chain(ids[9:10], 3, frozenset()) == chain_by_steps(b, ids[9:10], 3, frozenset())
        assert a.tokens == b.tokens and last(a) == last(b) == len(a.tokens) - 1

        def decode_many(m: Model) -> None:
            m.decode_many([(0, ids[5:6], 1, 0)])

        for other in (lambda m: m.decode(ids[5:7]), lambda m: m.save_seq(0), decode_many):
            for m in (a, b):
                m.prefill(ids[:8])
                m.rollback(5)
            assert a._stale
            other(a)
            other(b)
            assert not a._stale and a.tokens == b.tokens and last(a) == last(b) == len(a.tokens) - 1
        assert np.array_equal(a.decode(ids[12:13]), b.decode(ids[12:13]))


def test_a_library_whose_calls_do_not_remove_cells_gets_its_rollbacks_at_once() -> None:
    """Before version 2 of the calls (no `llama_specdec_version`), a decode there does not remove a deferred
    rollback's cells: such a library's rollbacks are made at once."""
    from types import SimpleNamespace

    class Fn:  # a C function as ctypes shows it
        def __call__(self) -> int:
            return 2

    lib = SimpleNamespace(**{f"llama_specdec_{name}": Fn() for name in ("argmax", "decode_argmax", "decode_rows",
                                                                         "argmax_chain")})  # fmt: skip
    C = SimpleNamespace(_lib=lib, llama_batch=object, llama_get_memory=lambda ctx: None)  # noqa: N806
    native = greedy.NativeGreedy.of(C, ctx=None)
    assert native is not None and not native.removes_stale
    lib.llama_specdec_version = Fn()
    native = greedy.NativeGreedy.of(C, ctx=None)
    assert native is not None and native.removes_stale


def test_numpy_integers_reach_the_calls(smol_path: Path) -> None:
    """The calls have no argtypes (ctypes' conversions cost a call several microseconds): a count computed with
    numpy (a drafter's K, a number of rows) still gets through, as a Python int would."""
    with Model(smol_path, n_ctx=256, n_threads=THREADS) as m, Model(smol_path, n_ctx=256, n_threads=THREADS) as b:
        b._native = None
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        m.decode(ids[:5])
        b.decode(ids[:5])
        assert m.decode_argmax(ids[5:8], np.int64(2)) == argmax_rows(b.decode(ids[5:8], 2))
        assert m.argmax_chain(ids[8:9], np.int64(3), frozenset()) == chain_by_steps(b, ids[8:9], 3, frozenset())


def _ahead_run(m: Model, prompt: list[int], options: GenerateOptions, *, eog: frozenset[int] | None = None,
               stop_after: int | None = None, read: int | None = None, burst: float = 0.0) -> tuple[Any, ...]:  # fmt: skip
    """A target-alone greedy run: its tokens, steps and stop, and what the model's cache holds after it."""
    gen: SpeculativeGenerator
    gen = SpeculativeGenerator(m, None, prompt, options, burst_seconds=burst,
                               should_stop=None if stop_after is None else lambda: len(gen.result.token_ids) >= stop_after)
    if eog is not None:
        gen.eog = eog
    events = gen.events()
    steps = [e for e in itertools.islice(events, read) if isinstance(e, Step)]  # the reader may stop reading
    events.close()
    m._context()  # a rollback left to the next call (Model.rollback) made now
    pos_max = int(m._C.llama_memory_seq_pos_max(m._mem, 0))
    return (gen.result.token_ids, gen.result.stop_reason, [(s.index, s.emitted, s.stop) for s in steps],
            list(m.seq_tokens[0]), pos_max, m.decoding_ahead, m.decoded_tokens)


@pytest.mark.parametrize("case", ["length", "eos", "context", "stopped", "reader gone"])
def test_a_decode_queued_ahead_gives_the_same_run(smol_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """The target alone's loop with each decode queued before the last token goes out (`_ahead`, a GPU's way,
    forced on here) against the plain loop: the same tokens, steps and stop, and the same cache after it, where it
    ends on its length, on an end token, on a full context, on a stop asked for mid-way, or its reader stops
    reading (the decode queued for nobody rolled back)."""
    runs = []
    for ahead in ("0", "1"):
        monkeypatch.setenv(greedy.AHEAD_ENV, ahead)
        with Model(smol_path, n_ctx=64 if case == "context" else 256, n_threads=THREADS) as m:
            assert m.decodes_ahead() == (ahead == "1")
            prompt = m.tokenize(TEXT, add_special=True, parse_special=False)
            ref = generate(m, None, prompt, GenerateOptions(max_tokens=24)).token_ids
            kw: dict[str, Any] = {"eos": {"eog": frozenset({ref[9]})}, "stopped": {"stop_after": 7},
                                  "reader gone": {"read": 6}}.get(case, {})  # fmt: skip
            runs.append(_ahead_run(m, prompt, GenerateOptions(max_tokens=200 if case == "context" else 24), **kw))
    assert runs[0][:-1] == runs[1][:-1]
    tokens, stop, steps, held, pos_max, queued, decoded = runs[1]
    # no decode where the plain loop makes none, but the one queued while the reader had the last step
    assert decoded - runs[0][-1] == (case in ("stopped", "reader gone"))
    assert stop == {"length": "length", "eos": "eos", "context": "context", "stopped": "interrupted",
                    "reader gone": ""}[case] and steps and not queued  # fmt: skip
    assert pos_max == len(held) - 1  # llama.cpp's cache holds what the model says, nothing queued past it




def test_a_burst_is_the_tokens_decode_next_gives_one_at_a_time(smol_path: Path) -> None:
    """`greedy_run` (patch 0010: a lone generation's tokens in one call) on sequence 1 of three: the tokens
    `decode_next` gives one at a time, the last not decoded, the same cells after it (the next decode on both
    agrees); it ends at a stop token (not decoded), at a full context, or once its decodes took `seconds`."""
    with (Model(smol_path, n_ctx=128, n_threads=THREADS, n_seq=3) as a,
          Model(smol_path, n_ctx=128, n_threads=THREADS, n_seq=3) as b):  # fmt: skip
        assert a._native is not None and a._native.runs
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)
        for m in (a, b):
            m.decode_many([(0, ids[:4], 1, 0), (1, ids[:6], 1, 0)], greedy={0, 1})
        got, ok = a.greedy_run(1, ids[6], 12, frozenset(), 60.0)
        want, tok = [], ids[6]
        for _ in range(12):
            top = b.decode_next(1, tok)
            assert top is not None
            want.append(tok := top[0])
        assert ok and got == want and a.seq_tokens == b.seq_tokens and a.seq_tokens[1] == [*ids[:7], *want[:-1]]
        assert a.decode_next(1, want[-1]) == b.decode_next(1, want[-1])
        a.greedy_run(1, ids[0], 2, frozenset(), 60.0)  # the batch's first row left to sequence 1 ...
        a.rollback(len(b.seq_tokens[1]), 1)
        # ... is sequence 0's again where it decodes next (`LlamaBatch.claimed`)
        assert a.decode_many([(0, ids[4:5], 1, 0)], greedy={0}) == b.decode_many([(0, ids[4:5], 1, 0)], greedy={0})
        a.rollback(7, 1)  # want[0] pending again
        end = next(j for j in range(1, 12) if want[j] == want[8])
        again, ok = a.greedy_run(1, want[0], 12, frozenset({want[8]}), 60.0)
        assert ok and again == want[1 : end + 1] and a.seq_tokens[1] == [*ids[:7], *want[:end]]  # the stop not decoded
        held = len(a.seq_tokens[1])
        one, ok = a.greedy_run(1, again[-1], 12, frozenset(), 1e-9)
        assert ok and len(one) == 1 and len(a.seq_tokens[1]) == held + 1  # its one decode took the time
        room = a.n_ctx - len(a.seq_tokens[1])
        rest, ok = a.greedy_run(1, one[0], room + 5, frozenset(), 60.0)
        assert ok and len(rest) == room and len(a.seq_tokens[1]) == a.n_ctx
        assert int(a._C.llama_memory_seq_pos_max(a._mem, 1)) == a.n_ctx - 1


def test_several_sequences_burst_as_decode_many_steps(smol_path: Path) -> None:
    """`greedy_runs` (patch 0011: several generations' plain steps in one call) on sequences 2 and 0 of three:
    each step's tokens those of `decode_many` with the same two rows, the last of each not decoded, the same cells
    after it (the next decode on both agrees); it ends after the step in which either gives a stop token (not
    decoded) or reaches its cap, after its time, or after a step during which the interrupt was set."""
    with (Model(smol_path, n_ctx=128, n_threads=THREADS, n_seq=3) as a,
          Model(smol_path, n_ctx=128, n_threads=THREADS, n_seq=3) as b):  # fmt: skip
        assert a._native is not None and a._native.runs_many
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)
        for m in (a, b):
            m.decode_many([(0, ids[:4], 1, 0), (2, ids[:6], 1, 0)], greedy={0, 2})
        seqs, first = [2, 0], [ids[6], ids[4]]
        got = a.greedy_runs(seqs, first, [10, 12], frozenset(), 60.0)
        want: list[list[int]] = [[], []]
        pending = first
        for _ in range(10):
            rows = b.decode_many([(s, [t], 1, 0) for s, t in zip(seqs, pending, strict=True)], greedy=set(seqs))
            pending = [r[0] for r in rows if r is not None]
            for w, t in zip(want, pending, strict=True):
                w.append(t)
        assert got == (want, True) and a.seq_tokens == b.seq_tokens  # ended at sequence 2's cap
        assert a.seq_tokens[2] == [*ids[:7], *want[0][:-1]] and a.seq_tokens[0] == [*ids[:5], *want[1][:-1]]
        step = [(s, [w[-1]], 1, 0) for s, w in zip(seqs, want, strict=True)]
        assert a.decode_many(step, greedy={0, 2}) == b.decode_many(step, greedy={0, 2})
        for m in (a, b):  # `first` pending again
            m.rollback(6, 2)
            m.rollback(4, 0)
        stop = frozenset({want[1][6]})  # a token of sequence 0's: either sequence's ends the call
        end = min(j for j in range(10) if want[0][j] in stop or want[1][j] in stop)
        again = a.greedy_runs(seqs, first, [50, 50], stop, 60.0)
        assert again == ([w[: end + 1] for w in want], True) and len(a.seq_tokens[0]) == 5 + end
        held = [len(a.seq_tokens[s]) for s in seqs]
        last = [w[-1] for w in again[0]]
        one = a.greedy_runs(seqs, last, [50, 50], frozenset(), 1e-9)  # its one step took the time
        assert one is not None and one[1] and [len(w) for w in one[0]] == [1, 1]
        knock = ctypes.c_int32(1)  # set before the call: one step, as if set during it
        two = a.greedy_runs(seqs, [w[0] for w in one[0]], [50, 50], frozenset(), 60.0, knock)
        assert two is not None and two[1] and [len(w) for w in two[0]] == [1, 1]
        assert [len(a.seq_tokens[s]) for s in seqs] == [n + 2 for n in held]
        room = a.n_ctx - len(a.seq_tokens[2])
        rest = a.greedy_runs(seqs, [w[0] for w in two[0]], [500, 500], frozenset(), 60.0)
        assert rest is not None and rest[1] and len(rest[0][0]) == room and len(a.seq_tokens[2]) == a.n_ctx


def test_a_burst_whose_row_is_not_finite_keeps_what_came_before(corrupt_draft_path: Path) -> None:
    """The corrupt draft's logits hold NaNs: no tokens and False, the cache as the model says (the decode whose
    row was not finite forgotten), as `decode_next`'s None leaves it for its caller's error; `greedy_runs` alike
    for each of its sequences."""
    with Model(corrupt_draft_path, n_ctx=256, n_threads=THREADS, n_seq=2) as m:
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        m.decode_many([(1, ids[:5], 0, 0)])
        assert m.greedy_run(1, ids[5], 8, frozenset(), 60.0) == ([], False)
        assert m.seq_tokens[1] == ids[:5] and int(m._C.llama_memory_seq_pos_max(m._mem, 1)) == 4
        m.decode_many([(0, ids[:3], 0, 0)])
        assert m.greedy_runs([1, 0], [ids[5], ids[3]], [8, 8], frozenset(), 60.0) == ([[], []], False)
        assert m.seq_tokens[1] == ids[:5] and int(m._C.llama_memory_seq_pos_max(m._mem, 1)) == 4
        assert m.seq_tokens[0] == ids[:3] and int(m._C.llama_memory_seq_pos_max(m._mem, 0)) == 2


@pytest.mark.parametrize("case", ["length", "eos", "context", "stopped", "reader gone"])
def test_bursts_give_the_same_run(smol_path: Path, case: str) -> None:
    """The target alone's loop in bursts (`_bursts`: each call into llama.cpp decodes on for up to `burst_seconds`)
    against the plain loop: the same tokens, steps and stop, and the same cache after it (what a burst decoded past
    a stop rolled back), where it ends on its length, an end token, a full context, a stop asked for mid-burst,
    or its reader stops reading mid-burst; the steps' decode seconds add up to the model's."""
    runs = []
    for burst in (0.0, 60.0):
        with Model(smol_path, n_ctx=64 if case == "context" else 256, n_threads=THREADS) as m:
            prompt = m.tokenize(TEXT, add_special=True, parse_special=False)
            ref = generate(m, None, prompt, GenerateOptions(max_tokens=24)).token_ids
            kw: dict[str, Any] = {"eos": {"eog": frozenset({ref[9]})}, "stopped": {"stop_after": 7},
                                  "reader gone": {"read": 6}}.get(case, {})  # fmt: skip
            m.rollback(0)
            d0 = m.decode_seconds
            runs.append(_ahead_run(m, prompt, GenerateOptions(max_tokens=200 if case == "context" else 24), burst=burst,
                                   **kw))  # fmt: skip
            runs[-1] += (m.decode_seconds - d0,)
    assert runs[0][:-3] == runs[1][:-3]
    tokens, stop, steps, held, pos_max, queued, decoded, seconds = runs[1]
    assert stop == {"length": "length", "eos": "eos", "context": "context", "stopped": "interrupted",
                    "reader gone": ""}[case] and len(steps) > 3  # fmt: skip
    assert pos_max == len(held) - 1  # llama.cpp's cache holds what the model says, nothing decoded past it
    if case not in ("stopped", "reader gone"):
        assert decoded == runs[0][-2]  # no decode the plain loop does not make
    if case == "length":  # the steps' shares of their bursts' decode seconds add up to the model's
        with Model(smol_path, n_ctx=256, n_threads=THREADS) as m:
            gen = SpeculativeGenerator(m, None, prompt, GenerateOptions(max_tokens=24), burst_seconds=60.0)
            d0 = m.decode_seconds
            for _ in gen.events():
                pass
            total = gen.result.prefill.t_target + sum(s.t_target for s in gen.result.steps)
            assert math.isclose(total, m.decode_seconds - d0, rel_tol=1e-9) and len(gen.result.steps) == 24



class _Silent:
    """A drafter that never proposes anything (auto, or the n-gram lookup, where nothing pays): counts its calls."""

    def __init__(self) -> None:
        self.asked = self.told = 0

    def begin(self, prompt: Any) -> None:
        pass

    def propose(self, req: Any) -> Proposal:
        self.asked += 1
        return Proposal(k=req.k, note="nothing")

    def accept(self, outcome: Any) -> None:
        self.told += 1

    def decode_seconds(self) -> float:
        return 0.0


@pytest.mark.parametrize("case", ["length", "eos", "stopped", "reader gone"])
def test_a_quiet_drafter_gets_short_bursts_and_the_same_run(smol_path: Path, case: str) -> None:
    """A drafting loop whose drafter has proposed nothing for more than QUIET_STEPS steps in a row decodes short
    bursts (`_burst`: at most PLANNED_BURST tokens a call) against a token a step: the same tokens, steps and
    stop, and the same cache after it; the drafter is told every step's outcome but asked only once a burst."""
    from specdec_cli.engine.plain_loops import PLANNED_BURST, QUIET_STEPS

    runs, silent = [], []
    for burst in (0.0, 60.0):
        with Model(smol_path, n_ctx=256, n_threads=THREADS) as m:
            prompt = m.tokenize(TEXT, add_special=True, parse_special=False)
            ref = generate(m, None, prompt, GenerateOptions(max_tokens=40)).token_ids
            m.rollback(0)
            d, box = _Silent(), []  # box: the generator, for its stop
            gen = SpeculativeGenerator(m, cast(Any, d), prompt, GenerateOptions(max_tokens=40), burst_seconds=burst,
                                       should_stop=(lambda box=box: len(box[0].result.token_ids) >= 23)
                                       if case == "stopped" else None)  # fmt: skip
            box.append(gen)
            if case == "eos":
                gen.eog = frozenset({ref[20]})
            events = gen.events()
            steps = [e for e in itertools.islice(events, 19 if case == "reader gone" else None) if isinstance(e, Step)]
            events.close()
            m._context()
            runs.append((gen.result.token_ids, gen.result.stop_reason, [(s.index, s.emitted, s.stop) for s in steps],
                         list(m.seq_tokens[0]), int(m._C.llama_memory_seq_pos_max(m._mem, 0))))
            silent.append((d.asked, d.told, len(gen.result.steps)))
    assert runs[0] == runs[1] and runs[1][4] == len(runs[1][3]) - 1  # the cache holds nothing decoded past it
    assert runs[1][1] == {"length": "length", "eos": "eos", "stopped": "interrupted", "reader gone": ""}[case]
    (asked0, told0, n0), (asked, told, n) = silent
    assert told0 == n0 and asked0 >= n0 - 1  # a token a step: asked (but for a last token) and told every step
    assert told == n and QUIET_STEPS < asked <= QUIET_STEPS + 1 - (QUIET_STEPS - n) // PLANNED_BURST < n  # once a burst


def test_decodes_go_ahead_by_default_where_the_logits_are_on_a_gpu(smol_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unasked, the target alone queues each decode ahead where its greedy tokens are llama.cpp's graph's (a GPU:
    `BackendArgmax`, turned on here for the CPU) and decodes in bursts elsewhere; SPECDEC_DECODE_AHEAD=0 or 1
    decides instead. Both ways give the same tokens."""
    from specdec_cli.engine import backend_argmax

    monkeypatch.delenv(greedy.AHEAD_ENV, raising=False)
    got = []
    for on_gpu in (False, True):
        monkeypatch.setattr(backend_argmax, "IN_GRAPH", on_gpu)
        with Model(smol_path, n_ctx=256, n_threads=THREADS) as m:
            assert m.decodes_ahead() == on_gpu
            for asked in ("0", "1"):
                monkeypatch.setenv(greedy.AHEAD_ENV, asked)
                assert m.decodes_ahead() == (asked == "1")
            monkeypatch.delenv(greedy.AHEAD_ENV)
            prompt = m.tokenize(TEXT, add_special=True, parse_special=False)
            gen = SpeculativeGenerator(m, None, prompt, GenerateOptions(max_tokens=24), burst_seconds=60.0)
            for _ in gen.events():
                pass
            got.append(gen.result.token_ids)
            assert m.decoded_tokens > 0 and not m.decoding_ahead
    assert got[0] == got[1] and len(got[0]) == 24

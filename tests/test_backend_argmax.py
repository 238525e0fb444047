"""Greedy tokens computed in llama.cpp's graph (engine/backend_argmax.py): the same tokens as numpy's argmax
of the logits, a batch's rows as one token at a time, greedy and sampled runs taking turns on one context, and
several sequences of a batch, each with its own sampler. specdec computes them there where the logits are on a
GPU; these tests turn it on for the CPU (`IN_GRAPH`), where the machinery is the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from specdec_cli import api
from specdec_cli.engine import backend_argmax
from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import generate
from tests.conftest import THREADS

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where"


@pytest.fixture(autouse=True)
def argmax_in_graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(backend_argmax, "IN_GRAPH", True)
    yield


def test_on_a_cpu_greedy_tokens_are_numpys_unless_the_logits_are_on_a_gpu(smol_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the logits are in host memory numpy's argmax is the cheaper one (backend_argmax.py says why)."""
    monkeypatch.setattr(backend_argmax, "IN_GRAPH", None)
    with Model(smol_path, n_ctx=256, n_threads=THREADS) as m:
        assert m._argmax is None
        C, n_layer = m._C, int(m._C.llama_model_n_layer(m._model))  # noqa: N806
        assert not backend_argmax.in_graph(C, m._model, 0) and not backend_argmax.in_graph(C, m._model, n_layer)
        assert backend_argmax.in_graph(C, m._model, n_layer + 1)  # every layer and the output layer: a GPU's
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        top = m.decode_argmax(ids, 2)
        m.rollback(0)
        assert top == np.argmax(m.decode(ids, 2), axis=-1).tolist()


def test_in_graph_argmax_is_numpys_argmax_of_the_logits(smol_path: Path) -> None:
    with Model(smol_path, n_ctx=512, n_threads=THREADS) as a, Model(smol_path, n_ctx=512, n_threads=THREADS) as b:
        ids = a.tokenize(TEXT, add_special=True, parse_special=False)
        first = a.decode_argmax(ids[:4])  # the numpy path: it sees the logits finite
        assert a._argmax is not None and not a._argmax.on
        batch = a.decode_argmax(ids[4:], len(ids) - 4)  # in the graph from here on
        assert a._argmax.on
        singles = [a.decode_argmax([t])[0] for t in ids[:6]]  # type: ignore[index]
        want = np.argmax(b.decode(ids, len(ids)), axis=-1).tolist()
        assert first == want[3:4] and batch == want[4:]
        assert singles == np.argmax(np.stack([b.decode([t])[0].copy() for t in ids[:6]]), axis=-1).tolist()
        assert a.tokens == b.tokens


def test_greedy_and_sampled_runs_take_turns_on_one_context(smol_path: Path) -> None:
    """Attaching, detaching and attaching again (a chain is set up once per context: a new one each time)."""
    with Model(smol_path, n_ctx=512, n_threads=THREADS) as m:
        prompt = m.tokenize(TEXT, add_special=True, parse_special=False)
        greedy = GenerateOptions(adaptive=False, max_tokens=12)
        sampled = GenerateOptions(adaptive=False, max_tokens=12, temperature=0.8, seed=1)
        runs = [generate(m, None, prompt, cfg).token_ids for cfg in (greedy, sampled, greedy, sampled, greedy)]
        assert m._argmax is not None and m._argmax.on  # the last run was greedy
        assert runs[0] == runs[2] == runs[4] and runs[1] == runs[3]
    with Model(smol_path, n_ctx=512, n_threads=THREADS) as plain:  # the numpy path only: logits read every step
        plain._argmax = None
        assert generate(plain, None, prompt, greedy).token_ids == runs[0]


def test_a_tie_goes_to_the_first_maximum_wherever_the_argmax_runs(smol_path: Path, tmp_path: Path) -> None:
    """Two tokens whose logits are equal and the largest: numpy's argmax takes the first, and so must the graph's
    (patch 0007: stock llama.cpp's CPU argmax took the last), or the first step of a run (read with numpy) and
    the rest (in the graph) would break the tie two ways. The model's output rows are its token embeddings
    (tied): a copy whose last row repeats the greedy token's row gives the tie."""
    import shutil

    from gguf import GGUFReader

    with Model(smol_path, n_ctx=256, n_threads=THREADS) as m:
        ids = m.tokenize(TEXT, add_special=True, parse_special=False)
        first = int(np.argmax(m.decode(ids)[-1]))
        last = m.n_vocab - 1
    assert first < last and last not in ids
    tied = tmp_path / "tied.gguf"
    shutil.copy(smol_path, tied)
    rows = next(t for t in GGUFReader(str(tied), "r+").tensors if t.name == "token_embd.weight").data
    rows[last] = rows[first]
    rows.flush()
    del rows
    with Model(tied, n_ctx=256, n_threads=THREADS) as m:
        logits = m.decode(ids)[-1]
        assert logits[last] == logits[first] == logits.max()
        m.rollback(0)
        assert m.decode_argmax(ids) == [first]  # numpy's (the first decode_argmax of a context)
        m.rollback(0)
        assert m.decode_argmax(ids) == [first] and m._argmax is not None and m._argmax.on  # the graph's
        m.rollback(len(ids) - 1)
        assert m.argmax_chain(ids[-1:], 1, frozenset()) == [first]  # patch 0006's loop, the graph's argmax


def test_a_context_that_refuses_the_sampler_is_asked_once() -> None:
    """Where llama.cpp cannot offload the sampler (it says so in its log each time), the context stays on numpy's
    path: later decodes do not ask again."""
    from types import SimpleNamespace

    from specdec_cli.engine.backend_argmax import BackendArgmax

    asked: list[object] = []
    C = SimpleNamespace(  # noqa: N806 - the bindings' calls BackendArgmax makes
        _lib=SimpleNamespace(), llama_get_sampled_token_ith=None, llama_sampler_chain_default_params=lambda: None,
        llama_sampler_chain_init=lambda _p: object(), llama_sampler_init_greedy=lambda: None,
        llama_sampler_chain_add=lambda _c, _s: None, llama_sampler_free=lambda _c: None,
        llama_set_sampler=lambda _ctx, _seq, chain: asked.append(chain) or False)  # fmt: skip
    a = BackendArgmax(C, ctx=None)
    assert not a.attach() and not a.attach() and not a.on
    assert len(asked) == 1 and a.refused


def test_prepare_attaches_greedy_sequences_and_leaves_those_without_outputs_alone() -> None:
    """A sampler per greedy sequence with output rows; a sequence whose logits are read loses its own; one
    with no output row in the batch (a prompt's chunk, fillers) keeps what it has, so a slot does not pay a
    graph reservation each way for a chunk of its prompt."""
    from types import SimpleNamespace

    calls: list[tuple[int, bool]] = []
    C = SimpleNamespace(  # noqa: N806 - the bindings' calls BackendArgmax makes
        _lib=SimpleNamespace(), llama_get_sampled_token_ith=None, llama_sampler_chain_default_params=lambda: None,
        llama_sampler_chain_init=lambda _p: object(), llama_sampler_init_greedy=lambda: None,
        llama_sampler_chain_add=lambda _c, _s: None, llama_sampler_free=lambda _c: None,
        llama_set_sampler=lambda _ctx, seq, chain: calls.append((seq, chain is not None)) or True)  # fmt: skip
    a = backend_argmax.BackendArgmax(C, ctx=None)
    assert a.prepare([0, 1], greedy={0, 1, 2}, allowed=False) == frozenset() and not calls  # not seen finite yet
    assert a.prepare([0, 1], greedy={0, 1, 2}, allowed=True) == {0, 1} and sorted(calls) == [(0, True), (1, True)]
    calls.clear()
    assert a.prepare([0], greedy={0}, allowed=True) == {0} and not calls  # 1 has no output row: kept
    assert a.prepare([0, 1], greedy={0}, allowed=True) == {0} and calls == [(1, False)]  # 1's logits are read
    assert set(a.chains) == {0}
    a.decoded()
    assert not a._retired


@pytest.mark.slow
def test_concurrent_greedy_sequences_take_their_tokens_from_the_graph_exactly(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The batch engine with a sampler per greedy slot, and a seeded sampled request beside them whose rows are
    read as logits (llama.cpp then copies every row's): each generation as its solo run on numpy's path."""
    prompts = ["The capital of France is", "Write a haiku about the sea.", "List three prime numbers:"]
    monkeypatch.setattr(backend_argmax, "IN_GRAPH", False)
    with api.load(n_ctx=512, n_threads=THREADS, drafter="none") as solo:
        ref = [solo.generate(p, max_tokens=24) for p in prompts]
        ref_sampled = solo.generate(TEXT, max_tokens=24, temperature=0.8, seed=7)
    monkeypatch.setattr(backend_argmax, "IN_GRAPH", True)
    with api.load(n_ctx=512, n_threads=THREADS, drafter="none", parallel=4) as par:
        par.generate(prompts[0], max_tokens=4)  # the first read of the logits: numpy's, seen finite
        out: dict[int, api.Generation] = {}

        def one(i: int) -> None:
            out[i] = (par.generate(prompts[i], max_tokens=24) if i < 3
                      else par.generate(TEXT, max_tokens=24, temperature=0.8, seed=7))  # fmt: skip

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        target = par.target
        assert isinstance(target, Model) and target._argmax is not None
        assert len(target._argmax.chains) >= 2  # several sequences' samplers took part
    assert [out[i].token_ids for i in range(3)] == [r.token_ids for r in ref]
    assert out[3].token_ids == ref_sampled.token_ids

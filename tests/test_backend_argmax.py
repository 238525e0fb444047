"""Greedy tokens computed in llama.cpp's graph (engine/backend_argmax.py): the same tokens as numpy's argmax
of the logits, a batch's rows as one token at a time, and greedy and sampled runs taking turns on one context."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import generate
from tests.conftest import THREADS

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where"


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
    assert a.chain_fn is None  # not specdec's build: no patch 0006 loop
    assert not a.attach() and not a.attach() and not a.on
    assert len(asked) == 1 and a.refused

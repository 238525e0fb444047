"""A draft model's greedy steps in runs (engine/draft_runs.py, patch 0012: several speculative steps in one call into
llama.cpp) against the loop's steps one at a time: the same tokens, steps, stops and caches."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdec_cli.engine import draft_runs
from specdec_cli.engine.drafters import ModelDrafter
from specdec_cli.engine.drafters.policies import compose
from specdec_cli.engine.events import Step
from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.errors import ContextError
from tests.conftest import THREADS

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where"


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The steps of each run that made any (`StepRunner.run`)."""
    made: list[int] = []
    original = draft_runs.StepRunner.run

    def counted(self: draft_runs.StepRunner, *args: Any) -> Any:
        got = original(self, *args)
        if got:
            made.append(len(got))
        return got

    monkeypatch.setattr(draft_runs.StepRunner, "run", counted)
    yield made


def _generation(t: Model, d: Model, burst: float, options: GenerateOptions, *, eog: frozenset[int] | None = None,
                stop_after: int | None = None, read: int | None = None) -> tuple[Any, ...]:  # fmt: skip
    """A greedy generation with a draft model: its tokens, stop, steps, and what both caches hold after it."""
    t.reset(), d.reset()
    prompt = t.tokenize(TEXT, add_special=True, parse_special=False)
    t0, d0 = t.decode_seconds, d.decode_seconds
    box: list[SpeculativeGenerator] = []
    gen = SpeculativeGenerator(t, compose(ModelDrafter(d), options), prompt, options, burst_seconds=burst,
                               should_stop=None if stop_after is None
                               else lambda: len(box[0].result.token_ids) >= stop_after)  # fmt: skip
    box.append(gen)
    if eog is not None:
        gen.eog = eog
    events = gen.events()
    steps = [e for e in itertools.islice(events, read) if isinstance(e, Step)]  # the reader may stop reading
    events.close()
    res = gen.result
    if res.stop_reason in ("length", "eos", "context"):  # each step's decode seconds add up to the models'
        assert math.isclose(res.prefill.t_target + sum(s.t_target for s in res.steps), t.decode_seconds - t0)
        assert math.isclose(res.prefill.t_draft + sum(s.t_draft for s in res.steps), d.decode_seconds - d0)
    for m in (t, d):  # llama.cpp's caches hold what the models say, nothing decoded past it
        m._context()  # a rollback left to the next call made now
        assert int(m._C.llama_memory_seq_pos_max(m._mem, 0)) == len(m.seq_tokens[0]) - 1
    # the draft's cache: the loop's keeps the drafts of its last step that the target rejected, a run's does not:
    # what the next step would find of it is its common prefix with the target's
    useful = d.common_prefix(t.seq_tokens[0])
    return (res.token_ids, res.stop_reason,
            [(s.index, s.k, s.drafted, s.n_accepted, s.emitted, s.stop, s.drafter) for s in steps],
            list(t.seq_tokens[0]), d.seq_tokens[0][:useful])  # fmt: skip


@pytest.mark.parametrize(("case", "adaptive"), [(case, False) for case in ("length", "eos", "context", "draft context",
                                                                           "stopped", "reader gone")]
                         + [("length", True), ("stopped", True)])  # fmt: skip
def test_runs_make_the_loops_steps(smol_path: Path, smol_q2k_path: Path, runs: list[int], case: str,
                                   adaptive: bool) -> None:  # fmt: skip
    """Runs (each call decodes on for up to `burst_seconds`) against the loop a step at a time, with K fixed and
    adaptive: the same tokens, steps and stop, and the same caches after it (what a run decoded past the step the
    reader had rolled back), where the generation ends on its length, an end token, a full context, a stop asked
    for mid-run or its reader stopping mid-run; and where the draft's context is the shorter, the loop's own step
    there meets its error as the loop did."""
    n_ctx = 64 if case == "context" else 256
    with Model(smol_path, n_ctx=n_ctx, n_threads=THREADS) as t, \
            Model(smol_q2k_path, n_ctx=48 if case == "draft context" else n_ctx, n_threads=THREADS) as d:  # fmt: skip
        options = GenerateOptions(max_tokens=200 if "context" in case else 48, draft_max=4, adaptive=adaptive)
        ref = _generation(t, d, 0.0, GenerateOptions(max_tokens=48, draft_max=4), read=None) if case == "eos" else None
        kw: dict[str, Any] = {"eos": {"eog": frozenset({ref[0][30]})} if ref else {}, "stopped": {"stop_after": 20},
                              "reader gone": {"read": 6}}.get(case, {})  # fmt: skip
        got = []
        for burst in (0.0, 60.0):
            try:
                got.append(_generation(t, d, burst, options, **kw))
            except ContextError as exc:
                got.append(("error", str(exc)))
            assert bool(runs) == (burst > 0), f"runs with burst {burst}: {runs}"
    assert got[0] == got[1]
    if case == "draft context":
        assert got[1][0] == "error" and "context is full" in got[1][1]
        return
    tokens, stop, steps, _, _ = got[1]
    assert stop == {"length": "length", "eos": "eos", "context": "context", "stopped": "interrupted",
                    "reader gone": ""}[case] and len(steps) > 3  # fmt: skip
    assert max(runs) > 1  # a run made several steps


def test_a_stop_token_drafted_inside_a_run_ends_it_where_the_loop_ends(smol_path: Path, smol_q2k_path: Path,
                                                                     runs: list[int]) -> None:  # fmt: skip
    """An end token the draft proposes and the target accepts, deep in a run: the generation ends at it, the
    token not emitted, as the loop ends."""
    with Model(smol_path, n_ctx=256, n_threads=THREADS) as t, Model(smol_q2k_path, n_ctx=256, n_threads=THREADS) as d:
        options = GenerateOptions(max_tokens=48, draft_max=4, adaptive=False)
        ref = _generation(t, d, 0.0, options)
        accepted = [tok for s in ref[2] if s[3] > 1 for tok in s[2][1 : s[3]]]  # drafts accepted, not a step's first
        eog = frozenset({accepted[len(accepted) // 2]})
        got = [_generation(t, d, burst, options, eog=eog) for burst in (0.0, 60.0)]
    assert got[0] == got[1] and got[1][1] == "eos" and runs


def test_a_library_without_the_call_makes_no_runs(smol: Model, smol_q2k: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """specdec's build before patch 0012, or another drafter than a draft model's greedy one: the loop alone."""
    options = GenerateOptions(draft_max=4)
    assert draft_runs.runner(smol, compose(ModelDrafter(smol_q2k), options), options, frozenset(), 1.0) is not None
    assert draft_runs.runner(smol, compose(ModelDrafter(smol_q2k, p_min=0.5), options), options, frozenset(), 1.0) is None
    assert smol_q2k._native is not None
    monkeypatch.setattr(smol_q2k._native, "spec_fn", None)
    assert draft_runs.runner(smol, compose(ModelDrafter(smol_q2k), options), options, frozenset(), 1.0) is None

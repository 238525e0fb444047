"""Continuous batching (engine/batch/): several generations in one target batch per step, each exact."""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_cli import api
from specdec_cli.engine.batch import plan as plan_module
from specdec_cli.engine.batch.admission import (
    BACKGROUND_SECONDS,
    FAIR_GAP,
    FAIR_STEP,
    MIN_CHUNK,
    PROMPT_ALONE_SECONDS,
    PROMPT_STEP_SECONDS,
    choose_slot,
    prompt_chunks,
    prompt_room,
    set_aside,
    taking_part,
)
from specdec_cli.engine.batch.occupancy import Occupancy
from specdec_cli.engine.batch.plan import Choice, Planner
from specdec_cli.engine.batch.pricing import filled, ubatch_sizes
from specdec_cli.engine.batch.realized import Realized
from specdec_cli.engine.batch.slots import BatchJob, SeqView, Slot
from specdec_cli.engine.drafters import NO_DRAFT
from specdec_cli.engine.drafters.auto import AutoState
from specdec_cli.engine.estimates import MIN_GAIN, Acceptance, BatchCosts
from specdec_cli.engine.events import Step
from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import AUTO, MODEL, GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.generation import GenerationRun
from tests.conftest import THREADS
from tests.distribution import P_THRESHOLD, PROMPT, SAMPLER, chi_square, reference
from tests.fakes import FakeGGUF

PROMPTS = [
    "Explain what a hash table is, in a paragraph.",
    "Write a short story about a lighthouse keeper.",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
    "List the planets of the solar system with one fact each.",
    "def fibonacci(n):",
]


# ---------------------------------------------------------------- the layout maths
def test_ubatch_sizes_follow_llama_cpp_split_equal() -> None:
    assert ubatch_sizes([1, 1, 1, 1], 256) == [4]  # one token each: one pass
    assert ubatch_sizes([5, 5, 5, 5], 256) == [20]
    assert ubatch_sizes([1, 0, 1], 256) == [1, 1]  # a gap in the sequence ids: two passes
    assert ubatch_sizes([5, 1, 1, 1], 256) == [4, 4]  # uneven: the common part, then the rest
    assert ubatch_sizes([3, 3, 2, 3], 256) == [8, 2, 1]  # seq 2 runs out: 0-1 go on, 3 alone
    assert ubatch_sizes([3, 3], 4) == [4, 2]  # the micro-batch size caps a pass
    assert ubatch_sizes([0, 0, 7], 256) == [7]


def test_filled_makes_one_micro_batch_of_the_generating_sequences() -> None:
    assert filled([5, 1, 0, 3], [0, 1, 3]) == [5, 5, 5, 5]
    assert ubatch_sizes(filled([5, 1, 0, 3], [0, 1, 3]), 256) == [20]
    assert filled([2, 0, 0, 0], [0]) == [2, 0, 0, 0]
    # a prompt chunk of another sequence stays as it is
    assert filled([2, 100, 2], [0, 2]) == [2, 100, 2]


def test_interpolated_costs_between_sparse_sizes() -> None:
    costs = BatchCosts({2: 1.5, 4: 2.0, 16: 5.0}, 0.01, interpolate=True)
    assert costs.relative(3) == pytest.approx(1.75)
    assert costs.relative(10) == pytest.approx(3.5)
    assert costs.relative(20) == pytest.approx(6.0)  # the last segment's slope beyond


def test_a_measured_small_batch_does_not_rescale_the_large_ones() -> None:
    """A parallel server measures mostly its plain steps (a token per slot); a batch of 8 must keep its
    calibrated price, not one scaled by how cheap the batches of 2 ran."""
    costs = BatchCosts({2: 1.3, 8: 2.1}, 0.01, interpolate=True)
    for _ in range(3):
        costs.observe(1, 0.01)
        costs.observe(2, 0.0112)
    assert costs.relative(2) == pytest.approx(1.12)
    assert costs.relative(8) == pytest.approx(2.1)
    solo = BatchCosts({2: 1.3, 8: 2.1}, 0.01)  # the solo engine measures the sizes it uses: it scales
    for _ in range(3):
        solo.observe(1, 0.01)
        solo.observe(2, 0.0112)
    assert solo.relative(8) < 0.8 * 2.1


def test_sizes_measured_on_a_slower_machine_are_priced_at_its_speed() -> None:
    """A parallel server at 8 slots measures batches of 7, 8 and (drafting) 13, never one token alone, on a
    machine slower than at calibration (calibrated F32 pair's shape, AMD EPYC). Relative to the calibrated
    one-token time the measured sizes looked dear: 8 to 13 came out flat (drafts free) and two passes of 3
    and 4 tokens cheaper than one of 8. Priced at the speed they imply, neither."""
    prior = {2: 1.018, 3: 1.46, 4: 1.76, 5: 2.01, 6: 1.89, 7: 2.78, 8: 2.73, 9: 2.77, 12: 3.07, 16: 3.62, 24: 4.70}
    costs = BatchCosts(prior, 0.015, interpolate=True)
    for _ in range(15):
        costs.observe(8, 0.0482)
        costs.observe(7, 0.0487)
    for _ in range(3):
        costs.observe(13, 0.0469)  # noise: less than 8
    assert costs.one == pytest.approx(0.0487 / 2.78)  # the median size's implied single decode, not 0.015
    assert costs.relative(7) == pytest.approx(2.78)
    assert costs.relative(3) + costs.relative(4) > costs.relative(8)  # one pass with a filler is cheaper
    for b in range(8, 14):  # the measured 8 and 13 fall below 7: each token more still costs something
        assert costs.relative(b) > costs.relative(b - 1) + 0.02
    exact = BatchCosts(prior, 0.015, interpolate=True)
    for _ in range(3):
        exact.observe(1, 0.018)  # measured: that is the single decode, whatever the batches imply
        exact.observe(8, 0.0482)
    assert exact.one == 0.018


def test_a_settled_median_keeps_the_cost_table() -> None:
    """A batch server times a batch at every step: timings that move a size's median by 1% or less leave
    the table as it is (rebuilding it was the planner's largest cost at 4 slots); a larger move prices anew."""
    costs = BatchCosts({2: 1.5, 4: 2.5}, 0.01)
    for t in (0.010, 0.010, 0.010, 0.020, 0.020, 0.020):
        costs.observe(1 if t == 0.010 else 4, t)
    assert costs.relative(4) == pytest.approx(2.0)
    table = dict(costs._relative)
    for t in (0.0201, 0.0199, 0.0201):
        costs.observe(4, t)
    assert costs._relative == table and costs.measured(4) == pytest.approx(0.020)
    for _ in range(7):
        costs.observe(4, 0.026)  # the median moves by 30%: measured again, priced anew
    assert costs.measured(4) == pytest.approx(0.026) and costs.relative(4) == pytest.approx(2.6)


def test_drafting_steps_that_fall_short_of_their_prediction_make_the_planner_careful() -> None:
    """Two slots; plain steps take 20 ms for 2 tokens. Drafting steps chosen for 1.2x that ran at 0.8x of a
    plain step bring the factor on drafting plans well below 1; plain steps alone then bring it back
    towards 1 (drafting is tried again); steps that beat their prediction never push it above 1."""
    r = Realized()
    assert r.factor(2) == 1.0
    r.drafting_step(2, 3, 0.03, 1.2)  # no plain steps timed yet: not comparable, ignored
    assert r.weights == {}
    for _ in range(5):
        r.plain_step(2, 0.020)
    for _ in range(20):
        r.drafting_step(2, 3, 0.0375, 1.2)  # 80 tok/s against 100: realized 0.8, predicted 1.2
    low = r.factor(2)
    assert low == pytest.approx((20 * 0.8 / 1.2 + 1) / 21, rel=0.05)
    assert 1.2 * low < MIN_GAIN  # the same plan is no longer taken
    assert r.factor(1) == 1.0 and r.factor(3) == 1.0  # other slot counts keep their own record
    for _ in range(1000):
        r.plain_step(2, 0.020)
    assert low < r.factor(2) and r.factor(2) > 0.95
    for _ in range(50):
        r.drafting_step(2, 6, 0.0375, 1.2)  # 160 tok/s: better than promised
    assert r.factor(2) == 1.0


def test_the_planner_scales_drafting_plans_by_their_record() -> None:
    """The same batch, lookups and costs: a drafting plan is chosen with a clean record, not with one
    where drafting steps ran at a third of their prediction; `predicted` says what the chosen plan promised."""
    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=2)
    costs = BatchCosts({b: 1.0 + 0.1 * (b - 1) for b in range(2, 65)}, 0.01)
    for _ in range(3):
        costs.observe(1, 0.01)
    chosen = []
    for record in (1.0, 1 / 3):
        planner = Planner(target, None, AutoState(costs=costs), BatchCosts(), n_slots=2, model_k_max=None,
                          budget=256)  # fmt: skip
        for _ in range(5):
            planner.realized.plain_step(2, 0.02)
        for _ in range(30):
            planner.realized.drafting_step(2, 3, 0.03 / record, 1.0)  # 3 tokens: 100 tok/s x record
        # a repeating text (the lookup proposes its continuation), whose lookups were mostly right so far
        gen = [_slot(target, seq, [1, 2, 3, 4, 5] * 8, hits=10) for seq in range(2)]
        plan = {seq: c for seq, c in planner.plan(gen, []).items() if c.n}
        chosen.append((plan, planner.predicted))
    (plan, predicted), (careful, none) = chosen
    assert plan and predicted is not None and MIN_GAIN < predicted < 3 * MIN_GAIN
    assert careful == {} and none is None


def _slot(target: FakeGGUF, seq: int, context: list[int], *, hits: int = 0, prompt: list[int] | None = None) -> Slot:
    """A generating slot whose lookup was right on 3 of 4 tokens `hits` times (a prompt being read with `prompt`)."""
    job = BatchJob(prompt or context, GenerateOptions(max_tokens=64).resolved(16), AUTO, k_max=16)
    slot = Slot(seq, job=job, gen=SpeculativeGenerator(SeqView(target, seq), None, job.prompt, job.config),
                context=context)  # fmt: skip
    slot.ngram.begin(context)
    for table in slot.shadow.tables.values():
        for _ in range(hits):
            table.observe(4, 3)
    return slot


def test_one_slots_drafts_are_not_bought_with_the_others_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four slots, each batch token 0.05 of a single decode more: a lone slot whose lookup is right 3 times
    in 4 gains more tokens than the other three lose, so the sum of tokens drafts, but every slot then waits
    for the larger batch and three gain nothing: the planner's geometric mean (`fair_tokens`) keeps the
    plain step. With the same lookup in every slot, or with the slot alone, the drafts are taken."""
    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=4)
    costs = BatchCosts({b: 1.0 + 0.05 * (b - 1) for b in range(2, 65)}, 0.01)
    costs.observe(1, 0.01)
    repeating, plain = [1, 2, 3, 4, 5] * 8, list(range(10, 50))  # a lookup proposes the first's continuation

    def drafts(n_repeating: int, n_slots: int) -> dict[int, int]:
        planner = Planner(target, None, AutoState(costs=costs), BatchCosts(), n_slots=n_slots, model_k_max=None,
                          budget=256)  # fmt: skip
        gen = [_slot(target, seq, repeating if seq < n_repeating else plain, hits=10) for seq in range(n_slots)]
        return {seq: c.n for seq, c in planner.plan(gen, []).items() if c.n}

    assert drafts(1, 4) == {}
    assert set(drafts(4, 4)) == {0, 1, 2, 3}
    assert set(drafts(1, 1)) == {0}
    monkeypatch.setattr(plan_module, "fair_tokens", lambda plan: sum(c.expected for c in plan.values()))
    monkeypatch.setattr(Planner, "_lookup_gains", lambda self, gen, caps: [0.0] + [math.inf] * 64)  # its bound
    assert set(drafts(1, 4)) == {0}  # the sum would have bought them


def test_fair_slots_bound_what_one_slots_drafts_cost_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two slots on a bandwidth-bound target (a batch of b tokens costs b**0.4 single decodes), one slot's lookup
    always right: unbounded, it drafts long (its gain outweighs the other's loss even in the geometric mean), and
    the other stream waits for the longer step. With fair slots, drafts may make the step FAIR_STEP plain steps
    or FAIR_GAP single decodes long, whichever is longer: here FAIR_GAP, which lets it draft more than FAIR_STEP
    would (beside a stream). A stream alone drafts as long as it pays; whole answers, while a streamed conversation
    may come back, only as long as BACKGROUND_SECONDS allows (its next turn would wait for the step)."""
    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=2)
    costs = BatchCosts({b: b**0.4 for b in range(2, 300)}, 0.01)
    costs.observe(1, 0.01)

    def drafts(fair: bool, n_slots: int = 2, streamed: bool = True, chatting: bool = True) -> tuple[int, float, float]:
        """The first slot's draft length, the step's cost (single decodes) and the plain step's."""
        planner = Planner(target, None, AutoState(costs=costs), BatchCosts(), n_slots=n_slots, model_k_max=None,
                          budget=256)  # fmt: skip
        planner.fair_step = FAIR_STEP if fair else None
        planner.chatting = chatting  # a free slot holds a streamed conversation
        gen = [_slot(target, 0, [1, 2, 3, 4, 5] * 8), *(_slot(target, s, list(range(10, 50))) for s in range(1, n_slots))]
        for s in gen:
            assert s.job is not None
            s.job.config = dataclasses.replace(s.job.config, interactive=streamed)
        for table in gen[0].shadow.tables.values():
            for _ in range(40):
                table.observe(16, 16)
        chosen = planner.plan(gen, [])
        assert all(c.n == 0 for seq, c in chosen.items() if seq)
        plain = {s.seq: Choice("plain", 0, 1.0) for s in gen}
        full = {**plain, **chosen}
        empty = [0] * n_slots
        return full[0].n, planner._cost(full, empty, None, whole=True), planner._cost(plain, empty, None, whole=True)

    (unfair, unfair_step, plain), (fair, fair_step, _) = drafts(False), drafts(True)
    assert unfair >= 10 and unfair_step > max(FAIR_STEP * plain, FAIR_GAP)
    assert 1 <= fair < unfair and FAIR_STEP * plain < fair_step <= FAIR_GAP
    assert drafts(True, n_slots=1)[0] >= 10
    # Whole answers (a chat client's tasks), alone or side by side: nobody reads their steps, but while a free slot
    # holds a streamed conversation, its next turn may arrive and wait for the step in progress, so a step lasts
    # at most BACKGROUND_SECONDS (here 2.5 single decodes). With no conversation to come back, a whole answer
    # alone drafts as a stream alone does
    monkeypatch.setattr(plan_module, "BACKGROUND_SECONDS", 0.025)
    for n_slots in (1, 2):
        (background, background_step, plain_step), (unbounded, unbounded_step, _) = (
            drafts(fair, n_slots=n_slots, streamed=False) for fair in (True, False))  # fmt: skip
        assert 1 <= background < unbounded and background_step <= max(plain_step, 2.5) < unbounded_step
    assert drafts(True, n_slots=1, streamed=False, chatting=False)[0] == drafts(True, n_slots=1)[0] >= 10

    def beside_a_first_token(fair: bool) -> int:
        """The slot alone generating while another request's prompt finishes in this step."""
        planner = Planner(target, None, AutoState(costs=costs), BatchCosts(), n_slots=2, model_k_max=None,
                          budget=256)  # fmt: skip
        planner.fair_step = FAIR_STEP if fair else None
        gen = [_slot(target, 0, [1, 2, 3, 4, 5] * 8)]
        for table in gen[0].shadow.tables.values():
            for _ in range(40):
                table.observe(16, 16)
        chosen = planner.plan(gen, [_slot(target, 1, [], prompt=list(range(60, 90)))])
        return chosen[0].n if 0 in chosen else 0

    assert beside_a_first_token(False) >= 10 and beside_a_first_token(True) == 0

    def beside_a_prompt(fair: bool) -> tuple[int, float, float]:
        """The slot alone generating while a long prompt is read (not finishing in this step): its draft length,
        the step's cost and the plain step's (single decodes)."""
        planner = Planner(target, None, AutoState(costs=costs), BatchCosts(), n_slots=2, model_k_max=None,
                          budget=256)  # fmt: skip
        planner.fair_step = FAIR_STEP if fair else None
        gen, pre = [_slot(target, 0, [1, 2, 3, 4, 5] * 8)], [_slot(target, 1, [], prompt=list(range(60, 460)))]
        for table in gen[0].shadow.tables.values():
            for _ in range(40):
                table.observe(16, 16)
        chosen = planner.plan(gen, pre)
        chunk = [0, planner.prompt_room(1, 2, pre)]
        n = chosen[0].n if 0 in chosen else 0
        step = planner._cost({0: chosen.get(0, Choice("plain", 0, 1.0))}, chunk, None, whole=True)
        return n, step, planner._cost({0: Choice("plain", 0, 1.0)}, chunk, None, whole=True)

    (unfair, _, _), (fair, step, plain) = beside_a_prompt(False), beside_a_prompt(True)
    assert fair < unfair and step <= plain + (FAIR_STEP - 1) * 1.0  # the plain step alone is one single decode


def test_prompts_are_read_shortest_first_and_a_finishing_one_is_not_held_up() -> None:
    """Fair: a chat's next turn (20 tokens left) is read before two long task prompts, and the step that
    finishes it takes at most half as many of their tokens again; first admitted first without fair slots."""
    target = FakeGGUF("target.gguf", n_ctx=1024, n_seq=4)
    slots = [_slot(target, seq, [], prompt=list(range(10, 10 + n))) for seq, n in enumerate((300, 400, 20))]
    assert [(s.seq, n) for s, n in prompt_chunks(slots, 512, 1, fair=False)] == [(0, 300), (1, 212)]
    assert [(s.seq, n) for s, n in prompt_chunks(slots, 512, 1, fair=True)] == [(2, 20), (0, 10)]
    assert [(s.seq, n) for s, n in prompt_chunks(slots[:2], 512, 1, fair=True)] == [(0, 300), (1, 150)]


def test_beside_other_requests_a_step_reads_a_tenth_of_a_second_of_prompt() -> None:
    """A step reads as much prompt as fits in PROMPT_ALONE_SECONDS at the measured costs for a request alone
    (the whole budget where that fits), and PROMPT_STEP_SECONDS beside others (or with others waiting to be
    read): a request arriving meanwhile waits for that much, not for the whole budget."""
    costs = BatchCosts({b: 1.0 + 0.25 * (b - 1) for b in range(2, 300)}, 0.01)
    costs.observe(1, 0.01)  # 10 ms a token, each more a quarter of it: 0.1 s is 37 tokens
    alone = prompt_room(costs, 0, 1, 256)
    assert costs.relative(alone) * 0.01 <= PROMPT_ALONE_SECONDS < costs.relative(alone + 1) * 0.01
    assert prompt_room(BatchCosts({b: 1.0 + 0.01 * (b - 1) for b in range(2, 300)}, 0.01), 0, 1, 256) == 256
    room = prompt_room(costs, 2, 3, 256)
    assert costs.relative(2 + room) * 0.01 <= PROMPT_STEP_SECONDS < costs.relative(3 + room) * 0.01
    assert prompt_room(BatchCosts({b: 50.0 * b for b in range(2, 300)}, 0.01), 2, 3, 256) == MIN_CHUNK
    background = prompt_room(costs, 0, 1, 256, background=True)  # a prompt nobody streams, even alone
    assert costs.relative(background) * 0.01 <= BACKGROUND_SECONDS < costs.relative(background + 1) * 0.01


def test_a_streams_prompt_is_read_while_whole_answers_sit_the_step_out() -> None:
    """Fair: while a streamed request's prompt is read, requests that do not stream (a chat client's tasks) take
    no part in the step, streams already generating do; without a streamed prompt, or fair slots off, all do."""
    target = FakeGGUF("target.gguf", n_ctx=1024, n_seq=4)

    def slot(seq: int, *, streamed: bool, generating: bool) -> Slot:
        s = _slot(target, seq, list(range(10, 40)) if generating else [], prompt=list(range(10, 40)))
        assert s.job is not None
        s.job.config = dataclasses.replace(s.job.config, interactive=streamed)
        s.prefilled = 29 if generating else 0
        return s

    task, reading_task = slot(0, streamed=False, generating=True), slot(1, streamed=False, generating=False)
    watched, turn = slot(2, streamed=True, generating=True), slot(3, streamed=True, generating=False)
    every = [task, reading_task, watched, turn]
    assert taking_part(every, fair=True) == ([watched], [turn])
    assert taking_part(every, fair=False) == ([task, watched], [reading_task, turn])
    assert taking_part([task, reading_task, watched], fair=True) == ([task, watched], [reading_task])




def test_a_slot_is_taken_by_its_prompt_or_kept_for_the_conversation_that_ended_last() -> None:
    """A job takes the slot whose cache holds most of its prompt; a job that shares only a system prompt with
    the conversation that ended last (a chat client's title task) leaves that slot for the chat's next turn."""
    target = FakeGGUF("target.gguf", n_ctx=1024, n_seq=4)
    slots = [Slot(seq) for seq in range(4)]
    system, chat = list(range(1, 31)), list(range(100, 400))
    target.seq_tokens[1][:] = system + chat
    slots[1].last_used = 2.0  # ended last
    slots[3].last_used = 1.0
    task = BatchJob(system + list(range(500, 800)), GenerateOptions(max_tokens=8).resolved(4), AUTO, k_max=4)
    turn = BatchJob(system + chat + list(range(900, 920)), GenerateOptions(max_tokens=8).resolved(4), AUTO, k_max=4)
    assert choose_slot(target, slots, turn, slots).seq == 1
    assert choose_slot(target, slots, task, slots).seq == 0  # never used, beside nothing busy
    slots[0].job = task
    free = [s for s in slots if s.job is None]
    chosen = choose_slot(target, slots, task, free)
    assert chosen.seq == 2  # not the chat's slot, though it alone lies beside the busy one
    # ... so the task takes the chat's slot and the chat's cache moves where the task would have gone
    assert set_aside(target, slots, task, free, chosen) == (slots[1], chosen)
    assert set_aside(target, slots, task, free, slots[3]) == (slots[1], slots[3])
    slots[0].job = None  # nothing busy: no gap to close
    assert set_aside(target, slots, task, slots, chosen) == (chosen, None)
    slots[0].job, slots[2].job = task, task  # slot 1 lies between busy slots: any other choice leaves the gap
    assert set_aside(target, slots, task, [slots[1], slots[3]], slots[3]) == (slots[1], slots[3])
    slots[2].job = None
    target.seq_tokens[2][:] = task.prompt  # a cache that is the job's own prompt stays where it is
    assert set_aside(target, slots, task, free, chosen) == (chosen, None)


@pytest.mark.parametrize("drafter", ["none", "auto"])  # auto: the draft model's cache moves too
def test_a_conversation_set_aside_for_a_busy_slots_neighbour_continues_from_its_cache_exactly(drafter: str) -> None:
    """Three slots: a chat's answer ends in slot 1 (its cache kept for its next turn), a long request runs in
    slot 2, and another request arrives. Slot 1 alone lies beside the busy one, so the newcomer takes it and the
    chat's cache moves to slot 0 (`Model.move_seq`: llama.cpp copies the KV stream). Every text is the target's
    own, and the chat's next turn reads its cached prompt from slot 0."""
    def ask(subject: str) -> list[dict[str, str]]:  # most of each prompt its own, not the template's system prompt
        return [{"role": "user", "content": f"Write about {subject}. Describe what it looks like, how it works, "
                 f"who uses it and why, what it costs, and what can go wrong with {subject}, in plain words."}]  # fmt: skip

    a, chat, long_, new_ = ask("a lighthouse"), ask("a bicycle"), ask("a windmill"), ask("a sailing boat")
    with api.load(n_ctx=1024, n_threads=THREADS, drafter="none") as solo:
        answer = solo.generate(chat, max_tokens=24)
        turn = [*chat, {"role": "assistant", "content": answer.text}, {"role": "user", "content": "And then?"}]
        ref = {k: solo.generate(p, max_tokens=n).token_ids for k, p, n in
               (("long", long_, 96), ("new", new_, 16), ("turn", turn, 16))}  # fmt: skip
    with api.load(n_ctx=1024, n_threads=THREADS, parallel=3, drafter=drafter) as par3:
        engine = par3.batch_engine()
        par3.generate(a, max_tokens=4)  # slot 0
        assert par3.generate(chat, max_tokens=24).token_ids == answer.token_ids  # slot 1, ended last
        long = par3.start(long_, max_tokens=96)  # slot 2: never used
        events = long.events()
        assert isinstance(next(ev for ev in events if isinstance(ev, Step)), Step)
        assert engine.busy() == [False, False, True]
        new = par3.start(new_, max_tokens=16)
        new_events = new.events()
        assert isinstance(next(ev for ev in new_events if isinstance(ev, Step)), Step)
        assert engine.busy() == [False, True, True]  # beside the busy slot, not slot 0
        for _ in new_events:
            pass
        for _ in events:
            pass
        assert (long.generation.token_ids, new.generation.token_ids) == (ref["long"], ref["new"])
        again = par3.start(turn, max_tokens=16)
        for _ in again.events():
            pass
        assert again.generation.token_ids == ref["turn"]
        assert again.n_cached > len(par3.tokenize(chat).ids)


def test_no_draft_rounds_while_prompts_are_read_into_a_batch_where_they_cannot_pay() -> None:
    """Seven prompts finish reading beside one generating slot (a batch of eight clients starting): draft
    rounds would hold them all up, and in the batch of eight the next step makes the draft model cannot pay
    even if it were always right (each batch token costs 0.3 of a decode, a draft token 0.3). So no model
    drafts, where the lone slot's own sums (the prompts' tokens paid anyway, a draft right 98% of the time)
    favoured them; the slot alone drafts with the model."""
    target, draft = FakeGGUF("target.gguf", n_ctx=512, n_seq=8), FakeGGUF("draft.gguf", n_ctx=512, n_seq=8)
    costs = BatchCosts({b: 1.0 + 0.3 * (b - 1) for b in range(2, 257)}, 0.02)
    draft_costs = BatchCosts({b: 1.0 + 0.3 * (b - 1) for b in range(2, 257)}, 0.006)
    for _ in range(3):
        costs.observe(1, 0.02)
        draft_costs.observe(1, 0.006)
    context = list(range(10, 50))

    def sources(n_reading: int) -> set[str]:
        state = AutoState(costs=costs, model=Acceptance(prior=0.98, weight=6.0))
        planner = Planner(target, draft, state, draft_costs, n_slots=8, model_k_max=8, budget=256)
        draft.seq_tokens[0][:] = context  # the draft's cache holds the context: no catch-up to pay
        gen = [_slot(target, 0, context)]
        pre = [_slot(target, seq, [], prompt=list(range(60, 100))) for seq in range(1, 1 + n_reading)]
        for s in pre:
            s.prefilled = 24  # 16 prompt tokens left each: they all finish in this step
        return {c.source for c in planner.plan(gen, pre).values() if c.n}

    assert sources(7) == set()
    assert sources(0) == {MODEL}


def test_occupancy_measures_how_soon_the_batch_grows() -> None:
    one_at_a_time = Occupancy()
    for _ in range(5):  # requests one after another: one busy slot, never joined
        for _ in range(40):
            one_at_a_time.observe(1)
    assert one_at_a_time.steps_until_growth(1) == math.inf

    taking_turns = Occupancy()  # two clients: one finishes, the other's next request comes 2 steps later
    for _ in range(5):
        for _ in range(40):
            taking_turns.observe(2)
        for _ in range(2):
            taking_turns.observe(1)
    assert 1.5 < taking_turns.steps_until_growth(1) < 3.0
    assert taking_turns.steps_until_growth(2) == math.inf  # a third never came
    taking_turns.observe(2)
    taking_turns.observe(3)  # one arrival in all the steps spent at two
    assert taking_turns.steps_until_growth(2) == pytest.approx(taking_turns.steps[2], rel=0.01)
    assert taking_turns.steps_until_growth(2) > 100


# ---------------------------------------------------------------- real models
@pytest.fixture(scope="module")
def solo() -> Iterator[api.Speculator]:
    with api.load(n_ctx=1024, n_threads=THREADS) as spec:
        yield spec


@pytest.fixture(scope="module")
def par() -> Iterator[api.Speculator]:
    with api.load(n_ctx=1024, n_threads=THREADS, parallel=4) as spec:
        yield spec


def _concurrently(spec: api.Speculator, prompts: list[str], **kw: object) -> list[api.Generation]:
    out: list[api.Generation | None] = [None] * len(prompts)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            out[i] = spec.generate(prompts[i], **kw)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert all(g is not None for g in out)
    return [g for g in out if g is not None]


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["auto", "model", "ngram", "none"])
def test_concurrent_greedy_requests_match_their_solo_runs(solo: api.Speculator, par: api.Speculator,
                                                          drafter: str) -> None:  # fmt: skip
    """Five requests on four slots (one waits for a slot), each compared with its solo run. With a fixed draft
    length fair slots are off: beside three other streams they would trim the drafts to nothing on most steps,
    and the drafts must go through the shared batch here."""
    ref = [solo.generate(p, max_tokens=40, drafter=drafter) for p in PROMPTS]
    engine = par.batch_engine()
    engine.set_fair(drafter != "model")
    try:
        got = _concurrently(par, PROMPTS, max_tokens=40, drafter=drafter)
    finally:
        engine.set_fair(True)
    for r, g in zip(ref, got, strict=True):
        assert g.token_ids == r.token_ids
        assert g.text == r.text
        assert g.stop_reason == r.stop_reason
        s = g.stats
        assert 0 <= s.accepted <= s.drafted
        assert s.emitted_from_draft + s.emitted_from_target == len(g.token_ids)
    if drafter == "model":  # a fixed draft length: drafts really went through the shared batch
        assert sum(g.stats.drafted for g in got) > 0
    if drafter == "none":
        assert all(g.stats.drafted == 0 for g in got)
    assert NO_DRAFT.tokens == [] and NO_DRAFT.dists == []  # the shared plain-step proposal: read, never changed


@pytest.mark.slow
def test_a_cancelled_request_leaves_the_others_exact(solo: api.Speculator, par: api.Speculator) -> None:
    ref = [solo.generate(p, max_tokens=32, drafter="model") for p in PROMPTS[:3]]
    stop = threading.Event()
    runs = [par.start(p, max_tokens=32, drafter="model", cancel=stop if i == 1 else None)
            for i, p in enumerate(PROMPTS[:3])]  # fmt: skip
    out: dict[int, api.Generation] = {}

    def consume(i: int) -> None:
        for n, _ in enumerate(runs[i].events()):
            if i == 1 and n == 3:
                stop.set()
        out[i] = runs[i].generation

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert out[1].stop_reason == "interrupted"
    assert out[1].token_ids == ref[1].token_ids[: len(out[1].token_ids)]
    assert out[0].token_ids == ref[0].token_ids
    assert out[2].token_ids == ref[2].token_ids
    # the slots stay usable, their caches consistent
    assert par.generate(PROMPTS[1], max_tokens=32, drafter="model").token_ids == ref[1].token_ids


@pytest.mark.slow
def test_whole_answers_sit_out_the_steps_that_read_a_streams_prompt(solo: api.Speculator, par: api.Speculator) -> None:
    """Two requests that do not stream (`interactive` off) generate; a streamed one arrives: the steps that read
    its prompt hold it alone (three slots busy, one sequence in the batch), and every text is its solo run's."""
    ref = [solo.generate(p, max_tokens=64) for p in PROMPTS[:3]]
    engine = par.batch_engine()
    steps: list[tuple[int, int]] = []  # (sequences in the batch, slots busy)
    engine.on_step, before = (lambda n_seqs, n_tokens, drafted: steps.append((n_seqs, sum(engine.busy())))), engine.on_step
    out: dict[int, api.Generation] = {}
    generating = [threading.Event(), threading.Event()]

    def consume(i: int, run: GenerationRun) -> None:
        for ev in run.events():
            if isinstance(ev, Step) and i < 2:
                generating[i].set()
        out[i] = run.generation

    try:
        threads = [threading.Thread(target=consume, args=(i, par.start(PROMPTS[i], max_tokens=64, interactive=False)))
                   for i in range(2)]  # fmt: skip
        for t in threads:
            t.start()
        assert all(e.wait(120) for e in generating)
        threads.append(threading.Thread(target=consume, args=(2, par.start(PROMPTS[2], max_tokens=64))))
        threads[-1].start()
        for t in threads:
            t.join(300)
    finally:
        engine.on_step = before
    assert [out[i].token_ids for i in range(3)] == [r.token_ids for r in ref]
    assert (1, 3) in steps  # the stream's prompt read alone beside two busy slots


def test_the_second_ask_reuses_its_slots_cached_prefix(par: api.Speculator) -> None:
    system = "You are a careful assistant who answers in one short paragraph. " * 6
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name a river."}]
    par.generate(messages, max_tokens=8)
    run = par.start([messages[0], {"role": "user", "content": "Name a lake."}], max_tokens=8)
    for _ in run.events():
        pass
    assert run.n_cached > 0.8 * run.generation.n_prompt_tokens


def test_a_prompt_longer_than_a_slot_is_refused(par: api.Speculator) -> None:
    from specdec_cli.errors import ContextError

    with pytest.raises(ContextError, match="--ctx-size"):
        par.generate("word " * 2000, max_tokens=4, chat=False)
    assert par.generate(PROMPTS[0], max_tokens=4).token_ids  # and the engine goes on


@pytest.mark.slow
def test_each_slot_holds_its_own_context() -> None:
    """--ctx-size is per slot: every slot can use all of it."""
    prompts = ["Count: 1, 2, 3,", "Letters: a, b, c,"]
    with api.load(n_ctx=128, n_threads=THREADS, drafter="none") as one:
        ref = [one.generate(p, max_tokens=400, chat=False) for p in prompts]
    with api.load(n_ctx=128, n_threads=THREADS, parallel=2, drafter="none") as spec:
        assert spec.n_ctx == 128
        got = _concurrently(spec, prompts, max_tokens=400, chat=False)
    assert [g.stop_reason for g in got] == ["context", "context"]
    assert [g.token_ids for g in got] == [r.token_ids for r in ref]
    assert all(g.n_prompt_tokens + len(g.token_ids) > 120 for g in got)


@pytest.mark.slow
def test_sampled_tokens_follow_the_target_distribution_with_two_slots_busy(smol: Model, smol_q2k_path: Path) -> None:
    """Sampling with model drafts while another generation shares every batch: the first two tokens
    still follow the target's processed distribution (chi-square, as tests/test_distribution.py)."""
    _, p1, mode, p2 = reference(smol)
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    lock = threading.Lock()
    n_samples = 500
    with api.load(smol.path, smol_q2k_path, n_ctx=256, n_threads=THREADS, parallel=2, drafter="model") as spec:
        ids = spec.tokenize(PROMPT, chat=False)
        opts = dict(max_tokens=3, draft_max=2, temperature=SAMPLER.temperature, top_k=SAMPLER.top_k,
                    top_p=SAMPLER.top_p, min_p=SAMPLER.min_p)  # fmt: skip

        def worker(n: int) -> None:
            for _ in range(n):
                g = spec.generate(ids, **opts)  # type: ignore[arg-type]
                with lock:
                    first[g.token_ids[0]] += 1
                    if g.token_ids[0] == mode and len(g.token_ids) > 1:
                        second[g.token_ids[1]] += 1

        threads = [threading.Thread(target=worker, args=(n_samples // 2,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert spec.batch_engine().state.model.n > 0  # model drafts were verified
    results = [chi_square(first, p1, 1), chi_square(second, p2, 2)]
    assert sum(first.values()) == n_samples
    for r in results:
        assert r.pvalue > P_THRESHOLD, r
    assert np.isfinite([r.pvalue for r in results]).all()


# ---------------------------------------------------------------- the planner's bounds
class _Exhaustive(Planner):
    """The planner with its lookup bound switched off: every plan of lookups priced."""

    def _lookup_gains(self, gen: list[Slot], caps: dict[int, int]) -> list[float]:
        return [0.0] + [math.inf] * 1024


@settings(max_examples=60, deadline=None)
@given(n_slots=st.integers(1, 8), seed=st.integers(0, 2**32 - 1), marginal=st.floats(0.02, 1.0))
def test_the_planners_bound_prunes_only_plans_that_lose(n_slots: int, seed: int, marginal: float) -> None:
    """Plans of lookups are priced only when a bound says they could beat the best so far
    (`Planner._lookup_gains`); the plan chosen is the one pricing every plan chooses, whatever the
    contexts, the acceptance learned and the batch costs."""
    rng = np.random.default_rng(seed)
    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=n_slots)
    costs = BatchCosts({b: 1.0 + marginal * (b - 1) ** rng.uniform(0.7, 1.0) for b in range(2, 65)}, 0.01)
    costs.observe(1, 0.01)
    planners = [cls(target, None, AutoState(costs=costs), BatchCosts(), n_slots=n_slots, model_k_max=None,
                    budget=256) for cls in (Planner, _Exhaustive)]  # fmt: skip
    gen = []
    for seq in range(n_slots):
        context = [int(t) for t in rng.integers(0, 6, size=int(rng.integers(8, 60)))]  # repeats: lookups
        job = BatchJob(context, GenerateOptions(max_tokens=64).resolved(16), AUTO, k_max=16)
        slot = Slot(seq, job=job, gen=SpeculativeGenerator(SeqView(target, seq), None, context, job.config),
                    context=context)  # fmt: skip
        slot.ngram.begin(context)
        for table in slot.shadow.tables.values():  # acceptance learned on earlier proposals
            for _ in range(int(rng.integers(0, 12))):
                k = int(rng.integers(1, 9))
                table.observe(k, int(rng.binomial(k, rng.uniform(0, 1))))
        slot.shadow.last_ok = bool(rng.integers(0, 2))
        gen.append(slot)
    drafts = [{seq: c for seq, c in p.plan(gen, []).items() if c.n} for p in planners]  # no choice: plain
    assert drafts[0] == drafts[1]


def test_a_step_with_no_prompt_to_read_prices_no_prompt_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fair slots price how much prompt a step may read; with no prompt waiting that pricing rebuilt the cost table
    up to the token budget on every plain step (host time, engine/batch/plan.py). It is skipped, not changed."""
    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=2)
    costs = BatchCosts({b: 1.0 + 0.1 * (b - 1) for b in range(2, 300)}, 0.01)
    planner = Planner(target, None, AutoState(costs=costs), BatchCosts(), n_slots=2, model_k_max=None, budget=256)
    planner.fair_step = FAIR_STEP
    pre = [_slot(target, 1, [], prompt=list(range(60, 460)))]
    assert 0 < planner.prompt_room(1, 2, pre) < 255  # a waiting prompt: priced, bounded below the budget

    def priced(*_: object) -> float:
        raise AssertionError("a step with no prompt to read priced one")

    monkeypatch.setattr(costs, "relative", priced)
    assert planner.prompt_room(1, 1, []) == 255


def test_a_restored_slot_state_computes_bit_for_bit_as_a_fresh_prefill(smol_path: Path) -> None:
    """prompt_cache.py's premise: a sequence's saved cache, restored into another slot that held something else,
    gives the next token's logits bit for bit as the same tokens prefilled in one batch."""
    with Model(smol_path, n_ctx=256, n_seq=3, n_threads=THREADS) as m:
        prompt = m.tokenize("Write a detailed essay about the history of the printing press, in several long "
                            "paragraphs, with dates and names.", add_special=True, parse_special=False)  # fmt: skip
        other = [*prompt[:3], *m.tokenize(" Something else entirely, to fill the cache first.", add_special=False,
                                          parse_special=False)]  # fmt: skip
        nxt = m.tokenize(" The", add_special=False, parse_special=False)[:1]
        m.decode_many([(0, prompt, 1, 0)])
        fresh = m.decode_many([(0, nxt, 1, 0)])[0].copy()
        m.decode_many([(1, other, 1, 0)])  # a history in slot 1: other tokens, rolled back, the prompt in chunks
        m.rollback(3, 1)
        m.decode_many([(1, prompt[3:20], 0, 0)])
        m.decode_many([(1, prompt[20:], 1, 0)])
        state = m.save_seq(1)
        m.decode_many([(1, nxt * 2, 1, 0)])  # slot 1 goes on; the state does not
        m.decode_many([(2, other, 1, 0)])
        assert m.restore_seq(2, state, prompt) and m.seq_tokens[2] == prompt
        restored = m.decode_many([(2, nxt, 1, 0)])[0]
        assert np.array_equal(fresh.view(np.uint32), restored.view(np.uint32))


def test_a_displaced_prompt_comes_back_from_the_prompt_cache() -> None:
    """Two prompts sharing their first half take the same slot in turn (admission.py); the first one's tail is
    kept in host memory, and when it comes back (the next turn: the first prompt and more) it is restored, not
    read again: fewer tokens prefilled, and the text the same as without the cache."""
    shared = ("Here is a passage about lighthouses. Lighthouses stand on coasts and guide ships at night with "
              "bright lamps and lenses, and their keepers once lived in them all year. ")  # fmt: skip
    first = shared + "Question: who lived in lighthouses, and why did they stay there all year long?"
    second = shared + "Question: what do the lenses do?"
    turn = first + " Answer in one sentence."
    runs = {}
    for mb in (0, 64):
        with api.load(n_ctx=512, n_threads=THREADS, parallel=2, drafter="none", prompt_cache_mb=mb) as spec:
            texts = []
            for prompt in (first, second, turn):
                run = spec.start(prompt, max_tokens=8, chat=False)
                for _ in run.events():
                    pass
                texts.append((run.generation.token_ids, run.n_cached))
            cache = spec.batch_engine().prompt_cache
            runs[mb] = (texts, cache.restored if cache is not None else 0)
    (plain, none), (cached, restored) = runs[0], runs[64]
    assert none == 0 and restored == 1
    assert [t for t, _ in cached] == [t for t, _ in plain]  # the same text, every request
    assert cached[2][1] > plain[2][1] + 10, (cached, plain)  # the turn found its first prompt's cache


def test_the_prompt_cache_keeps_what_a_request_drops_within_its_budget() -> None:
    """What is kept (a slot's content a request drops, at least MIN_SAVED tokens of it), what is restored (a kept
    state holding MIN_GAIN more of the prompt than the slot), what goes (the least recently used past the budget,
    a kept state a newer one extends). The fake's state is its tokens, 4 bytes each."""
    from specdec_cli.engine.batch.prompt_cache import MIN_GAIN, MIN_SAVED, PromptCache

    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=2)
    cache = PromptCache(budget_bytes=4 * 100)
    a, b = list(range(1000, 1040)), list(range(2000, 2040))
    target.seq_tokens[0][:] = a
    assert cache.take_over(target, 0, a[:10] + [7] * 20) == 10 and len(cache) == 1  # 30 of a's dropped: kept
    target.seq_tokens[0][:] = a[:10] + [7] * 20
    assert cache.take_over(target, 0, a[:10] + [7] * 5 + [8]) == 15 and len(cache) == 1  # 15 dropped: not kept
    target.seq_tokens[0][:] = a[:12]
    assert cache.take_over(target, 0, a[:12 + MIN_GAIN - 1]) == 12  # a kept state 3 tokens better: not worth it
    assert cache.take_over(target, 0, [*a, 5]) == 40 and target.seq_tokens[0] == a and cache.restored == 1
    target.seq_tokens[1][:] = b + b  # 80 tokens: with a's 40, past the budget of 100: a's state goes
    assert cache.take_over(target, 1, [1]) == 0 and list(cache._states) == [tuple(b + b)]
    target.seq_tokens[1][:] = b + b + [3] * MIN_SAVED  # extends the kept one: it replaces it
    cache.take_over(target, 1, [1])
    assert list(cache._states) == [tuple(b + b + [3] * MIN_SAVED)] and cache.bytes_used == 4 * (80 + MIN_SAVED)
    target.seq_tokens[1][:] = list(range(200))  # bigger than the whole budget: not kept
    cache.take_over(target, 1, [1])
    assert len(cache) == 1 and cache.saved == 3


def test_the_prompt_cache_leaves_a_slot_alone_while_a_move_is_pending() -> None:
    """admission.py's set_aside moves a cache to another slot; llama.cpp copies the stream as the next decode
    starts, so until then neither slot's cells are what their tokens say. A restore into either was overwritten
    by that copy (a request's first token was another text's: found by test_concurrent_greedy_requests_...)."""
    from specdec_cli.engine.batch.prompt_cache import PromptCache

    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=2)
    cache = PromptCache(budget_bytes=1 << 20)
    a = list(range(1000, 1040))
    target.seq_tokens[0][:] = a
    cache.take_over(target, 0, [1])
    target.seq_tokens[1][:] = list(range(2000, 2040))
    target.pending_moves.add(1)
    assert cache.take_over(target, 1, a) == 0 and cache.saved == 1 and cache.restored == 0
    target.pending_moves.clear()
    assert cache.take_over(target, 1, a) == 40 and cache.saved == 2 and cache.restored == 1


def test_an_idle_engine_keeps_a_slot_so_the_request_that_displaces_it_copies_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Once a request ends and nothing else runs, a server's engine keeps its slot's cells (`keep`, `idle_keep`):
    a later request that takes the slot over then saves nothing before its prompt is read (the copy was most
    of a request's own host time at one client), and the displaced conversation still comes back restored.
    `keep` leaves short slots, slots kept already (or within a kept state) and slots being moved alone."""
    from specdec_cli.engine.batch.prompt_cache import MIN_SAVED, PromptCache
    from tests.fakes import open_fake

    target = FakeGGUF("target.gguf", n_ctx=512, n_seq=2)
    cache = PromptCache(budget_bytes=1 << 20)
    a = list(range(1000, 1040))
    target.seq_tokens[0][:] = a[: MIN_SAVED - 1]
    cache.keep(target, 0)
    target.seq_tokens[1][:] = a
    target.pending_moves.add(1)
    cache.keep(target, 1)
    assert len(cache) == 0
    target.pending_moves.clear()
    cache.keep(target, 1)
    cache.keep(target, 1)
    target.seq_tokens[0][:] = a[:30]  # within the kept state: nothing more to keep
    cache.keep(target, 0)
    assert list(cache._states) == [tuple(a)] and cache.saved == 1

    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    prompt = "Here is a passage about lighthouses and the keepers who lived in them all year. Question: "
    with api.load(open_model=open_fake, n_ctx=1024, parallel=2, drafter="none", prompt_cache_mb=64) as par:
        engine = par.batch_engine()
        assert engine.prompt_cache is not None and not engine.prompt_cache.idle_keep  # the server turns it on
        engine.prompt_cache.idle_keep = True
        first = par.generate(prompt + "who lived there?", max_tokens=24, chat=False)
        deadline = time.monotonic() + 10
        while engine.prompt_cache.saved < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.prompt_cache.saved == 1  # kept while idle, before any request displaced it
        saved_while_admitting: list[int] = []
        take_over = engine.prompt_cache.take_over

        def watched(target: Any, seq: int, p: Any) -> int:
            before = engine.prompt_cache.saved
            out = take_over(target, seq, p)
            saved_while_admitting.append(engine.prompt_cache.saved - before)
            return out

        monkeypatch.setattr(engine.prompt_cache, "take_over", watched)
        par.generate(prompt + "what did the lamps do?", max_tokens=24, chat=False)  # takes the first one's slot
        again = par.generate(prompt + "who lived there?", max_tokens=24, chat=False)
        assert saved_while_admitting and not any(saved_while_admitting)
        assert again.token_ids == first.token_ids and engine.prompt_cache.restored >= 1


def test_a_server_reads_its_vocabulary_and_template_before_the_first_request() -> None:
    """The end-of-generation and control tokens (a scan of the vocabulary through llama.cpp each) and the chat
    template's compilation cost the first request tens of milliseconds of its time to first token; the server
    does them as it starts."""
    from specdec_cli.engine import templates
    from specdec_cli.engine.settings import GenerateOptions
    from specdec_cli.server.app import Server, ServerSettings

    templates._compile.cache_clear()
    with api.load(n_ctx=512, n_threads=THREADS, parallel=2, drafter="none") as spec:
        vocab = spec.target.vocab  # type: ignore[attr-defined]
        assert vocab._eog is None and vocab._controls is None
        server = Server(spec, ServerSettings("warm", GenerateOptions()))
        try:
            assert vocab._eog is not None and vocab._controls is not None
            assert templates._compile.cache_info().currsize == 1
        finally:
            server.shutdown()


def test_requests_that_never_draft_step_as_solo_runs_without_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests with no drafter (`serve --no-draft`): each step is their solo runs' plain step
    (`BatchEngine._plain_step`: no drafting plan, no records), greedy and seeded sampling alike, one request at a
    time, with a cancel, and several at once; beside a request that may draft, the planner prices the step."""
    from tests.fakes import open_fake

    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    planned: list[int] = []
    plan = Planner.plan
    monkeypatch.setattr(Planner, "plan", lambda self, gen, pre: (planned.append(len(gen)), plan(self, gen, pre))[1])
    prompts = ["Name three rivers.", "Write a line about the sea."]
    kw: list[dict[str, Any]] = [{}, {"temperature": 0.9, "seed": 3}]
    with api.load(open_model=open_fake, n_ctx=1024, drafter="none") as solo:
        ref = [solo.generate(p, max_tokens=30, **k) for p in prompts for k in kw]
        ref_ngram = solo.generate(prompts[1], max_tokens=30, drafter="ngram")
    with api.load(open_model=open_fake, n_ctx=1024, parallel=2, drafter="none") as par:
        got, nexts = [], []
        for p in prompts:
            for k in kw:
                n0 = par.target.next_calls
                got.append(par.generate(p, max_tokens=30, **k))
                nexts.append(par.target.next_calls - n0)
        assert [g.token_ids for g in got] == [r.token_ids for r in ref]
        # alone, a greedy request's every step after its prompt's is one `decode_next`; a sampled one's never
        assert nexts[1::2] == [0, 0] and all(n >= len(g.token_ids) - 1 for n, g in zip(nexts[::2], got[::2], strict=True))
        assert all(g.stats.steps == len(g.token_ids) for g in got)  # one token a step: plain steps
        assert not planned or max(planned) == 0  # prompts' steps only: the planner never saw a generating slot
        asked = itertools.count()  # cancelled from the engine's sixth look at it on
        run = par.start(prompts[0], max_tokens=30, cancel=lambda: next(asked) >= 5)
        for _ in run.events():
            pass
        assert run.generation.stop_reason == "interrupted" and 0 < len(run.generation.token_ids) < 30
        assert run.generation.token_ids == ref[0].token_ids[: len(run.generation.token_ids)]
        # alone and greedy, its tokens came in bursts (`greedy_runs`); stopped mid-burst, the slot's cache holds what
        # a plain step's would: the prompt and the tokens handed on, the last pending
        job = run._gen
        assert isinstance(job, BatchJob) and 0 < par.target.runs_calls < sum(nexts[::2])
        assert par.target.seq_tokens[job.slot] == [*job.prompt, *run.generation.token_ids][:-1]
        decode = par.target.decode_many  # a decode that takes time, so that the requests overlap
        batches: list[int] = []
        planned.clear()
        monkeypatch.setattr(par.target, "decode_many",
                            lambda parts, *a: (batches.append(len(parts)), time.sleep(0.002), decode(parts, *a))[2])
        both = _concurrently(par, prompts, max_tokens=30)
        assert [g.token_ids for g in both] == [ref[0].token_ids, ref[2].token_ids]
        # two slots in one batch; the planner only where a step also read a prompt (one such step per request)
        assert max(batches) == 2 and sum(1 for n in planned if n) <= len(prompts)
        planned.clear()
        runs = [par.start(prompts[0], max_tokens=30), par.start(prompts[1], max_tokens=30, drafter="ngram")]
        threads = [threading.Thread(target=lambda r=r: [None for _ in r.events()]) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [r.generation.token_ids for r in runs] == [ref[0].token_ids, ref_ngram.token_ids]
        assert ref_ngram.token_ids == ref[2].token_ids and max(planned) >= 1  # the n-gram request's steps: planned


def test_greedy_requests_together_decode_their_steps_in_bursts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy requests that never draft (`serve --no-draft`), together: their plain steps in bursts, one call for
    many steps of all of them (`greedy_runs`, patch 0011), each text its solo run's; cancelled mid-burst, a slot's
    cache holds what a plain step's would; a request that arrives while others burst is admitted after the
    burst's step, not at its end (`knock`); without the call, the same texts a step at a time."""
    from tests.fakes import open_fake

    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    prompts = ["Name three rivers.", "Write a line about the sea.", "Count to five."]
    with api.load(open_model=open_fake, n_ctx=1024, drafter="none") as solo:
        ref = [solo.generate(p, max_tokens=n) for p, n in zip(prompts, (60, 200, 1), strict=True)]
    with api.load(open_model=open_fake, n_ctx=1024, parallel=3, drafter="none") as par:
        target = par.target
        sizes: list[int] = []
        runs, many, one = target.greedy_runs, target.decode_many, target.decode_next
        monkeypatch.setattr(target, "greedy_runs",  # the bursts' sizes, where the call was there
                            lambda seqs, *a: (got := runs(seqs, *a), got is None or sizes.append(len(seqs)))[0])
        # decodes that take time, so that the requests overlap
        monkeypatch.setattr(target, "decode_many", lambda parts, *a: (time.sleep(0.002), many(parts, *a))[1])
        monkeypatch.setattr(target, "decode_next", lambda seq, tok: (time.sleep(0.002), one(seq, tok))[1])
        got = _concurrently(par, prompts[:2], max_tokens=60)
        assert [g.token_ids for g in got] == [ref[0].token_ids, ref[1].token_ids[:60]]
        assert max(sizes) == 2 and len(sizes) < 60  # both sequences' steps, many a call
        asked = itertools.count()
        long = par.start(prompts[1], max_tokens=200)
        cut = par.start(prompts[0], max_tokens=60, cancel=lambda: next(asked) >= 8)
        readers = [threading.Thread(target=lambda r=r: [None for _ in r.events()]) for r in (long, cut)]
        for t in readers:
            t.start()
        deadline = time.monotonic() + 30
        while len(long.generation.token_ids) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        late = par.generate(prompts[2], max_tokens=1)  # arrives while the two burst
        done_then = len(long.generation.token_ids)
        for t in readers:
            t.join(60)
        assert late.token_ids == ref[2].token_ids and done_then < 200  # in before the burst would have ended
        assert long.generation.token_ids == ref[1].token_ids
        n_cut = len(cut.generation.token_ids)
        assert cut.generation.stop_reason == "interrupted" and 0 < n_cut < 60
        assert cut.generation.token_ids == ref[0].token_ids[:n_cut]
        job = cut._gen
        assert isinstance(job, BatchJob) and target.seq_tokens[job.slot] == [*job.prompt, *cut.generation.token_ids][:-1]
        target.runs_many = False  # a library without the call
        sizes.clear()
        again = _concurrently(par, prompts[:2], max_tokens=60)
        assert [g.token_ids for g in again] == [g.token_ids for g in got] and not sizes


def test_a_lone_job_given_no_draft_decodes_a_short_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafting job (the n-gram lookup here; auto alike) alone in the batch, on steps the planner gives no
    draft: a burst of at most `PLANNED_BURST` tokens (`greedy_runs`) instead of one, so that it looks again soon;
    the text is the target alone's, and the tokens count as plain steps for the planner (realized.py)."""
    from specdec_cli.engine.plain_loops import PLANNED_BURST
    from tests.fakes import open_fake

    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    prompt = "Name three rivers and say where each one flows."
    with api.load(open_model=open_fake, n_ctx=1024, drafter="none") as solo:
        ref = solo.generate(prompt, max_tokens=40)
    with api.load(open_model=open_fake, n_ctx=1024, parallel=2, drafter="ngram", pool_mb=0) as par:
        asked: list[int] = []
        run = par.target.greedy_runs
        monkeypatch.setattr(par.target, "greedy_runs",
                            lambda seqs, toks, caps, *a: (asked.append(max(caps)), run(seqs, toks, caps, *a))[1])
        got = par.generate(prompt, max_tokens=40)
        plain = par.batch_engine().planner.realized.plain.get(1)
    assert got.token_ids == ref.token_ids and got.stats.steps > len(asked)  # its steps: most of them in bursts
    assert asked and max(asked) == PLANNED_BURST and plain is not None and len(plain) > 0

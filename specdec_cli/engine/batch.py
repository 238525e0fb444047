"""Several generations at once: every active sequence in ONE target batch per step, drafting priced per step.

Continuous batching as llama-server does it, with speculation in the same batch. The
target and the draft each hold `n_slots` sequences (one KV stream each: see
`Model`), and a step is:

1. admit waiting jobs into free slots (the slot whose cache shares the longest
   prefix with the prompt, among those that keep the busy slots' sequence ids
   contiguous where one does);
2. plan: for every generating slot, how many tokens to draft and from where
   (the n-gram lookup, the draft model, or none), chosen together to maximise the
   expected tokens per second of the whole batch (`plan_step`);
3. draft: model drafts of all slots in batched rounds in the draft context (a
   draft cache catches up on at most `WINDOW` recent tokens: prompts are not
   prefilled into the draft, so that they do not delay the first token);
4. ONE target decode: each generating slot's [pending, drafts...], prompt chunks
   of admitted jobs under the per-step token budget, and filler tokens where they
   are cheaper than the extra pass an uneven batch costs (`ubatch_sizes`);
5. verify each slot exactly as a solo run does (`SpeculativeGenerator.verify`).

Why the layout matters: llama.cpp splits a multi-stream batch into micro-batches
that hold the same number of tokens for each of a run of consecutive sequence ids
(`llama_batch_allocr::split_equal`); every extra micro-batch is another pass over
the weights. `ubatch_sizes` reproduces that split, so the planner prices a plan
by the passes it will really cost, and fills a short or missing sequence with
tokens it then rolls back when that is cheaper.

Exactness: each sequence's cells sit in its own stream as in a solo run, and the
CPU kernels in exact mode are batch-invariant, so every slot's logits are
bit-identical to `specdec run`'s alone (tests/test_batch.py checks the output).
A seeded sampled job is decoded without drafts: drafting decisions here depend on
what else runs, and a seed must give the same text whatever runs beside it.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec_cli.engine.auto import AutoState
from specdec_cli.engine.config import AUTO, MODEL, NGRAM, NONE, GenerationConfig
from specdec_cli.engine.drafters import DraftRequest, DraftUnusable, NgramDrafter, Proposal, pick
from specdec_cli.engine.estimates import MIN_GAIN, BatchCosts, perfect_speedup
from specdec_cli.engine.events import DrafterDropped, Event, Prefill, Result
from specdec_cli.engine.gate import ShadowScore
from specdec_cli.engine.model import Model
from specdec_cli.engine.occupancy import Occupancy
from specdec_cli.engine.sampling import Dist
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.errors import ContextError, InternalError, SpecdecError

WINDOW = 64  # a draft cache that fell further behind than this re-reads only the last WINDOW tokens
FILLER_TOKEN_LIMIT = 64  # never pad a step by more tokens than this
EXPLORE, EXPLORE_RATE = 3, 0.95  # model steps verified before its measured acceptance decides; assumed till then
MIN_MARGINAL = 0.05  # the least a step's generation is priced at beside prompt chunks (single-token decodes)


# ---------------------------------------------------------------- layout
def ubatch_sizes(counts: Sequence[int], n_ubatch: int) -> list[int]:
    """The micro-batches llama.cpp makes of a multi-stream batch with counts[s] tokens of sequence s
    (ordered by sequence, as the engine builds it): llama_batch_allocr::split_equal(sequential=true)
    takes a run of consecutive sequence ids and the same number of tokens from each."""
    rem = list(counts)
    sizes: list[int] = []
    while any(rem):
        start = next(s for s, c in enumerate(rem) if c)
        run = [start]
        while run[-1] + 1 < len(rem) and rem[run[-1] + 1] and len(run) < n_ubatch:
            run.append(run[-1] + 1)
        n = max(1, min(min(rem[s] for s in run), n_ubatch // len(run)))
        for s in run:
            rem[s] -= n
        sizes.append(n * len(run))
    return sizes


def batch_cost(counts: Sequence[int], costs: BatchCosts, n_ubatch: int) -> float:
    """What decoding these counts costs, in single-token decodes: one pass per micro-batch."""
    return sum(costs.relative(b) for b in ubatch_sizes(counts, n_ubatch))


def filled(counts: Sequence[int], gen: Sequence[int]) -> list[int]:
    """`counts` with every sequence from the first to the last generating one raised to the largest
    generating count (a gap or a short proposal filled), so that they make one micro-batch."""
    if not gen:
        return list(counts)
    lo, hi = min(gen), max(gen)
    top = max(counts[s] for s in gen)
    out = list(counts)
    for s in range(lo, hi + 1):
        if s in gen or counts[s] == 0:
            out[s] = top
    return out


# ---------------------------------------------------------------- jobs
_END = object()


@dataclass(eq=False)
class BatchJob:
    """One generation submitted to the engine; iterate `events()` from any thread, then read `result`."""

    prompt: list[int]
    config: GenerationConfig
    kind: str  # AUTO, MODEL, NGRAM or NONE
    should_stop: Callable[[], bool] = lambda: False
    k_max: int = 8
    result: Result = field(init=False)
    n_cached: int = 0  # prompt tokens the slot's cache already held
    slot: int = -1
    _queue: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        self.result = Result(text="", token_ids=[], stop_reason="", n_prompt=len(self.prompt))

    def events(self) -> Iterator[Event]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


@dataclass(eq=False)
class Slot:
    seq: int
    job: BatchJob | None = None
    gen: SpeculativeGenerator | None = None
    context: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the target's cache (of the prompt[:-1] the prefill covers)
    draft_offset: int = 0  # the draft cache holds context[draft_offset:]
    index: int = 0  # the next step's index
    started: float = 0.0
    t_prefill: float = 0.0
    ngram: NgramDrafter = field(default_factory=NgramDrafter)
    shadow: ShadowScore = field(default_factory=ShadowScore)
    proposal: Proposal = field(default_factory=Proposal)  # what this step verifies
    lookup: Proposal = field(default_factory=Proposal)  # this step's n-gram proposal, at the slot's cap

    @property
    def generating(self) -> bool:
        return self.job is not None and self.prefilled >= len(self.job.prompt) - 1 and bool(self.context)


@dataclass(frozen=True)
class Choice:
    source: str  # NGRAM, MODEL or "plain"
    n: int  # tokens to draft
    expected: float  # tokens the slot is expected to emit


# ---------------------------------------------------------------- the engine
class BatchEngine:
    """Owns both models (opened with `n_seq` = slots) and a thread that steps every active job together."""

    def __init__(self, target: Model, draft: Model | None, state: AutoState, *, ngram: tuple[int, int] = (2, 4),
                 model_k_max: int | None = None, draft_costs: BatchCosts | None = None,
                 on_step: Callable[[int, int, int], None] | None = None) -> None:  # fmt: skip
        self.target = target
        self.draft = draft
        self.state = state
        self.ngram = ngram
        self.model_k_max = model_k_max
        self.draft_costs = draft_costs or BatchCosts()
        self.on_step = on_step  # (slots in the batch, tokens in the batch, drafted tokens): for /metrics
        self.draft_broken: str | None = None
        self.slots = [Slot(s, ngram=NgramDrafter(*ngram)) for s in range(target.n_seq)]
        self.budget = target.n_batch
        self._waiting: list[BatchJob] = []
        self._behind_now: dict[int, int] = {}  # this step: tokens each slot's draft cache must catch up
        self._left: dict[int, int] = {}  # this step: tokens each slot may still generate
        self._alone = False  # this step: one slot generates and no prompt waits
        self._horizon = math.inf  # this step: steps expected before the batch grows (catch-up is spread over them)
        self.occupancy = Occupancy()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="specdec-batch", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ public
    def submit(self, job: BatchJob) -> BatchJob:
        with self._cond:
            if self._closed:
                raise SpecdecError("this Speculator has been closed")
            self._waiting.append(job)
            self._cond.notify()
        return job

    def busy(self) -> list[bool]:
        """Which slots hold a job now."""
        return [s.job is not None for s in self.slots]

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    # ------------------------------------------------------------ loop
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not any(s.job for s in self.slots):
                    self._cond.wait()
                if self._closed:
                    break
                self._admit()
            try:
                self._step()
            except Exception as exc:  # a bug: fail every job in the batch, keep serving
                for slot in self.slots:
                    if slot.job is not None:
                        self._finish(slot, error=InternalError(f"internal error: {type(exc).__name__}: {exc}"))
        for slot in self.slots:
            if slot.job is not None:
                slot.job.result.stop_reason = "interrupted"
                self._finish(slot)
        for job in self._waiting:
            job._queue.put(_END)

    def _admit(self) -> None:
        """Waiting jobs into free slots, FIFO (called with the lock held)."""
        while self._waiting:
            free = [s for s in self.slots if s.job is None]
            if not free:
                return
            job = self._waiting.pop(0)
            if job.should_stop():
                job.result.stop_reason = "interrupted"
                job._queue.put(_END)
                continue
            self._start(job, self._choose_slot(job, free))

    def _choose_slot(self, job: BatchJob, free: list[Slot]) -> Slot:
        busy = [s.seq for s in self.slots if s.job is not None]

        def contiguous(slot: Slot) -> bool:
            seqs = sorted([*busy, slot.seq])
            return seqs[-1] - seqs[0] == len(seqs) - 1

        def reuse(slot: Slot) -> int:
            return self.target.common_prefix(job.prompt, slot.seq)

        # keeping busy ids contiguous saves a pass over the weights every step; among those, the longest prefix
        return max(free, key=lambda s: (contiguous(s), reuse(s), -s.seq))

    def _start(self, job: BatchJob, slot: Slot) -> None:
        try:
            job.config.validate()
            if len(job.prompt) == 0:
                raise ContextError("the prompt is empty after tokenization")
            if len(job.prompt) > self.target.n_ctx:
                raise ContextError(
                    f"the prompt is {len(job.prompt)} tokens but --ctx-size is {self.target.n_ctx}: "
                    "raise --ctx-size or shorten the prompt"
                )
            gen = SpeculativeGenerator(SeqView(self.target, slot.seq), None, job.prompt, job.config)
        except SpecdecError as exc:
            job._queue.put(exc)
            job._queue.put(_END)
            return
        slot.job, slot.gen, job.slot = job, gen, slot.seq
        job.result = gen.result  # the verifier writes the text, tokens and steps there
        keep = min(self.target.common_prefix(job.prompt, slot.seq), len(job.prompt) - 1)
        self.target.rollback(keep, slot.seq)
        job.n_cached = keep
        slot.prefilled = keep
        slot.context = []
        slot.index = 0
        slot.started = time.perf_counter()
        slot.t_prefill = 0.0
        slot.ngram.begin(job.prompt)
        slot.shadow.clear()
        slot.draft_offset = 0

    def _finish(self, slot: Slot, error: BaseException | None = None) -> None:
        job = slot.job
        assert job is not None
        job.result.wall_seconds = time.perf_counter() - slot.started
        if slot.gen is not None:
            slot.gen._decoder.reset()
        if error is not None:
            job._queue.put(error)
        job._queue.put(_END)
        slot.job, slot.gen = None, None

    # ------------------------------------------------------------ a step
    def _step(self) -> None:
        for slot in self.slots:
            if slot.job is not None and slot.job.should_stop():
                slot.job.result.stop_reason = "interrupted"
                self._finish(slot)
        gen = [s for s in self.slots if s.job is not None and s.generating]
        pre = [s for s in self.slots if s.job is not None and not s.generating]
        if not gen and not pre:
            return
        self.occupancy.observe(len(gen) + len(pre))
        t_step = time.perf_counter()
        choices = self._plan(gen, pre)
        t_draft = self._draft_rounds(gen, choices)
        t_sample = time.perf_counter() - t_step - t_draft
        # ---- the target batch
        counts = [0] * len(self.slots)
        parts: dict[int, tuple[list[int], int, int]] = {}  # seq: (tokens, logits rows, filler tail)
        for s in gen:
            toks = [s.context[-1], *s.proposal.tokens]
            parts[s.seq] = (toks, len(toks), 0)
            counts[s.seq] = len(toks)
        room = self.budget - sum(counts)
        prefill_done: list[Slot] = []
        for s in pre:  # prompt chunks, first admitted first, under the step's token budget
            assert s.job is not None
            prompt = s.job.prompt
            n = min(len(prompt) - s.prefilled, room)
            if n <= 0:
                continue
            chunk = prompt[s.prefilled : s.prefilled + n]
            last = s.prefilled + n == len(prompt)  # the chunk ends the prompt: its last row opens the output
            parts[s.seq] = (chunk, 1 if last else 0, 0)
            counts[s.seq] = n
            room -= n
            if last:
                prefill_done.append(s)
        fill = self._fillers(counts, [s.seq for s in gen], room)
        for seq, n in fill.items():  # fillers after a sequence's own tokens, without logits
            toks, n_logits, _ = parts.get(seq, ([], 0, 0))
            parts[seq] = (toks + [self._filler_token(seq)] * n, n_logits, n)
        ordered = sorted(parts)
        tt0 = self.target.decode_seconds
        rows = self.target.decode_many([(seq, *parts[seq]) for seq in ordered])
        t_target = self.target.decode_seconds - tt0
        by_seq = dict(zip(ordered, rows, strict=True))
        total = sum(len(parts[s][0]) for s in ordered)
        if len(ubatch_sizes([len(parts[s][0]) if s in parts else 0 for s in range(len(self.slots))],
                            self.target.n_batch)) == 1:  # fmt: skip
            self.state.costs.observe(total, t_target)
        for seq, n in fill.items():
            self.target.rollback(len(self.target.seq_tokens[seq]) - n, seq)
        if self.on_step is not None:
            self.on_step(len(ordered), total, sum(len(s.proposal.tokens) for s in gen))
        # ---- prompts that finished: their first token comes out of this very batch
        for s in pre:
            if s.seq not in parts:
                continue
            s.prefilled += len(parts[s.seq][0])
            s.t_prefill += t_target
            if s in prefill_done:  # its last prompt token was the pending one, as in a solo run
                assert s.job is not None and s.gen is not None
                s.job.result.prefill = Prefill(len(s.job.prompt), s.t_prefill, 0.0)
                s.job._queue.put(s.job.result.prefill)
                s.context = list(s.job.prompt)
                s.proposal = Proposal()
                gen.append(s)
        # ---- verify each generating slot as a solo run would
        for s in gen:
            assert s.job is not None and s.gen is not None
            try:
                step, n_acc = s.gen.verify(s.index, s.context, s.proposal, by_seq[s.seq],
                                           (t_step, t_draft, t_target, t_sample))  # fmt: skip
            except SpecdecError as exc:
                self._finish(s, error=exc)
                continue
            s.index += 1
            if s.proposal.source == MODEL and s.proposal.tokens:
                self.state.model.observe(len(s.proposal.tokens), n_acc)
            s.shadow.score(s.context)
            s.job._queue.put(step)
            if step.stop:
                s.job.result.stop_reason = step.stop
                self._finish(s)
            elif self.target.n_ctx - (len(s.context) - 1) <= 0:
                s.job.result.stop_reason = "context"
                self._finish(s)

    def _draft_unit(self) -> float | None:
        """c_d: a draft token's cost in single-token target decodes. Both measured live, or both from
        the calibration: this machine's speed drifts, and a calibrated draft time over a live target
        time would price the draft at another moment's speed."""
        st, dc = self.state, self.draft_costs
        t_live, d_live = st.costs.measured(1), dc.measured(1)
        t_cal, d_cal = st.costs.prior_one, dc.prior_one or st.draft_token_seconds
        if t_live and d_live:
            return d_live / t_live
        if t_cal and d_cal:
            return d_cal / t_cal
        d, t = d_live or d_cal, t_live or t_cal
        return d / t if d and t else None

    def _model_could_pay(self) -> bool:
        unit = self._draft_unit()
        if unit is None:
            return True  # not measured yet: the first drafts measure it
        return perfect_speedup(self.state.costs, self.model_k_max or 8, unit)[1] > 1.0

    @staticmethod
    def _cap_kind(job: BatchJob) -> int:
        return 0 if job.kind == NONE or job.config.reproducible else job.k_max

    def _filler_token(self, seq: int) -> int:
        held = self.target.seq_tokens[seq]
        return held[-1] if held else 0

    def _fillers(self, counts: list[int], gen: list[int], room: int) -> dict[int, int]:
        """Tokens to add (and roll back) per sequence when one micro-batch then costs less than the split."""
        if not gen:
            return {}
        n_ub = self.target.n_batch
        full = filled(counts, gen)
        extra = {s: full[s] - counts[s] for s in range(len(counts)) if full[s] > counts[s]}
        if not extra or sum(extra.values()) > min(room, FILLER_TOKEN_LIMIT):
            return {}
        for s in extra:  # a filler must fit in that sequence's context
            if len(self.target.seq_tokens[s]) + counts[s] + extra[s] > self.target.n_ctx:
                return {}
        costs = self.state.costs
        if batch_cost(full, costs, n_ub) < batch_cost(counts, costs, n_ub):
            return extra
        return {}

    # ------------------------------------------------------------ planning
    def _draft_usable(self) -> bool:
        return self.draft is not None and self.draft_broken is None

    def _cap(self, s: Slot) -> int:
        assert s.job is not None
        return max(0, min(self._cap_kind(s.job), self._tokens_left(s) - 1))

    def _plan(self, gen: list[Slot], pre: list[Slot]) -> dict[int, Choice]:
        """Each generating slot's draft: the plan with the most expected tokens per unit of time."""
        caps = {s.seq: self._cap(s) for s in gen}
        for s in gen:
            assert s.job is not None and s.gen is not None
            s.proposal = s.lookup = Proposal()
            if s.job.kind in (AUTO, NGRAM) and caps[s.seq]:
                req = DraftRequest(s.context, caps[s.seq], s.job.config.sampler, s.gen.rng, s.gen.eog)
                s.lookup = s.ngram.propose(req)  # free: every step, verified or not, for shadow scoring
                s.shadow.propose(len(s.context), s.lookup.tokens)
        if not gen or not any(caps.values()):
            return {}
        st = self.state
        one = st.costs.one
        if one is None:  # nothing prices a step until a single-token decode has been timed
            return {}
        pre_counts = [0] * len(self.slots)
        left = self.budget
        for s in pre:
            assert s.job is not None
            n = min(len(s.job.prompt) - s.prefilled, left)
            pre_counts[s.seq], left = max(n, 0), left - max(n, 0)
        unit = self._draft_unit()
        model_ok = self._draft_usable() and unit is not None and self._model_could_pay()
        self._behind_now = {s.seq: self._behind(s) for s in gen} if model_ok else {}
        self._left = {s.seq: self._tokens_left(s) for s in gen}
        self._alone = len(gen) == 1 and not pre
        # A prompt being read joins the generating slots within a step or two; else the measured rate
        self._horizon = 1.0 if pre else self.occupancy.steps_until_growth(len(gen))
        # The best plan in the steady state (every draft cache a token or two behind). A plan that
        # drafts with the model must then still win once its caches' one-time catch-up is priced:
        # a batch where the model does not pay even when caught up never pays for catching up.
        best: dict[bool, tuple[float, dict[int, Choice]]] = {False: (0.0, {}), True: (0.0, {})}
        # Without model drafts, plans longer than the longest n-gram proposal are the same plan again
        fixed = any(s.job is not None and s.job.kind == MODEL for s in gen)  # drafts whatever the plan
        longest = max(len(s.lookup.tokens) for s in gen)
        top = max(caps.values()) if model_ok or fixed else min(max(caps.values()), longest)
        if top == 0:
            return {}  # nothing to draft from: a plain step
        for m in range(1, top + 2):
            for use_model in ((False, True) if model_ok else (False,)):
                plan: dict[int, Choice] = {}
                for s in gen:
                    assert s.job is not None
                    plan[s.seq] = self._slot_choice(s, min(m - 1, caps[s.seq]), use_model)
                value = self._value(plan, pre_counts, unit, steady=True)
                if m == 1:
                    value *= MIN_GAIN  # drafting must beat plain batching by a margin
                key = any(c.source == MODEL for c in plan.values())
                if value > best[key][0]:
                    best[key] = (value, plan)
        (v_free, free), (v_model, with_model) = best[False], best[True]
        if with_model and v_model > v_free and self._value(with_model, pre_counts, unit) > v_free:
            return with_model
        return free

    def _slot_choice(self, s: Slot, n: int, use_model: bool) -> Choice:
        assert s.job is not None
        kind = s.job.kind
        model_cap = n if self.model_k_max is None else min(n, self.model_k_max)
        if kind == MODEL and self._draft_usable():  # a fixed draft length, whatever the plan
            k = self._cap(s) if self.model_k_max is None else min(self._cap(s), self.model_k_max)
            return Choice(MODEL, k, self.state.model.expected(k))
        best = Choice("plain", 0, 1.0)
        if n and s.lookup.tokens:
            j = min(n, len(s.lookup.tokens))
            best = Choice(NGRAM, j, s.shadow.acceptance.expected(j))
        if use_model and kind == AUTO and model_cap:
            e = self._model_expected(model_cap)
            if e > best.expected:
                best = Choice(MODEL, model_cap, e)
        return best

    def _model_expected(self, k: int) -> float:
        """E(k) for a model draft: its measured acceptance, or, before EXPLORE verified model steps and
        while a slot runs alone (trying it then delays no other request), an optimistic one, so that a
        draft that may pay gets tried and measured (it then decides)."""
        acc = self.state.model
        if acc.n >= EXPLORE or not self._alone:
            return acc.expected(k)
        return 1.0 + sum(EXPLORE_RATE ** (i + 1) for i in range(k))

    def _value(self, plan: dict[int, Choice], pre_counts: list[int], unit: float | None, steady: bool = False) -> float:
        """Expected tokens over cost (single-token target decodes) of the target batch and the draft rounds
        (`steady`: as if every draft cache were caught up but for a token or two)."""
        st = self.state
        counts = list(pre_counts)
        for seq, c in plan.items():
            counts[seq] = 1 + c.n
        n_ub = self.target.n_batch
        cost = batch_cost(counts, st.costs, n_ub)
        full = filled(counts, list(plan))
        if sum(full) - sum(counts) <= FILLER_TOKEN_LIMIT:
            cost = min(cost, batch_cost(full, st.costs, n_ub))
        if any(pre_counts):  # prompt chunks are paid whatever the plan: price what generation adds
            cost = max(cost - batch_cost(pre_counts, st.costs, n_ub), MIN_MARGINAL)
        drafting = {seq: c.n for seq, c in plan.items() if c.source == MODEL and c.n}
        if drafting and unit is not None:
            # Round 0 catches each draft cache up: a token or two after a model step, up to the window
            # after other steps. That longer catch-up is paid once and lets the steps after it draft, so
            # it is spread over the steps the request has left (at the draft's expected tokens a step),
            # or fewer: those expected before another request joins the batch (engine/occupancy.py).
            behind = {seq: self._behind_now.get(seq, 1) for seq in drafting}
            cost += self._round(sum(min(b, 2) for b in behind.values()), unit)
            for seq, b in behind.items():
                if b > 2 and not steady:
                    steps_left = max(1.0, min(self._left.get(seq, 1) / plan[seq].expected, self._horizon))
                    cost += (self._round(b, unit) - self._round(2, unit)) / steps_left
            for r in range(1, max(drafting.values())):
                cost += self._round(sum(1 for n in drafting.values() if n > r), unit)
        return sum(c.expected for c in plan.values()) / cost

    def _round(self, b: int, unit: float) -> float:
        """A draft round of b tokens in the target's units: as this engine measured rounds of b (seconds
        over the target's one-token time, as the target's own measured sizes are), else calibrated."""
        live, one = self.draft_costs.measured(b), self.state.costs.one
        return live / one if live is not None and one else unit * self.draft_costs.relative(b)

    def _tokens_left(self, s: Slot) -> int:
        assert s.job is not None
        room = self.target.n_ctx - (len(s.context) - 1)
        return max(1, min(room, s.job.config.max_tokens - len(s.job.result.token_ids)))

    def _catch_up(self, s: Slot) -> tuple[int, int]:
        """(the context offset the draft cache will follow, how much of context[offset:] it keeps): its
        next round decodes the rest. A cache more than the window behind re-reads only the window."""
        assert self.draft is not None
        offset = s.draft_offset
        window = min(WINDOW, self.draft.n_batch // len(self.slots))
        for _ in range(2):
            ctx = s.context[offset:]
            keep = min(self.draft.common_prefix(ctx, s.seq), len(ctx) - 1)
            if len(ctx) - keep <= window:
                break
            offset = len(s.context) - window
        return offset, keep

    def _behind(self, s: Slot) -> int:
        """Tokens the slot's draft cache must decode in its next round."""
        offset, keep = self._catch_up(s)
        return len(s.context) - offset - keep

    # ------------------------------------------------------------ drafting
    def _draft_rounds(self, gen: list[Slot], choices: dict[int, Choice]) -> float:
        """Fill each slot's `proposal`: n-gram tokens at once, model drafts in batched rounds. Returns
        seconds inside the draft's decode."""
        drafting: list[Slot] = []
        for s in gen:
            c = choices.get(s.seq)
            assert s.job is not None
            if c is None or c.n == 0:
                s.proposal = Proposal()
            elif c.source == NGRAM:
                s.proposal = dataclasses.replace(s.lookup.cut(c.n), k=c.n)
            else:
                drafting.append(s)
        if not drafting or self.draft is None:
            return 0.0
        draft = self.draft
        td0 = draft.decode_seconds
        want = {s.seq: choices[s.seq].n for s in drafting}
        toks: dict[int, list[int]] = {s.seq: [] for s in drafting}
        dists: dict[int, list[Dist]] = {s.seq: [] for s in drafting}
        feed: dict[int, list[int]] = {}
        reqs: dict[int, DraftRequest] = {}
        for s in drafting:  # round 0: catch each draft cache up with its context
            assert s.job is not None and s.gen is not None
            s.draft_offset, keep = self._catch_up(s)
            draft.rollback(keep, s.seq)
            feed[s.seq] = s.context[s.draft_offset + keep :]
            reqs[s.seq] = DraftRequest(s.context, want[s.seq], s.job.config.sampler, s.gen.rng, s.gen.eog)
        active = list(drafting)
        try:
            while active:
                seqs = sorted(s.seq for s in active)
                t0 = draft.decode_seconds
                rows = draft.decode_many([(seq, feed[seq], 1, 0) for seq in seqs])
                n_tok = sum(len(feed[seq]) for seq in seqs)
                self.draft_costs.observe(n_tok, draft.decode_seconds - t0)
                by = dict(zip(seqs, rows, strict=True))
                still: list[Slot] = []
                for s in active:
                    assert s.job is not None and s.gen is not None
                    picked = pick(draft, by[s.seq][0], reqs[s.seq], s.job.config.draft_p_min)
                    if picked is None:
                        continue
                    tok, q = picked
                    toks[s.seq].append(tok)
                    dists[s.seq].append(q)
                    if tok in s.gen.eog or len(toks[s.seq]) >= want[s.seq]:
                        continue
                    feed[s.seq] = [tok]
                    still.append(s)
                active = still
        except DraftUnusable as exc:
            self.draft_broken = str(exc)
            for s in drafting:
                assert s.job is not None
                rest = "the n-gram lookup goes on alone" if s.job.kind == AUTO else "speculation is off"
                s.job._queue.put(DrafterDropped(f"{exc}: {rest} for the rest of this run"))
                s.proposal = Proposal()
            return draft.decode_seconds - td0
        for s in drafting:
            s.proposal = Proposal(toks[s.seq], dists[s.seq], want[s.seq], MODEL)
        return draft.decode_seconds - td0


class SeqView:
    """One sequence of a multi-sequence `Model`, as the `LanguageModel` the verifier expects."""

    def __init__(self, model: Model, seq: int) -> None:
        self.model, self.seq = model, seq
        self.n_vocab, self.n_ctx = model.n_vocab, model.n_ctx

    @property
    def tokens(self) -> list[int]:
        return self.model.seq_tokens[self.seq]

    @property
    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    @property
    def decoded_tokens(self) -> int:
        return self.model.decoded_tokens

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.model.eog_ids

    def token_text(self, token: int) -> bytes:
        return self.model.token_text(token)

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        return self.model.decode(tokens, n_logits, seq=self.seq)

    def rollback(self, n_keep: int) -> None:
        self.model.rollback(n_keep, self.seq)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return self.model.common_prefix(tokens, self.seq)

    def prefill(self, tokens: Sequence[int]) -> None:
        self.model.prefill(tokens, self.seq)



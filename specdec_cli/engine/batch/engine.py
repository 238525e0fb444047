"""Several generations at once: every active sequence in ONE target batch per step, drafting priced per step.

Continuous batching as llama-server does it, with speculation in the same batch. The target and the draft
each hold `n_slots` sequences (one KV stream each: see `Model`), and a step is:

1. admit waiting jobs into free slots (the slot whose cache holds most of the prompt, else not the one
   whose job ended last, keeping the busy slots' ids contiguous where possible: admission.py; a kept state
   of a slot's cache restored where it holds more: prompt_cache.py); with fair slots, while a streamed
   job's prompt is read, jobs nobody reads token by token sit the step out (`taking_part`);
2. plan: for every generating slot, how many tokens to draft and from where (the n-gram lookup, the draft
   model, or none), chosen together to maximise the expected tokens per second of the whole batch, within
   the fair bound on the step's time (`Planner.plan`, engine/batch/plan.py);
3. draft: model drafts of all slots in batched rounds in the draft context (a draft cache catches up on at
   most `WINDOW` recent tokens: prompts are not prefilled into the draft, so they do not delay the first token);
4. ONE target decode: each generating slot's [pending, drafts...], prompt chunks of admitted jobs under the
   per-step token budget (fair: shortest first, a tenth of a second of them beside other requests), and
   filler tokens where they are cheaper than the extra pass an uneven batch costs (`ubatch_sizes`);
5. verify each slot exactly as a solo run does (`SpeculativeGenerator.verify`).

Why the layout matters: llama.cpp splits a multi-stream batch into micro-batches that hold the same number of
tokens for each of a run of consecutive sequence ids (`llama_batch_allocr::split_equal`); every extra micro-batch
is another pass over the weights. `ubatch_sizes` reproduces that split, so the planner prices a plan by the
passes it will really cost, and fills a short or missing sequence with tokens it rolls back when that is cheaper.

Exactness: each sequence's cells sit in its own stream as in a solo run, and the CPU kernels in exact mode
are batch-invariant, so every slot's logits are bit-identical to `specdec run`'s alone (tests/test_batch.py
checks the output). A seeded sampled job is decoded without drafts: drafting decisions here depend on what
else runs, and a seed must give the same text whatever runs beside it.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections.abc import Callable

from specdec_cli.engine.batch.admission import FAIR_STEP, choose_slot, prompt_chunks, set_aside, taking_part
from specdec_cli.engine.batch.drafting import draft_rounds
from specdec_cli.engine.batch.plain import PlainSteps
from specdec_cli.engine.batch.plan import Planner
from specdec_cli.engine.batch.pricing import ubatch_sizes
from specdec_cli.engine.batch.prompt_cache import PromptCache
from specdec_cli.engine.batch.slots import END, BatchJob, SeqView, Slot
from specdec_cli.engine.drafters import NO_DRAFT, NgramDrafter
from specdec_cli.engine.drafters.auto import AutoState
from specdec_cli.engine.drafters.gate import ShadowScore
from specdec_cli.engine.drafters.medusa import HeadsDrafter
from specdec_cli.engine.drafters.pool import TokenPool
from specdec_cli.engine.estimates import BatchCosts
from specdec_cli.engine.events import Prefill, Step
from specdec_cli.engine.heads import Heads
from specdec_cli.engine.plain_loops import PLANNED_BURST, QUIET_STEPS
from specdec_cli.engine.protocol import LoadedModel, Rows
from specdec_cli.engine.settings import MODEL, NONE
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.errors import InternalError, SpecdecError

__all__ = ["BatchEngine", "BatchJob", "SeqView"]

class BatchEngine(PlainSteps):
    """Owns both models (opened with `n_seq` = slots) and a thread that steps every active job together."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None, state: AutoState, *, ngram: tuple[int, int] = (2, 4),
                 model_k_max: int | None = None, draft_costs: BatchCosts | None = None, pool: TokenPool | None = None,
                 on_step: Callable[[int, int, int], None] | None = None, heads: Heads | None = None,
                 prompt_cache: PromptCache | None = None, burst_seconds: float = 0.0) -> None:  # fmt: skip
        self.target, self.prompt_cache = target, prompt_cache
        self.burst_seconds = burst_seconds  # a lone greedy slot's tokens decoded in bursts this long (`_plain_one`)
        self.draft = draft
        self.state = state
        self.ngram = ngram
        self.model_k_max = model_k_max
        self.on_step = on_step  # (slots in the batch, tokens in the batch, drafted tokens): for /metrics
        self.slots = [Slot(s, ngram=NgramDrafter(*ngram, pool=pool)) for s in range(target.n_seq)]
        self.heads = heads
        if heads is not None:  # each slot guesses from its own hidden state; what the guesses are worth is shared
            for slot in self.slots:
                slot.heads, slot.heads_shadow = HeadsDrafter(heads), ShadowScore(state.heads.tables)
        self.budget = target.n_batch
        self.planner = Planner(target, draft, state, draft_costs or BatchCosts(), n_slots=len(self.slots),
                               model_k_max=model_k_max, budget=self.budget)  # fmt: skip
        self.target_hidden = False  # the target returns hidden states (set per step)
        self._waiting: list[BatchJob] = []
        self.knock = ctypes.c_int32(0)  # a job arrived: a burst running ends after its step (PlainSteps._bursts)
        self._ended: set[int] = set()  # slots whose job ended since the engine last had nothing to step
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
            self.knock.value = 1
            self._cond.notify()
        return job

    def busy(self) -> list[bool]:
        """Which slots hold a job now."""
        return [s.job is not None for s in self.slots]

    def fail_all(self, error: BaseException) -> None:
        """End every job, running or waiting, with `error`: the engine's thread will not come back (an RPC
        server it waits on stopped answering, engine/rpc.py); this engine is not used again."""
        locked = self._cond.acquire(timeout=1.0)  # that thread may be stuck holding it
        try:
            self._closed = True
            jobs = [s.job for s in self.slots if s.job is not None] + self._waiting
            self._waiting = []
        finally:
            if locked:
                self._cond.release()
        for job in jobs:
            job.put(error)
            job.put(END)

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
                    if self._ended and self.prompt_cache is not None and self.prompt_cache.idle_keep:  # prompt_cache.py
                        self.prompt_cache.keep(self.target, self._ended.pop())
                        continue
                    self._cond.wait()
                if self._closed:
                    break
                self._admit()
            try:
                self._step()
            except Exception as exc:  # a bug: fail every job in the batch, keep serving
                for slot in self.slots:
                    if slot.job is not None:
                        self._finish(slot, error=InternalError.of(exc))
        for slot in self.slots:
            if slot.job is not None:
                slot.job.result.stop_reason = "interrupted"
                self._finish(slot)
        for job in self._waiting:
            job.put(END)

    def _admit(self) -> None:
        """Waiting jobs into free slots, FIFO (called with the lock held)."""
        while self._waiting:
            free = [s for s in self.slots if s.job is None]
            if not free:
                return
            job = self._waiting.pop(0)
            if job.should_stop():
                job.result.stop_reason = "interrupted"
                job.put(END)
                continue
            slot, aside = set_aside(self.target, self.slots, job, free, choose_slot(self.target, self.slots, job, free))
            if aside is not None:  # the conversation that ended last moves out of the busy slots' way
                self.target.move_seq(slot.seq, aside.seq)
                if self.draft is not None and self.planner.draft_broken is None:
                    self.draft.move_seq(slot.seq, aside.seq)
                aside.last_used, slot.last_used = slot.last_used, aside.last_used
                aside.last_streamed, slot.last_streamed = slot.last_streamed, aside.last_streamed
            self._start(job, slot)

    def set_fair(self, fair: bool) -> None:
        """Fair slots (on by default): while another slot generates or a prompt is read, drafts may lengthen a
        step to `FAIR_STEP` plain steps (or `FAIR_GAP` single decodes beside a stream), and a step that finishes
        a prompt takes only free drafts, and while a free slot holds a streamed conversation a step no stream
        takes part in lasts at most `BACKGROUND_SECONDS` (plan.py); while a streamed job's prompt is read, jobs
        that are not `interactive` sit the step out; a step reads a bounded time of prompt, shortest first, and
        a prompt that finishes in it is not held up by more than half by the others' chunks (admission.py). Off:
        the most tokens per second over all slots, every job in every step, the whole token budget of prompt per
        step, first admitted first."""
        self.planner.fair_step = FAIR_STEP if fair else None

    @property
    def fair(self) -> bool:
        return self.planner.fair_step is not None

    def _start(self, job: BatchJob, slot: Slot) -> None:
        try:
            gen = SpeculativeGenerator(SeqView(self.target, slot.seq), None, job.prompt, job.config)
        except SpecdecError as exc:
            job.put(exc)
            job.put(END)
            return
        slot.job, slot.gen, job.slot = job, gen, slot.seq
        job.result = gen.result  # the verifier writes the text, tokens and steps there
        cache, seq, prompt = self.prompt_cache, slot.seq, job.prompt  # what the slot, or a kept state, holds of it
        held = cache.take_over(self.target, seq, prompt) if cache is not None else self.target.common_prefix(prompt, seq)
        keep = min(held, len(prompt) - 1)
        self.target.rollback(keep, slot.seq)
        job.n_cached = keep
        slot.prefilled = keep
        slot.context = []
        slot.index = 0
        slot.started = time.perf_counter()
        slot.t_prefill = 0.0
        slot.ngram.begin(job.prompt)
        slot.shadow.clear()
        if slot.heads is not None and slot.heads_shadow is not None:
            slot.heads.begin(job.prompt)
            slot.heads_shadow.clear(keep=1.0)
        slot.draft_offset = 0
        slot.undrafted = 0

    def _finish(self, slot: Slot, error: BaseException | None = None) -> None:
        job = slot.job
        assert job is not None
        job.result.wall_seconds = time.perf_counter() - slot.started
        slot.last_used, slot.last_streamed = time.perf_counter(), job.config.interactive
        if slot.gen is not None:
            slot.gen._decoder.reset()
        if error is not None:
            job.put(error)
        job.put(END)
        slot.job, slot.gen = None, None
        self._ended.add(slot.seq)

    # ------------------------------------------------------------ a step
    def _step(self) -> None:
        for slot in self.slots:
            if slot.job is not None and slot.job.should_stop():
                slot.job.result.stop_reason = "interrupted"
                self._finish(slot)
        gen, pre = taking_part(self.slots, self.fair)
        if not gen and not pre:
            return
        self.planner.occupancy.observe(len(gen) + len(pre))
        if not pre and self.heads is None and all(s.job is not None and s.job.kind == NONE for s in gen):
            self._plain_step(gen)
            return
        self.planner.chatting = any(s.job is None and s.last_streamed for s in self.slots)
        t_step = time.perf_counter()
        n_gen, no_prompt = len(gen), not pre  # what the step is measured under (engine/batch/realized.py)
        choices = self.planner.plan(gen, pre)
        for s in gen:  # steps in a row its planner gave no draft (a regime where nothing pays: a short burst)
            s.undrafted = 0 if s.seq in choices and choices[s.seq].n else s.undrafted + 1
        if (no_prompt and n_gen == 1 and self.heads is None and gen[0].job is not None and gen[0].job.greedy
                and self.burst_seconds > 0 and gen[0].undrafted > QUIET_STEPS):  # fmt: skip
            self._plain_one(gen[0], cap=PLANNED_BURST, planned=True)
            return
        t_draft = draft_rounds(self.draft, self.planner, gen, choices)
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
        reading = min(room, self.planner.prompt_room(sum(counts), len(gen) + len(pre), pre))
        for s, n in prompt_chunks(pre, reading, sum(counts), self.fair):  # under the step's token budget
            assert s.job is not None
            prompt = s.job.prompt
            chunk = prompt[s.prefilled : s.prefilled + n]
            last = s.prefilled + n == len(prompt)  # the chunk ends the prompt: its last row opens the output
            parts[s.seq] = (chunk, 1 if last else 0, 0)
            counts[s.seq] = n
            room -= n
            if last:
                prefill_done.append(s)
        # hidden states for the heads: a step without prompt chunks only (with them on, every prompt token
        # would be an output); a slot without one this step drafts from its lookup next step
        hidden_on = self.heads is not None and not pre
        # No fillers while hidden states are on: with every row an output, a filler-only sequence between
        # generating ones changed a later sequence's greedy token (tests/test_medusa.py, fair slots' layouts)
        fill = {} if hidden_on else self._fill(parts, counts, gen, room)
        ordered = sorted(parts)
        if hidden_on != self.target_hidden:
            self.target.set_hidden(hidden_on)
            self.target_hidden = hidden_on
        tt0 = self.target.decode_seconds  # greedy slots get their rows' argmaxes (on a GPU, from llama.cpp's graph)
        greedy = () if self.heads is not None else {s.seq for s in gen + prefill_done if s.job and s.job.greedy}
        rows = self.target.decode_many([(seq, *parts[seq]) for seq in ordered], greedy)
        t_target = self.target.decode_seconds - tt0
        hidden, at = None, {}
        if hidden_on:
            at = dict(zip(ordered, itertools.accumulate((len(parts[q][0]) for q in ordered), initial=0), strict=False))
            hidden = self.target.hidden(sum(len(parts[q][0]) for q in ordered))
        by_seq = dict(zip(ordered, rows, strict=True))
        self._after_decode(parts, fill, t_target, sum(len(s.proposal.tokens) for s in gen))
        # ---- prompts that finished: their first token comes out of this very batch
        for s in pre:
            toks, _, tail = parts.get(s.seq, ([], 0, 0))
            if len(toks) == tail:  # no chunk this step (only fillers, rolled back: not its prompt)
                continue
            s.prefilled += len(toks) - tail
            s.t_prefill += t_target
            if s in prefill_done:  # its last prompt token was the pending one, as in a solo run
                assert s.job is not None and s.gen is not None
                s.job.result.prefill = Prefill(len(s.job.prompt), s.t_prefill, 0.0)
                s.job.put(s.job.result.prefill)
                s.context = list(s.job.prompt)
                s.proposal = NO_DRAFT
                gen.append(s)
        # ---- verify each generating slot as a solo run would
        emitted = 0
        for s in gen:
            verified = self._verify(s, by_seq[s.seq], (t_step, t_draft, t_target, t_sample))
            if verified is None:
                continue
            step, n_acc = verified
            emitted += len(step.emitted)
            if s.proposal.source == MODEL and s.proposal.tokens:
                self.state.model.observe(len(s.proposal.tokens), n_acc)
            if s.heads is not None and s.heads_shadow is not None:
                s.heads.observe(None if hidden is None else hidden[at[s.seq] + n_acc], len(s.context))
                s.heads_shadow.score(s.context)
        if no_prompt and n_gen:
            seconds = time.perf_counter() - t_step
            if self.planner.predicted is not None:
                self.planner.realized.drafting_step(n_gen, emitted, seconds, self.planner.predicted)
            elif not any(c.n for c in choices.values()):
                self.planner.realized.plain_step(n_gen, seconds)

    def _verify(self, s: Slot, rows: Rows, times: tuple[float, float, float, float]) -> tuple[Step, int] | None:
        """Verify slot `s`'s step as a solo run would, hand the step to its job and end the job where the step
        ended it: the step and the drafts accepted (None: the step failed, the job ended with its error)."""
        assert s.job is not None and s.gen is not None
        try:
            step, n_acc = s.gen.verify(s.index, s.context, s.proposal, rows, times)
        except SpecdecError as exc:
            self._finish(s, error=exc)
            return None
        s.index += 1
        s.shadow.score(s.context)
        s.job.put(step)
        if step.stop:
            s.job.result.stop_reason = step.stop
            self._finish(s)
        elif self.target.n_ctx - (len(s.context) - 1) <= 0:
            s.job.result.stop_reason = "context"
            self._finish(s)
        return step, n_acc

    def _fill(self, parts: dict[int, tuple[list[int], int, int]], counts: list[int], gen: list[Slot],
              room: int) -> dict[int, int]:  # fmt: skip
        """Filler tokens after sequences' own (their last token again, without logits) where one micro-batch then
        costs less than llama.cpp's split (`Planner.fillers`): added to `parts`, returned to be rolled back."""
        fill = self.planner.fillers(counts, [s.seq for s in gen], room)
        for seq, n in fill.items():
            toks, n_logits, _ = parts.get(seq, ([], 0, 0))
            parts[seq] = (toks + [(self.target.seq_tokens[seq] or [0])[-1]] * n, n_logits, n)
        return fill

    def _after_decode(self, parts: dict[int, tuple[list[int], int, int]], fill: dict[int, int], t_target: float,
                      drafted: int) -> None:  # fmt: skip
        """A one-pass batch's time into the cost table, the fillers rolled back, the batch to /metrics."""
        total = sum(len(p[0]) for p in parts.values())
        if len(parts) == 1 or len(ubatch_sizes([len(parts[s][0]) if s in parts else 0 for s in range(len(self.slots))],
                                               self.target.n_batch)) == 1:  # fmt: skip (one sequence: one pass)
            self.state.costs.observe(total, t_target)
        for seq, n in fill.items():
            self.target.rollback(len(self.target.seq_tokens[seq]) - n, seq)
        if self.on_step is not None:
            self.on_step(len(parts), total, drafted)

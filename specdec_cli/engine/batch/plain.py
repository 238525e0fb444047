"""The batch engine's steps without drafts (`PlainSteps`, a mixin of engine/batch/engine.py's `BatchEngine`): every
generating job runs `--no-draft` and no prompt is read. Their pending tokens in one batch; where they are greedy,
many such steps in one call into llama.cpp (`greedy_runs`, engine/greedy.py), as the solo loop's
`SpeculativeGenerator._bursts` decodes the target alone's tokens (docs/design.md#host-time)."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specdec_cli.engine.batch.pricing import ubatch_sizes
from specdec_cli.engine.batch.slots import Slot
from specdec_cli.engine.drafters import NO_DRAFT
from specdec_cli.engine.events import Step
from specdec_cli.engine.plain_loops import MAX_BURST, burst_times
from specdec_cli.engine.protocol import LoadedModel, Rows

if TYPE_CHECKING:
    from specdec_cli.engine.batch.plan import Planner
    from specdec_cli.engine.drafters.auto import AutoState

class PlainSteps:
    """`BatchEngine._plain_step` and what it takes (the engine's attributes and methods, typed here)."""

    slots: list[Slot]
    target: LoadedModel
    state: AutoState
    budget: int
    burst_seconds: float
    planner: Planner
    knock: ctypes.c_int32  # set where a job waits for a free slot: a burst ends after its step (`_bursts`)
    _waiting: list[Any]
    on_step: Callable[[int, int, int], None] | None

    if TYPE_CHECKING:  # the engine's

        def _fill(self, parts: dict[int, tuple[list[int], int, int]], counts: list[int], gen: list[Slot],
                  room: int) -> dict[int, int]: ...  # fmt: skip

        def _after_decode(self, parts: dict[int, tuple[list[int], int, int]], fill: dict[int, int], t_target: float,
                          drafted: int) -> None: ...  # fmt: skip

        def _verify(self, s: Slot, rows: Rows, times: tuple[float, float, float, float]) -> tuple[Step, int] | None: ...

        def _finish(self, slot: Slot, error: BaseException | None = None) -> None: ...

    def _plain_step(self, gen: list[Slot]) -> None:
        """Every generating slot's job never drafts (`--no-draft`), no prompt to read: each slot's pending token
        in one batch (fillers where they make it one pass), verified as a solo run's plain step, without the
        planner's drafting plans or their records. With one request at a time this is a solo run's step:
        where the engine's own time per step shows most (docs/design.md#host-time)."""
        if len(gen) == 1 and gen[0].job is not None and gen[0].job.greedy:
            self._plain_one(gen[0])
            return
        if self.burst_seconds > 0 and all(s.job is not None and s.job.greedy for s in gen) and self._bursts(gen):
            return
        t_step = time.perf_counter()
        counts = [0] * len(self.slots)
        parts: dict[int, tuple[list[int], int, int]] = {}
        for s in gen:
            s.proposal = NO_DRAFT
            parts[s.seq], counts[s.seq] = ([s.context[-1]], 1, 0), 1
        fill = self._fill(parts, counts, gen, self.budget - len(gen)) if len(gen) > 1 else {}
        ordered = sorted(parts)
        greedy = {s.seq for s in gen if s.job is not None and s.job.greedy}
        tt0 = self.target.decode_seconds
        rows = self.target.decode_many([(seq, *parts[seq]) for seq in ordered], greedy)
        t_target = self.target.decode_seconds - tt0
        by_seq = dict(zip(ordered, rows, strict=True))
        self._after_decode(parts, fill, t_target, 0)
        for s in gen:
            self._verify(s, by_seq[s.seq], (t_step, 0.0, t_target, 0.0))

    def _plain_one(self, s: Slot, cap: int = MAX_BURST, planned: bool = False) -> None:
        """`_plain_step` for one greedy slot: a burst of its tokens (`_bursts`, at most `cap`) where `burst_seconds`
        and its job allow more than one; else, or where the library lacks the call or the burst's first step
        failed, one token, its decode and argmax in one call (`decode_next`), verified as a step. `planned`: a
        drafting job the planner gave no draft this step (engine/plain_loops.py's `PLANNED_BURST`), its tokens recorded as plain steps."""
        target, job = self.target, s.job
        assert job is not None
        if (self.burst_seconds > 0 and cap > 1 and job.config.max_tokens - len(job.result.token_ids) > 1
                and self._bursts([s], cap, planned)):  # fmt: skip
            return
        t0, tt0 = time.perf_counter(), target.decode_seconds
        s.proposal = NO_DRAFT
        top = target.decode_next(s.seq, s.context[-1])
        t = (t0, 0.0, target.decode_seconds - tt0, 0.0)
        self.state.costs.observe(1, t[2])
        if self.on_step is not None:
            self.on_step(1, 1, 0)
        self._verify(s, top, t)
        if planned:  # a plain step's time, what the planner prices drafting steps against (realized.py)
            self.planner.realized.plain_step(1, time.perf_counter() - t0)

    def _bursts(self, gen: list[Slot], cap: int = MAX_BURST, planned: bool = False) -> bool:
        """Greedy slots' plain steps for up to `burst_seconds` of decoding in one call into llama.cpp
        (`greedy_runs`, patch 0011), each step's tokens verified as `_plain_step`'s would be, at most `cap` steps
        and none past a job's `max_tokens`; the burst also ends after the step in which a job's token ends it,
        and after the step during which a job arrived for a free slot (`knock`, set by `submit`). A job ended or
        stopped mid-burst keeps the tokens handed on, the rest is rolled back. False where nothing was done (the
        library lacks the call, one pass would need fillers, or the first step failed): the caller's usual step,
        which meets a failure as it would have. `planned`: as `_plain_one`'s."""
        target, seqs = self.target, [s.seq for s in gen]
        counts = [0] * len(self.slots)
        for seq in seqs:
            counts[seq] = 1
        if len(gen) > 1 and self.planner.fillers(counts, seqs, self.budget - len(gen)):
            return False
        jobs = [s.job for s in gen if s.job is not None]
        if len(jobs) < len(gen):
            return False
        caps = [max(1, min(cap, j.config.max_tokens - len(j.result.token_ids))) for j in jobs]
        one_pass = len(gen) == 1 or len(ubatch_sizes(counts, self.target.n_batch)) == 1
        self.knock.value = int(bool(self._waiting) and any(s.job is None for s in self.slots))
        t0, tt0 = time.perf_counter(), target.decode_seconds
        got = target.greedy_runs(seqs, [s.context[-1] for s in gen], caps, target.eog_ids, self.burst_seconds,
                                 self.knock)  # fmt: skip
        if got is None or not got[0][0]:
            return False
        outs, n = got[0], len(got[0][0])
        times = burst_times(t0, target.decode_seconds - tt0, n)
        for i in range(n):
            t = times()
            if one_pass:  # as `_after_decode` records a plain step's batch
                self.state.costs.observe(len(gen), t[2])
            if self.on_step is not None:
                self.on_step(len(gen), len(gen), 0)
            for s, out, job in zip(gen, outs, jobs, strict=True):
                if s.job is None:  # ended earlier in the burst
                    continue
                s.proposal = NO_DRAFT
                self._verify(s, [out[i]], t)
                if planned:
                    self.planner.realized.plain_step(1, time.perf_counter() - t[0])
                if s.job is not None and i + 1 < n and job.should_stop():
                    job.result.stop_reason = "interrupted"
                    self._finish(s)
        for s in gen:  # decoded past what its job kept
            if len(target.seq_tokens[s.seq]) > len(s.context) - 1:
                target.rollback(len(s.context) - 1, s.seq)
        return True

"""The batch engine's steps without drafts (`PlainSteps`, a mixin of engine/batch/engine.py's `BatchEngine`): every
generating job runs `--no-draft` and no prompt is read. Several slots: their pending tokens in one batch. One greedy
slot, the server's single stream: a burst of its tokens in one call into llama.cpp (`greedy_run`, engine/greedy.py),
as the solo loop's `SpeculativeGenerator._bursts` decodes them (docs/design.md#host-time)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from specdec_cli.engine.batch.slots import Slot
from specdec_cli.engine.drafters import NO_DRAFT
from specdec_cli.engine.events import Step
from specdec_cli.engine.protocol import LoadedModel, Rows
from specdec_cli.engine.speculative import MAX_BURST, burst_times

if TYPE_CHECKING:
    from specdec_cli.engine.batch.plan import Planner
    from specdec_cli.engine.drafters.auto import AutoState

# A lone greedy job that may draft, given no draft for more than QUIET_STEPS steps in a row (auto where nothing
# pays): a burst of at most PLANNED_BURST tokens, so that the planner looks again soon (a repeat the lookup would
# draft from may start at any token). Where drafts pay now and then, bursts on every undrafted step lost more
# drafting than they saved (docs/design.md#host-time).
PLANNED_BURST = 4
QUIET_STEPS = 8


class PlainSteps:
    """`BatchEngine._plain_step` and what it takes (the engine's attributes and methods, typed here)."""

    slots: list[Slot]
    target: LoadedModel
    state: AutoState
    budget: int
    burst_seconds: float
    planner: Planner
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
        """`_plain_step` for one greedy slot: its tokens for up to `burst_seconds` of decoding in one call (`greedy_run`,
        as the solo loop's `_bursts`), at most `cap`, each verified as a step; a job ended or stopped mid-burst keeps
        the tokens handed on, the rest is rolled back; waiting jobs are admitted after the burst. `planned`: a
        drafting job the planner gave no draft this step (`PLANNED_BURST`), its tokens recorded as plain steps."""
        t0 = time.perf_counter()
        s.proposal = NO_DRAFT
        target, job = self.target, s.job
        assert job is not None
        k = max(1, min(cap, job.config.max_tokens - len(job.result.token_ids))) if self.burst_seconds > 0 else 1
        tt0 = target.decode_seconds
        tokens, ok = target.greedy_run(s.seq, s.context[-1], k, target.eog_ids, self.burst_seconds)
        times = burst_times(t0, target.decode_seconds - tt0, len(tokens) + (not ok))
        for i, token in enumerate([*tokens, None] if not ok else tokens):  # None: the row that was not finite
            t = times()
            self.state.costs.observe(1, t[2])
            if self.on_step is not None:
                self.on_step(1, 1, 0)
            self._verify(s, None if token is None else [token], t)
            if planned:  # a plain step's time, what the planner prices drafting steps against (realized.py)
                self.planner.realized.plain_step(1, time.perf_counter() - t[0])
            if s.job is not None and i + 1 < len(tokens) and job.should_stop():
                job.result.stop_reason = "interrupted"
                self._finish(s)
            if s.job is None:
                break
        if len(target.seq_tokens[s.seq]) > len(s.context) - 1:  # decoded past what its job kept
            target.rollback(len(s.context) - 1, s.seq)

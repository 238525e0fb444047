"""The generation loop's plain ways, a mixin of engine/speculative.py's `SpeculativeGenerator` (`PlainLoops`): the
target alone, greedy, in bursts of tokens decoded in one call into llama.cpp (`_bursts`) or with each decode
queued ahead on a device (`_ahead`), and a drafting loop's short bursts where its drafter has proposed nothing for
a while (`_burst`). Each keeps `_run`'s tokens, steps and stops (tests/test_greedy.py compares them);
docs/design.md#host-time says why."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from specdec_cli.engine.drafters import NO_DRAFT, Drafter, Outcome, Proposal
from specdec_cli.engine.events import Event, Step, Transcript
from specdec_cli.engine.protocol import LanguageModel
from specdec_cli.engine.settings import GenerateOptions

# A drafting generation whose drafter has proposed nothing for more than QUIET_STEPS steps in a row (auto or the
# n-gram lookup where nothing pays): its next plain step decodes a burst of at most PLANNED_BURST tokens instead
# of one, so that the drafter looks again soon (a repeat the lookup would draft from may start at any token).
# Where drafts pay now and then, bursts on every undrafted step lost more drafting than they saved. The batch
# engine's lone drafting job follows the same rule (engine/batch/plain.py).
PLANNED_BURST = 4
QUIET_STEPS = 8
MAX_BURST = 256  # the most tokens of one burst (`SpeculativeGenerator._bursts`): its time bounds it first


def burst_times(t_start: float, t_decode: float, n: int) -> Callable[[], tuple[float, float, float, float]]:
    """The times of a burst's steps, one call each (`verify`'s `times`): each step its share of the burst's
    decode seconds and of its wall time besides (its start set back by its share of the burst's wall), so that
    the steps' times add up to the burst's."""
    share, wall = t_decode / max(1, n), (time.perf_counter() - t_start) / max(1, n)
    return lambda: (time.perf_counter() - wall, 0.0, share, 0.0)


class PlainLoops:
    """`SpeculativeGenerator`'s plain loops (the generator's attributes and methods, typed here)."""

    config: GenerateOptions
    target: LanguageModel
    result: Transcript
    eog: frozenset[int]
    burst_seconds: float
    drafter: Drafter | None

    if TYPE_CHECKING:  # the generator's

        def _stop_asked(self) -> bool: ...

        def _plain(self, index: int, context: list[int], proposal: Proposal, token: int,
                   times: tuple[float, float, float, float]) -> Step: ...  # fmt: skip

        def verify(self, index: int, context: list[int], proposal: Proposal, rows: Any,
                   times: tuple[float, float, float, float]) -> tuple[Step, int]: ...  # fmt: skip

    def _bursts(self, context: list[int]) -> Iterator[Event]:
        """`_run`'s loop for the target alone, greedy, where the model decodes a run of greedy tokens in one call
        (`greedy_run`, engine/greedy.py: no Python between its decodes): the first token alone (the time to the
        first token is the prompt's), then bursts of up to `burst_seconds` of decoding (`_burst`). The same
        tokens, steps and stops as `_run`'s (tests/test_greedy.py)."""
        cfg, target, res = self.config, self.target, self.result
        index = -1
        while True:
            if self._stop_asked():
                return
            t0 = time.perf_counter()
            room = target.n_ctx - (len(context) - 1)
            if room <= 0:
                res.stop_reason = "context"
                return
            k = 1 if index < 0 else max(1, min(MAX_BURST, room, cfg.max_tokens - len(res.token_ids)))
            index, ended = yield from self._burst(index + 1, context, k, NO_DRAFT, (t0, 0.0, 0.0, 0.0))
            if ended:
                return

    def _ahead(self, context: list[int]) -> Iterator[Event]:
        """`_run`'s loop for the target alone, greedy, where its decodes run on a device (`Model.decodes_ahead`):
        each step's decode is queued (`start_next`) before the last step's token is verified, emitted and handed
        to the reader, so that the host's part of a step, the reader's included, runs while the device computes.
        The same tokens, steps and stops as `_run`'s (tests/test_greedy.py): a decode is queued only where `_run`
        would make it next (not after an end token, the last token `max_tokens` allows, or in a full context),
        and one queued when the generation ends anyway (a stop asked for while the reader had the last step,
        or the reader gone) is rolled back."""
        cfg, target, res = self.config, self.target, self.result
        model: Any = target  # the calls `decodes_ahead` promises
        index = -1
        tt0 = target.decode_seconds
        model.start_next(context[-1])
        try:
            while True:
                index += 1
                if self._stop_asked():
                    return
                t_step = time.perf_counter()
                top = model.finish_next()
                t_target, tt0 = target.decode_seconds - tt0, target.decode_seconds
                if (top is not None and top[0] not in self.eog and len(res.token_ids) + 1 < cfg.max_tokens
                        and len(context) < target.n_ctx):  # fmt: skip
                    model.start_next(top[0])  # the next step's decode, queued before this step's token goes out
                step, _ = self.verify(index, context, NO_DRAFT, top, (t_step, 0.0, t_target, 0.0))
                yield step
                if step.stop:
                    res.stop_reason = step.stop
                    return
                if not model.decoding_ahead:  # the context is full: `_run` stops here too
                    res.stop_reason = "context"
                    return
        finally:
            model.cancel_next()

    def _burst(self, index: int, context: list[int], k: int, proposal: Proposal,
               times: tuple[float, float, float, float]) -> Generator[Event, None, tuple[int, bool]]:  # fmt: skip
        """At most `k` greedy tokens in one call into llama.cpp (`greedy_run`), from step `index` on, each handed
        on as a Step of its own (and, where there is a drafter, told to it as a plain step's outcome), the first
        with the step's `proposal` and the drafting `times` it began with. Returns the last step's index and
        whether the generation ended: a stop, or a stop asked for mid-burst, which ends it at the token the
        reader had; what was decoded past that is rolled back. `_bursts`' and a quiet drafter's steps (`_run`:
        its drafter proposed nothing for more than QUIET_STEPS steps in a row, PLANNED_BURST tokens a burst)."""
        target, res = self.target, self.result
        model: Any = target  # the call `_run` checked for
        t_step, t_draft, _, t_sample = times
        t0, tt0 = time.perf_counter(), target.decode_seconds
        tokens, ok = model.greedy_run(0, context[-1], k, self.eog, self.burst_seconds)
        share = burst_times(t0, target.decode_seconds - tt0, len(tokens) + (not ok))
        past, told = True, proposal  # past: the cache holds tokens decoded past those handed on
        try:
            for i, token in enumerate(tokens):
                t = share()
                if i == 0:  # the step that began before the call: its drafting and sampling time too
                    t = (t[0] - (t0 - t_step), t_draft, t[2], t_sample)
                step = self._plain(index, context, told, token, t)
                if self.drafter is not None:
                    self.drafter.accept(Outcome(context, told, 0, t[2], None))
                told = NO_DRAFT
                yield step
                if step.stop:
                    res.stop_reason = step.stop
                    return index, True
                if i + 1 < len(tokens) and self._stop_asked():
                    return index, True
                index += 1 if i + 1 < len(tokens) else 0
            past = False
            if not ok:  # the decode after them gave no finite row: `verify` raises as `_run`'s would
                self.verify(index + (1 if tokens else 0), context, NO_DRAFT, None, share())
            return index, False
        finally:
            if past:
                target.rollback(len(context) - 1)

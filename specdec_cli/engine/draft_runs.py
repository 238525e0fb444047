"""A draft model's greedy steps in runs: several speculative steps in one call into llama.cpp (patch 0012's
`llama_specdec_spec_run`), with no Python between them.

A greedy step with a draft model is a handful of calls: the draft's catch-up and its K tokens (one call,
`argmax_chain`), the target's verification batch (one call, `decode_argmax`), then the comparison, the two
caches' bookkeeping, the tokens emitted and the step recorded. Each of those calls finds Python's own data out
of the caches the decode has just swept, and a step's Python cost more than its C (docs/design.md#host-time).
In a run, the C loop makes the steps as engine/speculative.py's loop would (the same k, the same drafts, the same
verification, the same adaptive length), and the Python side hands them on afterwards, one after another in warm
caches: `DraftRuns`, a mixin of `SpeculativeGenerator`, as `PlainLoops`' bursts are for the target alone.

Where: greedy, a draft model that drafts greedily (`ModelDrafter`, alone or under `AdaptiveLength`), both
models llama.cpp's with the call, hidden states off, `burst_seconds` > 0 (the run's bound, `--burst-ms`), and
after the generation's first step (the first token comes alone). A run ends before a step it cannot make as the
loop would (a catch-up of more than two tokens, a full context, a token the draft cannot read, a failed decode):
the loop makes that step, and meets the failure as it would have. tests/test_draft_runs.py compares the two.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from specdec_cli.engine.drafters import Drafter, ModelDrafter, Proposal
from specdec_cli.engine.drafters.policies import AdaptiveLength
from specdec_cli.engine.events import Event, Step, Transcript
from specdec_cli.engine.kernels import GPU
from specdec_cli.engine.native_greedy import NativeSpec
from specdec_cli.engine.protocol import LanguageModel
from specdec_cli.engine.settings import MODEL, GenerateOptions

MAX_STEPS = 64  # the most steps of one run: its time (`burst_seconds`) bounds it first


class RunStep(NamedTuple):
    """One step of a run: the length asked for, the drafts, how many were accepted, the target's token after them,
    and the seconds (the draft's llama_decode, the target's, the step's in all)."""

    k: int
    drafted: list[int]
    n_accepted: int
    token: int
    t_draft: float
    t_target: float
    wall: float


def _inner(drafter: Drafter | None) -> tuple[ModelDrafter, AdaptiveLength | None] | None:
    """The draft model's drafter and its adaptive length, where a run makes its steps as the loop would."""
    adaptive = drafter if type(drafter) is AdaptiveLength else None
    inner = adaptive.inner if adaptive is not None else drafter
    if type(inner) is not ModelDrafter or inner.p_min > 0.0 or inner.window is not None:
        return None
    return inner, adaptive


def runner(target: Any, drafter: Drafter | None, config: GenerateOptions, stop: frozenset[int],
           seconds: float) -> StepRunner | None:  # fmt: skip
    """A generation's `StepRunner`: where both models have the call and the drafter drafts as a run does."""
    found = _inner(drafter)
    if found is None:
        return None
    g, d = getattr(target, "_native", None), getattr(found[0].model, "_native", None)
    if g is None or d is None or g.spec_fn is None or d.spec_fn is None:
        return None
    return StepRunner(target, found[0], found[1], config, stop, seconds)


class StepRunner:
    """Runs of a generation's steps (`run`) through the models' `NativeSpec`, made once for the generation."""

    def __init__(self, target: Any, inner: ModelDrafter, adaptive: AdaptiveLength | None, config: GenerateOptions,
                 stop: frozenset[int], seconds: float) -> None:  # fmt: skip
        self.target, self.inner, self.adaptive = target, inner, adaptive
        draft: Any = inner.model
        self.draft = draft
        # patch 0008's switch, set to each model's kernels before its decodes (as `_switch_kernels` would)
        owner = target if target._cuda_switch is not None else draft  # a model without it leaves it as it is
        switch, t_kernels = owner._cuda_switch, owner.kernels == GPU
        self._spec = NativeSpec(target._native, target._batch, draft._native, draft._batch, stop, seconds, switch,
                                k_max=config.k_max, k_lo=adaptive.lo if adaptive is not None else 0,
                                k_hi=adaptive.hi if adaptive is not None else 0, adaptive=adaptive is not None,
                                max_steps=MAX_STEPS, t_ctx=target.n_ctx, d_ctx=draft.n_ctx, t_kernels=t_kernels,
                                d_kernels=draft.kernels == GPU if draft._cuda_switch is not None else t_kernels)  # fmt: skip
        self._after = (-1, -1)  # (the context's length, the draft's tokens) after the last run: its next catch-up

    def _fresh(self, context: list[int]) -> Sequence[int] | None:
        """The draft's catch-up (`ModelDrafter._fresh`'s), known without its common prefix right after a run."""
        held = len(self.draft.seq_tokens[0])
        if self._after == (len(context), held):
            return context[held:]
        return self.inner._fresh(context)

    def run(self, context: list[int], left: int) -> list[RunStep] | None:
        """Greedy speculative steps after `context` in one call, at most `left` tokens kept: the steps (none where
        the first could not be made: the loop makes it, and meets a failed decode there). The models' caches and
        counters are left as the loop's steps would leave them (their tokens past the run's last step too: the
        caller rolls them back where it hands on fewer steps). None where no run can start here: a model whose
        rollbacks are not proven yet (a recurrent one cannot roll back: the loop's first rollback says so), hidden
        states, a catch-up of more than two tokens."""
        target, draft, io = self.target, self.draft, self._spec.io
        if target.hidden_on or draft.hidden_on or not (target._defer_rollback and draft._defer_rollback):
            return None
        t_held = len(context) - 1
        if len(target.seq_tokens[0]) != t_held:
            return None
        fresh = self._fresh(context)
        if fresh is None or len(fresh) > 2:
            return None
        target._context(settle=False)  # a closed model raises here
        draft._context(settle=False)
        d_held = t_held + 1 - len(fresh)
        io.t_held, io.pending, io.d_held, io.n_fresh, io.before = t_held, context[-1], d_held, len(fresh), fresh[0]
        io.k, io.max_tokens = self.adaptive.k if self.adaptive is not None else io.k_max, left
        io.t_sampled, io.d_sampled = target._sampled(), draft._sampled()
        t0, d0 = target._native.decode_seconds, draft._native.decode_seconds
        steps, out, secs = self._spec.run()
        target.decode_seconds += target._native.decode_seconds - t0
        draft.decode_seconds += draft._native.decode_seconds - d0
        for m in (target, draft):
            m._stale = True  # cells past its tokens: rejected drafts, a failed step's, removed by the next call
            m.pending_moves.clear()
            if m._argmax is not None:
                m._argmax.decoded()
        if not steps:
            return []
        run, new, at, n_fresh, d_new = [], [], 0, len(fresh), 0
        for i in range(0, len(steps), 3):
            k, n_d, n_acc = steps[i : i + 3]
            token = out[at + n_d]
            run.append(RunStep(k, out[at : at + n_d], n_acc, token, secs[i], secs[i + 1], secs[i + 2]))
            new += out[at : at + n_acc]
            new.append(token)
            d_new += n_fresh + n_d - 1  # its catch-up, and every draft but the last
            n_fresh = 2 if n_acc == n_d else 1
            at += n_d + 1
        target.decoded_tokens += len(out)  # each step's [pending, drafts]: as many as its drafts and token
        draft.decoded_tokens += d_new
        target._logits_seen = draft._logits_seen = True
        target.seq_tokens[0].append(context[-1])  # the pending token, then the kept ones the target decoded
        target.seq_tokens[0].extend(new[: io.t_held - t_held - 1])
        draft.seq_tokens[0].extend([*fresh, *new][: io.d_held - d_held])
        self._after = (len(context) + len(new), io.d_held)
        if self.adaptive is not None:
            self.adaptive.k, self.adaptive._asked = io.k, run[-1].k
        return run


class DraftRuns:
    """`SpeculativeGenerator`'s runs of draft-model steps (the generator's attributes and methods, typed here)."""

    config: GenerateOptions
    target: LanguageModel
    result: Transcript

    if TYPE_CHECKING:  # the generator's

        def _stop_asked(self) -> bool: ...

        def _keep(self, index: int, context: list[int], proposal: Proposal, n_acc: int, token: int,
                  times: tuple[float, float, float, float]) -> Step: ...  # fmt: skip

    def _draft_run(self, runner: StepRunner, index: int, context: list[int],
                   t_step: float) -> Generator[Event, None, tuple[int, bool, bool]]:  # fmt: skip
        """The steps from `index` on in one run (`StepRunner.run`), each handed on as the loop's `verify` would have
        (a Step each, with its share of the run's time; its C outside llama_decode as sampling time). Returns the
        last step's index, whether any step was made (none: the loop makes this one), and whether the generation
        ended: a stop, or a stop asked for mid-run, which ends it at the step the reader had (the target's cache
        past it rolled back; the draft's catches up through its common prefix, as after any step)."""
        res = self.result
        t0 = time.perf_counter()
        run = runner.run(context, self.config.max_tokens - len(res.token_ids))
        if not run:
            return index, False, False
        extra = (time.perf_counter() - t0 - sum(s.wall for s in run)) / len(run)  # the call's and ours, shared
        past = True  # the target's cache holds steps past those handed on
        try:
            for i, s in enumerate(run):
                wall = s.wall + extra + (t0 - t_step if i == 0 else 0.0)
                times = (time.perf_counter() - wall, s.t_draft, s.t_target, s.wall - s.t_draft - s.t_target)
                step = self._keep(index, context, Proposal(s.drafted, [], s.k, MODEL), s.n_accepted, s.token, times)
                yield step
                if step.stop:
                    res.stop_reason = step.stop
                    return index, True, True
                if i + 1 < len(run):
                    if self._stop_asked():
                        return index, True, True
                    index += 1
            past = False
            return index, True, False
        finally:
            if past:
                self.target.rollback(len(context) - 1)

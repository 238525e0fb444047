"""The draft-then-verify loop.

Invariant between steps: `context` is prompt + emitted tokens; the target's
cache holds `context[:-1]` (the last token is pending: it is the first token of
the next verification batch). Every emitted token, the first included, comes
out of a verification pass. A step:

1. the drafter proposes up to k tokens after `context`;
2. the target decodes [pending, d1..dk] in one batch, logits at all k+1 rows;
3. greedy: keep the prefix equal to the target's argmax; sampling: rejection
   sampling against the processed distributions; then one token from the target
   (the residual at the first rejection, or a bonus after k acceptances);
4. the target's cache is rolled back past the accepted prefix; the draft model
   catches up on the next `propose` through common-prefix `sync`.

k is capped so that no step can emit past `max_tokens` or run out of context,
and stop tokens end generation even inside an accepted run. With `adaptive`,
k follows `DraftLength` between `draft_min` and `draft_max`; otherwise it is
`draft_max` every step. An empty draft makes the step a plain one-token decode.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from specdec_cli.engine.drafters import Drafter, DraftUnusable
from specdec_cli.engine.events import DRAFT, TARGET, DrafterDropped, EmittedToken, Prefill, Result, Step
from specdec_cli.engine.gate import CostGate
from specdec_cli.engine.model import Model
from specdec_cli.engine.sampling import (
    Dist,
    SamplerSettings,
    process,
    rows_finite,
    verify_greedy,
    verify_sampled,
)
from specdec_cli.errors import ContextError, ModelOutputError


def _row_dist(rows: np.ndarray, sampler: SamplerSettings, i: int) -> Dist:
    return process(rows[i], sampler)


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    draft_max: int = 5
    sampler: SamplerSettings = SamplerSettings()
    seed: int | None = None
    adaptive: bool = False  # let DraftLength move k between draft_min and draft_max
    draft_min: int = 1
    draft_p_min: float = 0.0  # model drafter: stop drafting below this top probability

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max-tokens must be >= 1, got {self.max_tokens}")
        if self.draft_max < 1:
            raise ValueError(f"draft-max must be >= 1, got {self.draft_max} (use --no-draft to run the target alone)")
        if not 1 <= self.draft_min <= self.draft_max:
            raise ValueError(f"draft-min must be in [1, draft-max={self.draft_max}], got {self.draft_min}")
        if not 0.0 <= self.draft_p_min < 1.0:
            raise ValueError(f"draft-p-min must be in [0, 1), got {self.draft_p_min}")
        self.sampler.validate()


class DraftLength:
    """The draft length schedule: k up by one after a draft the target accepted
    whole, down by one after a rejection, within [draft_min, draft_max].

    A draft that stopped short on its own (p-min, no n-gram match) and was
    accepted whole says nothing about k and leaves it alone. Fixed: draft_max.
    """

    def __init__(self, config: GenerationConfig) -> None:
        self.adaptive = config.adaptive
        self.lo, self.hi = config.draft_min, config.draft_max
        self.k = self.hi

    def update(self, k: int, n_drafted: int, n_accepted: int) -> None:
        if not self.adaptive or n_drafted == 0:
            return
        if n_accepted < n_drafted:
            self.k = max(self.lo, self.k - 1)
        elif n_drafted >= k:
            self.k = min(self.hi, self.k + 1)


class SpeculativeGenerator:
    """Runs one generation; iterate `events()`, then read `result`."""

    def __init__(
        self,
        target: Model,
        drafter: Drafter | None,
        prompt: Sequence[int],
        config: GenerationConfig,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        config.validate()
        if len(prompt) == 0:
            raise ContextError("the prompt is empty after tokenization")
        if len(prompt) > target.n_ctx:
            raise ContextError(
                f"the prompt is {len(prompt)} tokens but --ctx-size is {target.n_ctx}: "
                "raise --ctx-size or shorten the prompt"
            )
        self.target = target
        self.drafter = drafter
        self.prompt = list(prompt)
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.eog = target.eog_ids
        self._should_stop = should_stop
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.result = Result(text="", token_ids=[], stop_reason="", n_prompt=len(prompt))

    # -------------------------------------------------------------- helpers
    def _emit(self, tokens: Sequence[int], sources: Sequence[str]) -> tuple[list[EmittedToken], str | None]:
        """Append tokens to the output, stopping at EOG or the length limit."""
        out: list[EmittedToken] = []
        res = self.result
        for tok, src in zip(tokens, sources, strict=True):
            if tok in self.eog:
                return out, "eos"
            text = self._decoder.decode(self.target.token_text(tok))
            out.append(EmittedToken(tok, text, src))
            res.token_ids.append(tok)
            res.text += text
            if len(res.token_ids) >= self.config.max_tokens:
                return out, "length"
        return out, None

    # ------------------------------------------------------------ the loop
    def events(self) -> Iterator[Prefill | Step | DrafterDropped]:
        t_start = time.perf_counter()
        try:
            yield from self._run()
        finally:
            self.result.text += self._decoder.decode(b"", final=True)
            self.result.wall_seconds = time.perf_counter() - t_start

    def _run(self) -> Iterator[Prefill | Step | DrafterDropped]:
        cfg, target, res = self.config, self.target, self.result
        # Prefill: all but the last prompt token into the target (the last one
        # opens the first verification batch), the whole prompt into the draft.
        td0 = self.drafter.decode_seconds() if self.drafter else 0.0
        tt0 = target.decode_seconds
        target.prefill(self.prompt[:-1])
        if self.drafter is not None:
            self.drafter.prefill(self.prompt)
        t_draft = (self.drafter.decode_seconds() - td0) if self.drafter else 0.0
        res.prefill = Prefill(len(self.prompt), target.decode_seconds - tt0, t_draft)
        yield res.prefill

        context = list(self.prompt)
        schedule = DraftLength(cfg)
        # Free drafters (n-gram) also get the cost-aware gate when K is adaptive.
        gate = CostGate() if cfg.adaptive and getattr(self.drafter, "free", False) else None
        index = -1
        while True:
            index += 1
            if self._should_stop is not None and self._should_stop():
                res.stop_reason = "interrupted"
                return
            t_step = time.perf_counter()
            n_cached = len(context) - 1
            room = target.n_ctx - n_cached  # positions left for [pending, drafts...]
            if room <= 0:
                res.stop_reason = "context"
                return
            remaining = cfg.max_tokens - len(res.token_ids)
            k = 0
            if self.drafter is not None:
                k = max(0, min(schedule.k, room - 1, remaining - 1))

            drafted: list[int] = []
            q_dists: list[Dist] = []
            t_draft = t_sample = 0.0
            if k > 0:
                drafter = self.drafter
                assert drafter is not None
                td0, t0 = drafter.decode_seconds(), time.perf_counter()
                try:
                    drafted, q_dists = drafter.propose(
                        context, k, cfg.sampler, self.rng, self.eog, cfg.draft_p_min
                    )
                except DraftUnusable as exc:
                    # Nothing it proposed reaches the verifier: the target goes on alone.
                    self.drafter, gate, k = None, None, 0
                    yield DrafterDropped(f"{exc}: speculation is off for the rest of this run")
                if gate is not None:
                    gate.propose(len(context), drafted)
                    j = gate.choose(len(drafted))
                    drafted, q_dists = drafted[:j], q_dists[:j]
                t_draft = drafter.decode_seconds() - td0
                t_sample = time.perf_counter() - t0 - t_draft

            tt0 = target.decode_seconds
            rows = target.decode([context[-1], *drafted], n_logits=len(drafted) + 1)
            t_target = target.decode_seconds - tt0
            if not rows_finite(rows):
                target.rollback(n_cached)
                raise ModelOutputError(
                    f"the target model {target.path.name} produced non-finite logits (NaN or infinity) "
                    f"at position {n_cached}: its weights are probably corrupt; re-download or re-convert it"
                )
            if gate is not None:
                gate.observe_cost(len(drafted) + 1, t_target)
            t0 = time.perf_counter()
            if cfg.sampler.greedy:
                n_acc, nxt = verify_greedy(rows.argmax(axis=1), drafted)
            else:
                n_acc, nxt = verify_sampled(partial(_row_dist, rows, cfg.sampler), drafted, q_dists, self.rng)
            t_sample += time.perf_counter() - t0
            target.rollback(n_cached + 1 + n_acc)
            schedule.update(k, len(drafted), n_acc)

            new = drafted[:n_acc] + [nxt]
            emitted, stop = self._emit(new, [DRAFT] * n_acc + [TARGET])
            # Tokens consumed: the emitted ones plus the stop token, if it was a draft.
            consumed_drafts = min(n_acc, len(emitted) + (1 if stop == "eos" else 0))
            context.extend(new)
            if gate is not None:
                gate.score(context)
            step = Step(
                index,
                k,
                tuple(drafted),
                consumed_drafts,
                tuple(emitted),
                t_draft,
                t_target,
                t_sample,
                max(0.0, time.perf_counter() - t_step - t_draft - t_target - t_sample),
                stop,
            )
            res.steps.append(step)
            yield step
            if stop:
                res.stop_reason = stop
                return


def generate(
    target: Model,
    drafter: Drafter | None,
    prompt: Sequence[int],
    config: GenerationConfig,
) -> Result:
    """Run to completion without looking at the events."""
    gen = SpeculativeGenerator(target, drafter, prompt, config)
    for _ in gen.events():
        pass
    return gen.result

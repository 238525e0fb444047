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
4. the target's cache is rolled back past the accepted prefix, and the drafter
   is told what was kept (`accept`); a draft model catches up on its next
   `propose` through common-prefix sync.

k is capped so that no step can emit past `max_tokens` or run out of context,
and stop tokens end generation even inside an accepted run. How many tokens
the drafter proposes within that cap is its own policy (engine/drafters/). An empty
proposal makes the step a plain one-token decode.

The loop needs only the `LanguageModel` protocol of the target, so it runs on
llama.cpp models and on tests' numpy fakes alike. With llama.cpp's models, a
greedy draft model's steps run several to a call into llama.cpp, each as this
loop makes it (engine/draft_runs.py), and the target alone's tokens in bursts
(engine/plain_loops.py).
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import numpy as np

from specdec_cli.engine import native
from specdec_cli.engine.draft_runs import DraftRuns, runner
from specdec_cli.engine.drafters import NO_DRAFT, Drafter, DraftRequest, DraftUnusable, Outcome, Proposal
from specdec_cli.engine.drafters.base import hidden_wanted
from specdec_cli.engine.events import DRAFT, TARGET, DrafterDropped, EmittedToken, Event, Prefill, Step, Transcript
from specdec_cli.engine.plain_loops import PLANNED_BURST, QUIET_STEPS, PlainLoops
from specdec_cli.engine.protocol import LanguageModel
from specdec_cli.engine.sampling import (
    Dist,
    SamplerSettings,
    finite_argmax,
    process,
    rows_finite,
    verify_greedy,
    verify_sampled,
)
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.errors import ContextError, ModelOutputError


def _row_dist(rows: np.ndarray, sampler: SamplerSettings, i: int) -> Dist:
    return process(rows[i], sampler)


PLAIN = (TARGET,)  # the source of a plain step's one token


class SpeculativeGenerator(PlainLoops, DraftRuns):
    """Runs one generation; iterate `events()`, then read `result`."""

    def __init__(
        self,
        target: LanguageModel,
        drafter: Drafter | None,
        prompt: Sequence[int],
        config: GenerateOptions,
        should_stop: Callable[[], bool] | None = None,
        burst_seconds: float = 0.0,
    ) -> None:
        """`burst_seconds` > 0: the target alone, greedy, decodes its tokens in bursts of up to that long in one
        call into llama.cpp where the model can (`_bursts`)."""
        config.validate()
        check_prompt(len(prompt), target.n_ctx)
        self.target = target
        self.drafter = drafter
        self.prompt = list(prompt)
        self.config = config
        self.sampler = config.sampler  # built once: the loop reads it every step
        self.rng = np.random.default_rng(config.seed)
        self.eog = target.eog_ids
        self._should_stop = should_stop
        self.burst_seconds = burst_seconds
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._hidden = False  # the target returns hidden states (for the heads: drafters/medusa.py)
        self.result = Transcript(text="", token_ids=[], stop_reason="", n_prompt=len(prompt))

    # -------------------------------------------------------------- helpers
    def _emit(self, tokens: Sequence[int], sources: Sequence[str]) -> tuple[list[EmittedToken], str | None]:
        """Append tokens to the output, stopping at EOG or the length limit."""
        out: list[EmittedToken] = []
        res, decoder = self.result, self._decoder
        for tok, src in zip(tokens, sources, strict=True):
            if tok in self.eog:
                return out, "eos"
            piece = self.target.token_text(tok)
            try:  # a whole character or more, none held back: what the incremental decoder gives, without its Python
                text = decoder.decode(piece) if decoder.buffer else piece.decode()
            except UnicodeDecodeError:  # part of a character (its rest in the next token's piece), or invalid bytes
                text = decoder.decode(piece)
            out.append(EmittedToken(tok, text, src))
            res.token_ids.append(tok)
            res.text += text
            if len(res.token_ids) >= self.config.max_tokens:
                return out, "length"
        return out, None

    def _propose(self, context: list[int], k: int) -> Iterator[DrafterDropped | Proposal]:
        """The drafter's proposal; a drafter that cannot go on is replaced by its fallback."""
        assert self.drafter is not None
        try:
            yield self.drafter.propose(DraftRequest(context, k, self.sampler, self.rng, self.eog))
        except DraftUnusable as exc:
            # Nothing it proposed reaches the verifier: the run goes on without it.
            self.drafter = exc.fallback
            rest = "the n-gram lookup goes on alone" if exc.fallback else "speculation is off"
            yield DrafterDropped(f"{exc}: {rest} for the rest of this run")
            yield Proposal(k=k)

    # ------------------------------------------------------------ the loop
    def events(self) -> Iterator[Event]:
        t_start = time.perf_counter()
        try:
            yield from self._run()
        finally:
            if self._hidden:
                self.target.set_hidden(False)
            # A character cut by --max-tokens (or a stop) mid-way is left out, as the stream left it out:
            # text holds complete characters only; token_ids keep every token.
            self._decoder.reset()
            self.result.wall_seconds = time.perf_counter() - t_start
            native.release_compute_threads()  # the next generation may step on another thread

    def _run(self) -> Iterator[Event]:
        cfg, target, res = self.config, self.target, self.result
        # Prefill: all but the last prompt token into the target (the last one
        # opens the first verification batch); the drafter sees the whole prompt.
        td0 = self.drafter.decode_seconds() if self.drafter else 0.0
        tt0 = target.decode_seconds
        target.prefill(self.prompt[:-1])
        if self.drafter is not None:
            self.drafter.begin(self.prompt)
        t_draft = (self.drafter.decode_seconds() - td0) if self.drafter else 0.0
        res.prefill = Prefill(len(self.prompt), target.decode_seconds - tt0, t_draft)
        if hidden_wanted(self.drafter):
            # after the prefill: with it on, every token of a batch is an output (verification batches are)
            target.set_hidden(True)
            self._hidden = True
        yield res.prefill

        context = list(self.prompt)
        greedy = self.sampler.greedy
        if greedy and self.drafter is None and getattr(target, "decodes_ahead", bool)():
            yield from self._ahead(context)
            return
        if greedy and self.drafter is None and self.burst_seconds > 0 and hasattr(target, "greedy_run"):
            yield from self._bursts(context)
            return
        index, quiet = -1, 0  # quiet: steps in a row the drafter proposed nothing (`_burst`)
        bursts = greedy and self.burst_seconds > 0 and not self._hidden and hasattr(target, "greedy_run")
        steps = runner(target, self.drafter, cfg, self.eog, self.burst_seconds) if bursts else None  # `_draft_run`'s
        drafter0 = self.drafter
        while True:
            index += 1
            if self._stop_asked():
                return
            t_step = time.perf_counter()
            n_cached = len(context) - 1
            room = target.n_ctx - n_cached  # positions left for [pending, drafts...]
            if room <= 0:
                res.stop_reason = "context"
                return
            k = max(0, min(cfg.k_max, room - 1, cfg.max_tokens - len(res.token_ids) - 1))
            if steps is not None and self.drafter is drafter0 and index > 0 and k > 0:  # the first step comes alone
                index, made, ended = yield from self._draft_run(steps, index, context, t_step)
                if ended:
                    return
                if made:
                    continue

            proposal = NO_DRAFT
            t_draft = t_sample = 0.0
            drafter = self.drafter
            if drafter is not None and k > 0:
                td0, t0 = drafter.decode_seconds(), time.perf_counter()
                for item in self._propose(context, k):
                    if isinstance(item, DrafterDropped):
                        yield item
                    else:
                        proposal = item
                t_draft = drafter.decode_seconds() - td0
                t_sample = time.perf_counter() - t0 - t_draft
            drafted = proposal.tokens
            quiet = quiet + 1 if drafter is not None and k > 0 and not drafted else 0
            if bursts and quiet > QUIET_STEPS:
                n = max(1, min(PLANNED_BURST, room, cfg.max_tokens - len(res.token_ids)))
                index, ended = yield from self._burst(index, context, n, proposal, (t_step, t_draft, 0.0, t_sample))
                if ended:
                    return
                continue

            tt0 = target.decode_seconds
            batch = [context[-1], *drafted]
            # greedy needs each row's argmax only: computed where the logits are, none read back (Model)
            rows = target.decode_argmax(batch, len(batch)) if greedy else target.decode(batch, len(batch))
            t_target = target.decode_seconds - tt0
            hidden = target.hidden(len(drafted) + 1) if self._hidden else None
            step, n_acc = self.verify(index, context, proposal, rows, (t_step, t_draft, t_target, t_sample))
            if self.drafter is not None:
                self.drafter.accept(Outcome(context, proposal, n_acc, t_target,
                                            None if hidden is None else hidden[n_acc]))  # fmt: skip
            yield step
            if step.stop:
                res.stop_reason = step.stop
                return

    def _stop_asked(self) -> bool:
        """The caller asked the generation to stop (`should_stop`), checked before each step: it ends "interrupted"."""
        if self._should_stop is not None and self._should_stop():
            self.result.stop_reason = "interrupted"
            return True
        return False

    def verify(
        self, index: int, context: list[int], proposal: Proposal, rows: np.ndarray | list[int] | None,
        times: tuple[float, float, float, float],
    ) -> tuple[Step, int]:  # fmt: skip
        """Steps 3 and 4 of a step, once the target has decoded [pending, drafts...] into `rows` (the logits, or
        for greedy their argmaxes, None where one was not finite: `decode_argmax`): keep the accepted prefix
        plus the target's token, roll the target back past it, extend `context`, and record the Step. Returns it
        and the number of drafts accepted. `times` are (the step's start, draft, target and sampling seconds so
        far). The batch engine (engine/batch/) verifies each of its sequences through this too."""
        t_step, t_draft, t_target, t_sample = times
        target, drafted = self.target, proposal.tokens
        greedy = self.sampler.greedy
        if not drafted and greedy and type(rows) is list:  # a plain greedy step (its token the target's)
            return self._plain(index, context, proposal, rows[0], times), 0
        n_cached = len(context) - 1
        t0 = time.perf_counter()
        top: np.ndarray | list[int] | None = None
        if isinstance(rows, np.ndarray):  # greedy checks finiteness within its argmax
            top = finite_argmax(rows) if greedy else None
            finite = top is not None if greedy else rows_finite(rows)
        else:
            top, finite = rows, rows is not None
        if not finite:
            target.rollback(n_cached)
            raise ModelOutputError(
                f"the target model {target.name} produced non-finite logits (NaN or infinity) "
                f"at position {n_cached}: its weights are probably corrupt; re-download or re-convert it"
            )
        if top is not None:
            n_acc, nxt = verify_greedy(top, drafted)
        else:
            assert isinstance(rows, np.ndarray)
            n_acc, nxt = verify_sampled(partial(_row_dist, rows, self.sampler), drafted, proposal.dists, self.rng)
        t_sample += time.perf_counter() - t0
        target.rollback(n_cached + 1 + n_acc)

        return self._keep(index, context, proposal, n_acc, nxt, (t_step, t_draft, t_target, t_sample)), n_acc

    def _keep(self, index: int, context: list[int], proposal: Proposal, n_acc: int, token: int,
              times: tuple[float, float, float, float]) -> Step:  # fmt: skip
        """A verified step's end: its `n_acc` accepted drafts and the target's `token` emitted (up to a stop) and
        appended to `context`, and the Step recorded (`verify`'s, and a run's steps: engine/draft_runs.py)."""
        new = proposal.tokens[:n_acc] + [token]
        emitted, stop = self._emit(new, [DRAFT] * n_acc + [TARGET])
        # Tokens consumed: the emitted ones plus the stop token, if it was a draft.
        consumed_drafts = min(n_acc, len(emitted) + (1 if stop == "eos" else 0))
        context.extend(new)
        return self._record(index, proposal, consumed_drafts, emitted, stop, times)

    def _plain(self, index: int, context: list[int], proposal: Proposal, token: int,
               times: tuple[float, float, float, float]) -> Step:  # fmt: skip
        """`verify` of a plain greedy step: no drafts to compare, nothing past the decoded token to roll back; its
        one token emitted and the Step recorded as `verify` records it (a step's host time, every step of a
        generation the target decodes alone: docs/design.md#host-time)."""
        emitted, stop = self._emit((token,), PLAIN)
        context.append(token)
        return self._record(index, proposal, 0, emitted, stop, times)

    def _record(self, index: int, proposal: Proposal, n_accepted: int, emitted: list[EmittedToken], stop: str | None,
                times: tuple[float, float, float, float]) -> Step:  # fmt: skip
        """The step's record, kept in the result: `times` are (its start, draft, target and sampling seconds)."""
        t_step, t_draft, t_target, t_sample = times
        drafted = proposal.tokens
        step = Step(
            index=index,
            k=proposal.k,
            drafted=tuple(drafted),
            n_accepted=n_accepted,
            emitted=tuple(emitted),
            t_draft=t_draft,
            t_target=t_target,
            t_sample=t_sample,
            t_other=max(0.0, time.perf_counter() - t_step - t_draft - t_target - t_sample),
            stop=stop,
            drafter=proposal.source if drafted else None,
            predicted_speedup=proposal.predicted_speedup,
            note=proposal.note,
        )
        self.result.steps.append(step)
        return step


def prompt_fits(n_prompt: int, n_ctx: int) -> bool:
    """A prompt fits when it leaves the context room for at least one generated token."""
    return 0 < n_prompt < n_ctx


def check_prompt(n_prompt: int, n_ctx: int) -> None:
    """The one check of a prompt's length (the CLI, the API, chat and the server all reach it here)."""
    if n_prompt == 0:
        raise ContextError("the prompt is empty after tokenization")
    if not prompt_fits(n_prompt, n_ctx):
        raise ContextError(
            f"the prompt is {n_prompt} tokens and the context holds {n_ctx} (--ctx-size), with room needed for "
            "the reply: shorten the prompt or raise the context size"
        )


def generate(
    target: LanguageModel,
    drafter: Drafter | None,
    prompt: Sequence[int],
    config: GenerateOptions,
) -> Transcript:
    """Run to completion without looking at the events (tests and benchmarks)."""
    gen = SpeculativeGenerator(target, drafter, prompt, config)
    for _ in gen.events():
        pass
    return gen.result

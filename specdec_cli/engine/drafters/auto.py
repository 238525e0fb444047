"""The auto drafter: before every step, choose what to verify from measured costs.

It holds the n-gram lookup (free) and, when one is loaded, a draft model. Each
step it compares three things by the speedup model (estimates.py), every term
measured during the run:

- a plain one-token decode: 1.0 by definition;
- the n-gram proposal's best prefix j: E_ng(j) / c_v(j+1), with E_ng from
  shadow scoring (every proposal is scored against what the target produced,
  verified or not);
- a model draft of the best length K: E_m(K) / (K c_d + c_v(K+1)), with E_m
  from the model's verified steps and c_d its measured cost per token.

and verifies the best. The choice depends only on the past, so greedy output
is the target's and the sampled distribution too.

With Medusa heads (drafters/medusa.py) it holds a fourth: the heads' chain of guesses from the target's
hidden state, priced as E_h(K) / (K c_h + c_v(K+1)), with E_h from shadow scoring as the lookup's (every
guess is scored, verified or not) and c_h a head's measured time. A guess is not free: while the heads
do not pay, they guess only as often as keeps their time under `SHADOW_SHARE` of the generation's.

A draft model that does not pay is paused, not dropped. While paused its cache
is left behind (nothing is spent on it); a retry catches it up on at most
`WINDOW` recent tokens in one batch and drafts once, and retries are spaced so
that their cost (catch-up plus the step's expected loss) stays under
`RETRY_SHARE` of the generation time. A draft model that could not pay even if
every token were accepted is not retried until its measured costs change.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec_cli.engine.drafters import (
    NO_DRAFT,
    DraftRequest,
    DraftUnusable,
    ModelDrafter,
    NgramDrafter,
    Outcome,
    Proposal,
)
from specdec_cli.engine.drafters.cross import CrossDrafter
from specdec_cli.engine.drafters.gate import ShadowScore
from specdec_cli.engine.drafters.medusa import HeadsDrafter
from specdec_cli.engine.estimates import (
    Acceptance,
    BatchCosts,
    RecentMedian,
    best_length,
    perfect_speedup,
    step_speedup,
)
from specdec_cli.engine.settings import AUTO, HEADS, MODEL, NGRAM

WINDOW = 64  # tokens a paused draft model re-reads when it is retried
RETRY_SHARE = 0.05  # at most this share of generation time goes to retrying a paused draft model
MODEL_PRIOR = 0.8  # acceptance assumed for a draft model before its first verified step, uncalibrated
CALIBRATED_WEIGHT = 6.0  # observations a calibrated agreement (calibration.py) is worth: one early miss
# must not pause a draft that agrees 98% of the time (2 were: a miss in the first two steps paused it)
RUN_PRIOR = 4.0  # draft-model steps assumed to follow one another, before any run is measured
SHADOW_SHARE = 0.005  # at most this share of generation time goes to guesses of heads that are not chosen


CALIBRATED_DRAFT_SAMPLES = 2  # a calibrated draft time counts as this many timings (AutoState.calibrated_draft)


@dataclass
class AutoState:
    """What the auto drafter has learned; a `Speculator` keeps it across generations (a chat goes on learning)."""

    costs: BatchCosts = field(default_factory=BatchCosts)
    ngram: ShadowScore = field(default_factory=ShadowScore)  # the n-gram lookup's acceptance, by regime
    model: Acceptance = field(default_factory=lambda: Acceptance(prior=MODEL_PRIOR))
    # The draft model's cost per drafted token, and per token of a catch-up batch: medians of
    # recent timings (one slow decode must not pause a good draft); calibration sets the first.
    draft_token_seconds: float | None = None
    draft_batch_token_seconds: float | None = None
    paused: bool = False
    # False for a seeded sampled run: decisions then come from the starting costs only, never from
    # this run's timings, so the same seed gives the same text (timings differ run to run).
    learn_costs: bool = True
    budget: float = 0.0  # seconds of retry cost the generation time so far allows
    # How many draft-model steps follow one another (moving average): a catch-up after lookup or plain
    # steps is paid once and repaid over that many steps.
    model_run: float = RUN_PRIOR
    draft_samples: RecentMedian = field(default_factory=RecentMedian)
    batch_samples: RecentMedian = field(default_factory=RecentMedian)
    heads: ShadowScore = field(default_factory=ShadowScore)  # the heads' acceptance (kept: it is theirs, not a text's)
    heads_samples: RecentMedian = field(default_factory=RecentMedian)
    heads_seconds: float | None = None  # a head's guess's time: the median of recent ones
    heads_chosen: bool = True  # the heads' latest guess was the step's choice (kept: a new text starts from it)

    def heads_cost(self) -> float:
        """c_h: one head's guess's time in single-token target decodes (0 until both are measured, or for a
        seeded sampled run, whose choices must not depend on timings)."""
        one, t = self.costs.one, self.heads_seconds
        return t / one if self.learn_costs and one and t is not None else 0.0

    def calibrated_draft(self, seconds: float) -> None:
        """Start from a calibrated draft token's time, counted as `CALIBRATED_DRAFT_SAMPLES` timings in the median:
        a generation's first draft steps can be cold (on a GPU, a context's first calls load kernels and capture
        graphs: one such step measured a 2-layer draft at 1.6 target tokens, which paused it for the whole
        generation), and one or two of them must not outvote a measurement of fifteen decodes."""
        self.draft_token_seconds = seconds
        for _ in range(CALIBRATED_DRAFT_SAMPLES):
            self.draft_samples.add(seconds)

    def draft_cost(self) -> float | None:
        """c_d: the draft's cost per token in single-token target decodes."""
        one = self.costs.one
        if self.draft_token_seconds is None or not one:
            return None
        return self.draft_token_seconds / one


def heads_wait(state: AutoState, n_heads: int) -> int:
    """Steps heads that do not pay skip between guesses: their guesses' time stays under SHADOW_SHARE."""
    return max(0, math.ceil(n_heads * state.heads_cost() / SHADOW_SHARE) - 1)


class AutoDrafter:
    name: str = AUTO
    free = False

    def __init__(
        self,
        ngram: NgramDrafter,
        model: ModelDrafter | CrossDrafter | None,
        k_max: int,
        state: AutoState,
        model_k_max: int | None = None,
        heads: HeadsDrafter | None = None,
    ) -> None:
        self.ngram = ngram
        self.heads = heads
        self.wants_hidden = heads is not None  # the loop passes the target's hidden states (medusa.py)
        self._heads_wait = 0  # steps until heads that were not chosen guess again
        self.model = model
        self._loaded = model
        self.k_max = k_max
        self.model_k_max = min(k_max, model_k_max or k_max)  # a pair's draft_max caps model drafts only
        self.state = state
        self.shadow = state.ngram
        self._choice = ""
        self._note: str | None = None
        self._model_at = 0
        self._run = 0

    def decode_seconds(self) -> float:
        return self._loaded.decode_seconds() if self._loaded else 0.0  # a dropped model's time still counts

    # ---------------------------------------------------------- lifecycle
    def begin(self, prompt: Sequence[int]) -> None:
        self.ngram.begin(prompt)
        self.shadow.clear()
        if self.heads is not None:
            self.heads.begin(prompt)
            self.state.heads.clear(keep=1.0)
        self._note = None
        self._model_at = 0  # context tokens the draft model's cache holds (at most)
        self._run = 0  # model steps in a row so far
        if self.model is None:
            return
        if not self._model_could_pay():
            if not self.state.paused:
                self.state.paused = True
                self._note = self._pause_reason(self.model_k_max)
        elif not self.state.paused:
            self.model.begin(prompt)
            self._model_at = len(prompt) - 1

    def propose(self, req: DraftRequest) -> Proposal:
        s = self.state
        note, self._note = self._note, None
        ng = self.ngram.propose(req)
        self.shadow.propose(len(req.context), ng.tokens, ng.pool_match)
        if s.costs.one is None:
            # Nothing prices a step until a single-token decode has been timed (no calibration):
            # decode plainly until it has been (MIN_SAMPLES steps), or every choice would look free.
            self._choice = "plain"
            return Proposal(k=0, predicted_speedup=1.0, note=note)
        j, v_ng = best_length(self.shadow.acceptance, s.costs, len(ng.tokens))
        choice, value = "plain", 1.0
        if j and v_ng > value:
            choice, value = NGRAM, v_ng
        hd = self._heads_guess(req)
        if hd.tokens:
            # a heads step leaves a draft model in use behind: its next step catches up on this one's tokens too
            behind = self._catch_up_share(len(req.context) + len(hd.tokens) + 1) if self.model and not s.paused else 0.0
            j_h, v_h = best_length(s.heads.acceptance, s.costs, len(hd.tokens), s.heads_cost(), fixed=behind)
            if j_h and v_h > value:
                choice, value, ng = HEADS, v_h, hd.cut(j_h)
        # A paused draft that could not pay even if the target took every token stays paused and is not retried
        # (`_retry_due`): no need to price it on every step it sits out.
        if self.model is not None and not (s.paused and not self._model_could_pay()):
            k_m, v_m = self._model_value(min(req.k, self.model_k_max))
            pays = k_m > 0  # best_length only picks a K predicted to beat a plain decode by MIN_GAIN
            if pays and s.paused:
                s.paused, note = False, f"draft model resumed: {v_m:.2f}x predicted"
            elif not pays and not s.paused:
                s.paused, s.budget, note = True, 0.0, self._pause_reason(min(req.k, self.model_k_max))
            if pays:
                share = self._catch_up_share(len(req.context))
                if share:
                    k_m, v_m = self._model_value(min(req.k, self.model_k_max), share)
            if pays and k_m and v_m > value:
                choice, value = MODEL, v_m
            elif s.paused and choice == "plain" and self._retry_due(min(req.k, self.model_k_max), len(req.context)):
                k_m = max(1, k_m)
                choice, value = MODEL, self._model_speedup(k_m)
                note = "retrying the paused draft model"
        self._choice = choice
        if hd.tokens:  # chosen, the heads guess again next step; else as often as SHADOW_SHARE allows
            s.heads_chosen = choice == HEADS
        if choice == HEADS:
            return dataclasses.replace(ng, k=len(ng.tokens), predicted_speedup=value, note=note)
        if choice == NGRAM:
            return dataclasses.replace(ng.cut(j), k=j, predicted_speedup=value, note=note)
        if choice == MODEL:
            proposal = self._draft(dataclasses.replace(req, k=k_m))
            return dataclasses.replace(proposal, predicted_speedup=value, note=note)
        return Proposal(k=0, predicted_speedup=1.0, note=note)

    def accept(self, outcome: Outcome) -> None:
        s = self.state
        n = len(outcome.proposal.tokens)
        if s.learn_costs:
            s.costs.observe(n + 1, outcome.t_target)
        one = s.costs.one or (outcome.t_target if s.learn_costs else 1.0)
        s.budget += RETRY_SHARE * one  # each step's plain-decode equivalent earns retry time
        self.shadow.score(outcome.context)
        if self.heads is not None:
            self.heads.accept(outcome)
            s.heads.score(outcome.context)
        if self._choice == MODEL and n:
            s.model.observe(n, outcome.n_accepted)
        if self._choice == MODEL:
            self._run += 1
        elif self._run:  # a run of model steps ended: how long such runs last prices the next catch-up
            s.model_run, self._run = 0.8 * s.model_run + 0.2 * self._run, 0
        self.ngram.accept(outcome)

    # ------------------------------------------------------------ the heads
    def _heads_guess(self, req: DraftRequest) -> Proposal:
        """The heads' guesses, when they are due: every step while they are chosen, else one step in as many as
        keep their time under SHADOW_SHARE (always, for a seeded sampled run: no timings decide it)."""
        h, s = self.heads, self.state
        if h is None or not h.ready(len(req.context)):
            return NO_DRAFT
        if self._heads_wait > 0 and s.learn_costs and not s.heads_chosen:
            self._heads_wait -= 1
            return NO_DRAFT
        hd = h.propose(dataclasses.replace(req, k=min(req.k, h.heads.n_heads)))
        if s.learn_costs:
            s.heads_seconds = s.heads_samples.add(h.head_seconds)
        self._heads_wait = heads_wait(s, h.heads.n_heads)
        s.heads.propose(len(req.context), hd.tokens)
        return hd

    # ------------------------------------------------------------ the model
    def _model_could_pay(self) -> bool:
        cd = self.state.draft_cost()
        return cd is None or perfect_speedup(self.state.costs, self.model_k_max, cd)[1] > 1.0

    def _model_value(self, k: int, fixed: float = 0.0) -> tuple[int, float]:
        if self.model is None:
            return 0, 0.0
        cd = self.state.draft_cost()
        if cd is None:
            cd = 0.0  # not measured yet: the first model step measures it
        return best_length(self.state.model, self.state.costs, k, cd, fixed=fixed)

    def _catch_up_seconds(self, behind: int) -> float:
        """What bringing the draft's cache up to the context costs: one batch of at most WINDOW tokens."""
        s = self.state
        behind = max(1, min(WINDOW, behind))
        if s.draft_batch_token_seconds is not None:
            return s.draft_batch_token_seconds * behind
        # not measured yet: a batch scales as the target's batches do on this machine
        return (s.draft_token_seconds or s.costs.one or 0.0) * s.costs.relative(behind)

    def _catch_up_share(self, context_len: int) -> float:
        """A model step after lookup or plain steps first catches the draft up on what they produced:
        its share of that cost, in target tokens, spread over the model steps that usually follow.
        One or two tokens behind is every model step's own (counted in the draft's cost per token)."""
        one, behind = self.state.costs.one, context_len - self._model_at
        if behind <= 2 or not one:
            return 0.0
        return self._catch_up_seconds(behind) / one / max(1.0, self.state.model_run)

    def _model_speedup(self, k: int) -> float:
        s = self.state
        return step_speedup(s.model.expected(k), k, s.draft_cost() or 0.0, s.costs)

    def _pause_reason(self, k: int) -> str:
        s = self.state
        cd = s.draft_cost() or 0.0
        k = max(1, k)
        if s.model.n == 0:
            best = perfect_speedup(s.costs, k, cd)[1]
            return (f"draft costs {cd:.2f} target tokens: even a draft the target always accepted "
                    f"would run at {best:.2f}x the target alone: paused")  # fmt: skip
        best = max(self._model_speedup(j) for j in range(1, k + 1))
        return f"draft costs {cd:.2f} target tokens, acceptance {s.model.rate(0):.0%} → {best:.2f}x at best: paused"

    def _retry_cost(self, k: int, context_len: int) -> float:
        """Seconds a retry is expected to cost: catching the draft's cache up (one batch of at
        most WINDOW tokens) and the step's loss against a plain decode."""
        s = self.state
        one = s.costs.one or 0.0
        catch_up = self._catch_up_seconds(context_len - self._model_at)
        cd = s.draft_cost() or 1.0
        loss = max(0.0, (k * cd + s.costs.relative(k + 1)) - s.model.expected(k)) * one
        return catch_up + loss

    def _retry_due(self, k: int, context_len: int) -> bool:
        if not self._model_could_pay():
            return False
        s = self.state
        cost = self._retry_cost(min(k, 2), context_len)
        if s.budget >= cost:
            s.budget -= cost
            return True
        return False

    def _draft(self, req: DraftRequest) -> Proposal:
        assert self.model is not None
        s = self.state
        t0 = self.model.decode_seconds()
        try:
            proposal = self.model.propose(req)
        except DraftUnusable as exc:
            self.model = None  # corrupt draft: the n-gram lookup goes on alone
            raise DraftUnusable(str(exc), fallback=self) from None
        t = self.model.decode_seconds() - t0
        self._model_at = len(req.context)
        n_caught, t_caught = self.model.last_catch_up
        calls = len(proposal.tokens)  # a step is one catch-up call (1-2 tokens) and one call per further token
        if not s.learn_costs:
            return proposal
        if n_caught > 2:  # a catch-up batch after a pause: its cost per token is not drafting's
            s.draft_batch_token_seconds = s.batch_samples.add(t_caught / n_caught)
            t, calls = t - t_caught, calls - 1
        if calls > 0:
            s.draft_token_seconds = s.draft_samples.add(t / calls)
        return proposal


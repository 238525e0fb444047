"""The batch engine's planner: how many tokens each generating slot drafts this step, and from where.

Each candidate plan (every slot drafting up to m-1 tokens, from its n-gram lookup only or with the
draft model) is valued as expected tokens (the slots' geometric mean, `fair_tokens`) over cost, in
single-token target decodes: the target batch as llama.cpp will split it (`ubatch_sizes`), or filled
to one micro-batch where that is cheaper, less what the step's prompt chunks cost anyway, plus the
draft rounds. A plan with model drafts must win in the steady state and again with its caches' one-time
catch-up spread over the steps it can pay back in (engine/batch/occupancy.py). Drafting plans are then
scaled by how such steps really turned out against their prediction (engine/batch/realized.py). With fair
slots, a plan whose whole step time passes FAIR_STEP plain steps beside another generating slot or a prompt
being read (FAIR_GAP single decodes beside a stream, where that is longer), or that adds time to a step
giving a request its first token, is not taken, and while a streamed conversation may come back a step
nobody streams lasts no longer than BACKGROUND_SECONDS (engine/batch/admission.py). docs/design.md,
"Several requests in one batch", tells the whole story.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from specdec_cli.engine.batch.admission import BACKGROUND_SECONDS, FAIR_GAP, FAIR_STEP, prompt_chunks, prompt_room
from specdec_cli.engine.batch.occupancy import Occupancy
from specdec_cli.engine.batch.pricing import Choice, batch_cost, fair_tokens, filled
from specdec_cli.engine.batch.realized import Realized
from specdec_cli.engine.batch.slots import BatchJob, Slot
from specdec_cli.engine.drafters import NO_DRAFT, DraftRequest
from specdec_cli.engine.drafters.auto import AutoState, heads_wait
from specdec_cli.engine.estimates import MIN_GAIN, BatchCosts, best_length, perfect_speedup
from specdec_cli.engine.protocol import LoadedModel
from specdec_cli.engine.settings import AUTO, HEADS, MODEL, NGRAM, NONE

WINDOW = 64  # a draft cache that fell further behind than this re-reads only the last WINDOW tokens
FILLER_TOKEN_LIMIT = 64  # never pad a step by more tokens than this
EXPLORE, EXPLORE_RATE = 3, 0.95  # model steps verified before its measured acceptance decides; assumed till then
MIN_MARGINAL = 0.05  # the least a step's generation is priced at beside prompt chunks (single-token decodes)
MEMO_LIMIT = 4096  # batch layouts priced and kept at once: prompt chunks make new ones while prices hold


class Planner:
    """Each step's drafts for the batch engine (engine/batch/, which owns it and runs the step): per
    generating slot, how many tokens and from where, priced by the passes llama.cpp's split will cost."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None, state: AutoState, draft_costs: BatchCosts, *,
                 n_slots: int, model_k_max: int | None, budget: int) -> None:  # fmt: skip
        self.target = target
        self.draft = draft
        self.state = state
        self.draft_costs = draft_costs
        self.n_slots = n_slots
        self.model_k_max = model_k_max
        self.budget = budget  # target tokens per step (prompt chunks included)
        self.fair_step: float | None = FAIR_STEP  # None: drafts are bounded by tokens per second only
        self.chatting = False  # a free slot holds a streamed conversation: its next turn may arrive any step
        self.draft_broken: str | None = None  # why the draft model was dropped (the engine sets it)
        self.occupancy = Occupancy()
        self.realized = Realized()
        self.predicted: float | None = None  # this step: the speedup over a plain step its drafts were chosen for
        self._behind_now: dict[int, int] = {}  # this step: tokens each slot's draft cache must catch up
        self._left: dict[int, int] = {}  # this step: tokens each slot may still generate
        self._alone = False  # this step: one slot generates and no prompt waits
        self._horizon = math.inf  # this step: steps expected before the batch grows (catch-up is spread over them)
        self._memo: dict[tuple[int, ...], float] = {}  # batch costs by layout, at the prices of `_memo_version`
        self._memo_version: tuple[int, int] | None = None

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

    def _model_could_pay(self, n_gen: int, plain: float | None) -> bool:
        """Whether model drafts could pay with `n_gen` slots generating even if every drafted token were
        accepted: each slot drafting K tokens (K draft rounds of at least n_gen tokens, one pass over the
        n_gen * (K + 1) tokens at least) against `plain`, the plain step's value as `plan` prices it. A batch
        of many slots costs nearly a token per slot already, so there plans with model drafts are not even
        priced (they were most of a step's Python at 8 slots, for plans that never won). With one slot,
        one sequence's bound."""
        unit = self._draft_unit()
        if unit is None:
            return True  # not measured yet: the first drafts measure it
        costs, k_max = self.state.costs, self.model_k_max or 8
        if n_gen <= 1 or plain is None:
            return perfect_speedup(costs, k_max, unit)[1] > 1.0
        k_max = max(1, min(k_max, self.budget // n_gen - 1))
        rounds = self._round(n_gen, unit)
        return any(n_gen * (k + 1) / (costs.relative(n_gen * (k + 1)) + k * rounds) > plain for k in range(1, k_max + 1))

    @staticmethod
    def _cap_kind(job: BatchJob) -> int:
        return 0 if job.kind == NONE or job.config.reproducible else job.k_max

    def fillers(self, counts: list[int], gen: list[int], room: int) -> dict[int, int]:
        """Tokens to add (and roll back) per sequence when one micro-batch then costs less than the split."""
        if not gen:
            return {}
        full = filled(counts, gen)
        extra = {s: full[s] - counts[s] for s in range(len(counts)) if full[s] > counts[s]}
        if not extra or sum(extra.values()) > min(room, FILLER_TOKEN_LIMIT):
            return {}
        for s in extra:  # a filler must fit in that sequence's context
            if len(self.target.seq_tokens[s]) + counts[s] + extra[s] > self.target.n_ctx:
                return {}
        if self._batch_cost(full) < self._batch_cost(counts):
            return extra
        return {}

    def _batch_cost(self, counts: Sequence[int]) -> float:
        """`batch_cost` with the target's costs, kept per layout till the prices change: a step prices the
        same few layouts again and again (the plain step's at every one)."""
        costs = self.state.costs
        if self._memo_version != (id(costs), costs.version) or len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
            self._memo_version = (id(costs), costs.version)
        key = tuple(counts)
        cost = self._memo.get(key)
        if cost is None:
            cost = self._memo[key] = batch_cost(counts, costs, self.target.n_batch)
        return cost

    # ------------------------------------------------------------ planning
    def _draft_usable(self) -> bool:
        return self.draft is not None and self.draft_broken is None

    def _cap(self, s: Slot) -> int:
        assert s.job is not None
        return max(0, min(self._cap_kind(s.job), self._tokens_left(s) - 1))

    def plan(self, gen: list[Slot], pre: list[Slot]) -> dict[int, Choice]:
        """Each generating slot's draft: the plan with the most expected tokens per unit of time."""
        caps = {s.seq: self._cap(s) for s in gen}
        for s in gen:
            assert s.job is not None and s.gen is not None
            s.proposal = s.lookup = NO_DRAFT
            s.lookup_acc = s.shadow.acceptance
            if s.job.kind in (AUTO, NGRAM) and caps[s.seq]:
                req = DraftRequest(s.context, caps[s.seq], s.job.config.sampler, s.gen.rng, s.gen.eog)
                s.lookup = s.ngram.propose(req)  # free: every step, verified or not, for shadow scoring
                s.shadow.propose(len(s.context), s.lookup.tokens, s.lookup.pool_match)
            if s.job.kind in (AUTO, HEADS) and caps[s.seq]:
                self._heads_lookup(s, caps[s.seq])
        self.predicted = None
        if not gen or not any(caps.values()):
            return {}
        st = self.state
        one = st.costs.one
        if one is None:  # nothing prices a step until a single-token decode has been timed
            return {}
        pre_counts = [0] * self.n_slots
        first_token = False  # a prompt finishes in this step: its request's first token comes out of it
        for s, n in prompt_chunks(pre, self.prompt_room(len(gen), len(gen) + len(pre), pre), len(gen),
                                  self.fair_step is not None):  # fmt: skip
            pre_counts[s.seq] = n
            first_token = first_token or (s.job is not None and n == len(s.job.prompt) - s.prefilled)
        unit = self._draft_unit()
        # the plain step's value, as the loop below prices it; drafting must beat it by MIN_GAIN
        plain_plan = {s.seq: Choice("plain", 0, 1.0) for s in gen}
        plain = None if pre else MIN_GAIN * self._value(plain_plan, pre_counts, unit)
        corr = 1.0 if pre else self.realized.factor(len(gen))  # drafting steps' record (engine/batch/realized.py)
        # Draft rounds hold up the whole step, prompts being read included, whose slots generate from the next
        # step on: model drafts must pay in the batch those slots make with the generating ones
        after = len(gen) + len(pre)
        plain_after = plain if not pre else MIN_GAIN * after / st.costs.relative(after)
        model_ok = self._draft_usable() and unit is not None and self._model_could_pay(after, plain_after)
        self._behind_now = {s.seq: self._behind(s) for s in gen} if model_ok else {}
        self._left = {s.seq: self._tokens_left(s) for s in gen}
        self._alone = len(gen) == 1 and not pre
        # Fair slots: with another slot generating or a prompt being read, drafts may add at most FAIR_STEP - 1
        # plain steps to the step (or, beside a stream, make it FAIR_GAP single-token decodes long where that is
        # longer), and a step that gives a request its first token takes only drafts that cost it nothing. While
        # a conversation may come back, a step nobody streams lasts at most BACKGROUND_SECONDS, alone too
        limit = None
        if self.fair_step is not None and self.chatting and not any(s.streamed for s in (*gen, *pre)):
            limit = max(self._cost(plain_plan, pre_counts, unit, whole=True), BACKGROUND_SECONDS / one)
        elif self.fair_step is not None and (len(gen) >= 2 or pre):
            limit = self._cost(plain_plan, pre_counts, unit, whole=True)
            if not first_token:
                limit += (self.fair_step - 1) * self._cost(plain_plan, [0] * self.n_slots, unit, whole=True)
                if any(s.streamed for s in gen):
                    limit = max(limit, FAIR_GAP)
        # A prompt being read joins the generating slots within a step or two; else the measured rate
        self._horizon = 1.0 if pre else self.occupancy.steps_until_growth(len(gen))
        # The best plan in the steady state (every draft cache a token or two behind). A plan that
        # drafts with the model must then still win once its caches' one-time catch-up is priced:
        # a batch where the model does not pay even when caught up never pays for catching up.
        best: dict[bool, tuple[float, dict[int, Choice]]] = {False: (0.0, {}), True: (0.0, {})}
        # Without model drafts, plans longer than the longest n-gram proposal are the same plan again
        fixed = any(s.job is not None and s.job.kind == MODEL for s in gen)  # drafts whatever the plan
        longest = max(min(len(s.lookup.tokens), caps[s.seq]) for s in gen)
        top = max(caps.values()) if model_ok or fixed else longest
        if model_ok and not fixed and self.model_k_max:  # ... and longer than the model's longest draft
            top = min(top, max(longest, self.model_k_max))
        if top == 0:
            return {}  # nothing to draft from: a plain step
        # Plans of lookups only (no prompt chunk beside them): each is priced only when its bound can beat
        # the best so far. At 8 slots on the F32 pair the planner priced 17 plans a step on average (up to
        # 65; a millisecond of Python) with the sum's bound, nearly all of them beaten before they were priced.
        bound = None
        if not model_ok and not fixed and plain is not None:
            n_gen, gains, costs = len(gen), self._lookup_gains(gen, caps), st.costs
            n_lookups = sum(1 for s in gen if s.lookup.tokens and caps[s.seq])

            def bound(j: int) -> float:
                # d <= min(n_lookups, j) slots share the gain g: the geometric mean is largest with g shared
                # evenly among as many of them as can draft (`fair_tokens`)
                g, d = gains[min(j, len(gains) - 1)], min(n_lookups, j)
                return n_gen * (1.0 + g / d) ** (d / n_gen) / costs.relative(n_gen + j) if d else 0.0

            if all(bound(j) * corr <= plain for j in range(1, len(gains))):
                return {}  # no plan of lookups can beat a plain step
        seen: set[tuple[tuple[str, int], ...]] = set()
        for m in range(1, top + 2):
            if bound is not None and m > 1:
                drafted = sum(min(m - 1, caps[s.seq], len(s.lookup.tokens)) for s in gen)
                if bound(drafted) * corr <= best[False][0]:
                    continue
            for use_model in ((False, True) if model_ok else (False,)):
                plan: dict[int, Choice] = {}
                for s in gen:
                    assert s.job is not None
                    plan[s.seq] = self._slot_choice(s, min(m - 1, caps[s.seq]), use_model)
                same = tuple((c.source, c.n) for c in plan.values())
                if same in seen:  # valued at a smaller m, as much or more (m = 1 carries MIN_GAIN): no choice changes
                    continue
                seen.add(same)
                if limit is not None and m > 1 and self._cost(plan, pre_counts, unit, whole=True) > limit:
                    continue
                value = self._value(plan, pre_counts, unit, steady=True)
                if m == 1:
                    value *= MIN_GAIN  # drafting must beat plain batching by a margin
                else:
                    value *= corr
                key = any(c.source == MODEL for c in plan.values())
                if value > best[key][0]:
                    best[key] = (value, plan)
        (v_free, free), (v_model, with_model) = best[False], best[True]
        if with_model and v_model > v_free and (v := self._value(with_model, pre_counts, unit)) * corr > v_free:
            chosen, value = with_model, v
        else:
            chosen, value = free, v_free / corr
        if limit is not None and fixed:  # a fixed draft length is kept only as far as the bound allows
            chosen = self._trim(chosen, gen, pre_counts, unit, limit)
            value = self._value(chosen, pre_counts, unit)
        if plain is not None and any(c.n for c in chosen.values()):  # the tokens/s it should bring, for the record
            self.predicted = value * sum(c.expected for c in chosen.values()) / fair_tokens(chosen) * MIN_GAIN / plain
        return chosen

    def prompt_room(self, generating: int, busy: int, pre: list[Slot]) -> int:
        """The prompt tokens this step may read (admission.py's `prompt_room` when fair, else the budget)."""
        room = self.budget - generating
        if self.fair_step is None or not pre:  # nothing to read: no pricing (it rebuilt the cost table per step)
            return room
        background = self.chatting and not any(s.streamed for s in pre)
        return min(room, prompt_room(self.state.costs, generating, busy, room, background))

    def _heads_lookup(self, s: Slot, cap: int) -> None:
        """The heads' guesses (drafters/medusa.py) replace the slot's lookup where they are worth more (for a
        heads job, always). Heads that do not pay guess only now and then (auto.py's `heads_wait`)."""
        h, score, st = s.heads, s.heads_shadow, self.state
        assert s.job is not None and s.gen is not None
        if h is None or score is None or not h.ready(len(s.context)):
            return
        if s.heads_wait > 0 and s.job.kind != HEADS:
            s.heads_wait -= 1
            return
        guess = h.propose(DraftRequest(s.context, min(cap, h.heads.n_heads), s.job.config.sampler, s.gen.rng, s.gen.eog))
        if st.learn_costs:
            st.heads_seconds = st.heads_samples.add(h.head_seconds)
        score.propose(len(s.context), guess.tokens)
        j, value = best_length(score.acceptance, st.costs, len(guess.tokens), st.heads_cost())
        lookup = best_length(s.shadow.acceptance, st.costs, len(s.lookup.tokens))[1]
        take = bool(guess.tokens) and (s.job.kind == HEADS or (j > 0 and value > lookup))
        s.heads_wait, s.lookup, s.lookup_acc = ((0, guess, score.acceptance) if take
                                                else (heads_wait(st, h.heads.n_heads), s.lookup, s.lookup_acc))

    def _lookup_gains(self, gen: list[Slot], caps: dict[int, int]) -> list[float]:
        """gains[J]: the most that J drafted lookup tokens in all can add to a step's expected tokens. A slot
        verifying j of its lookup's tokens emits E(j) = 1 + P(the first token right) + ... + P(the first j
        right) on average, terms that shrink with j: so the best J tokens add the J largest terms over all
        slots. With one pass over the len(gen) + J tokens as the least they cost, this bounds every plan
        of lookups (`plan`)."""
        terms = sorted((p for s in gen if s.lookup.tokens
                        for p in (s.lookup_acc or s.shadow.acceptance).p_run(min(len(s.lookup.tokens), caps[s.seq]))),
                       reverse=True)  # fmt: skip
        return list(itertools.accumulate(terms, initial=0.0))

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
            best = Choice(s.lookup.source or NGRAM, j, (s.lookup_acc or s.shadow.acceptance).expected(j))
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

    def _trim(self, plan: dict[int, Choice], gen: list[Slot], pre_counts: list[int], unit: float | None,
              limit: float) -> dict[int, Choice]:  # fmt: skip
        """The plan with its longest drafts shortened, a token at a time, till the step fits the fair bound."""
        plan, slots = dict(plan), {s.seq: s for s in gen}
        while self._cost(plan, pre_counts, unit, whole=True) > limit:
            seq, c = max(plan.items(), key=lambda item: item[1].n)
            if c.n == 0:
                break
            s = slots[seq]
            expected = (self.state.model.expected(c.n - 1) if c.source == MODEL
                        else (s.lookup_acc or s.shadow.acceptance).expected(c.n - 1))  # fmt: skip
            plan[seq] = Choice(c.source if c.n > 1 else "plain", c.n - 1, expected)
        return plan

    def _value(self, plan: dict[int, Choice], pre_counts: list[int], unit: float | None, steady: bool = False) -> float:
        """Expected tokens over cost (single-token target decodes) of the target batch and the draft rounds
        (`steady`: as if every draft cache were caught up but for a token or two)."""
        return fair_tokens(plan) / self._cost(plan, pre_counts, unit, steady)

    def _cost(self, plan: dict[int, Choice], pre_counts: list[int], unit: float | None, steady: bool = False,
              whole: bool = False) -> float:  # fmt: skip
        """The step's cost in single-token target decodes, as `_value` prices it; `whole`: the time the step
        takes, prompt chunks and every draft cache's whole catch-up included (the fair bound)."""
        counts = list(pre_counts)
        for seq, c in plan.items():
            counts[seq] = 1 + c.n
        cost = self._batch_cost(counts)
        full = filled(counts, list(plan))
        if sum(full) - sum(counts) <= FILLER_TOKEN_LIMIT:
            cost = min(cost, self._batch_cost(full))
        if any(pre_counts) and not whole:  # prompt chunks are paid whatever the plan: price what generation adds
            cost = max(cost - self._batch_cost(pre_counts), MIN_MARGINAL)
        drafting = {seq: c.n for seq, c in plan.items() if c.source == MODEL and c.n}
        if drafting and unit is not None:
            # Round 0 catches each draft cache up: a token or two after a model step, up to the window
            # after other steps. That longer catch-up is paid once and lets the steps after it draft, so
            # it is spread over the steps the request has left (at the draft's expected tokens a step),
            # or fewer: those expected before another request joins the batch (engine/batch/occupancy.py).
            behind = {seq: self._behind_now.get(seq, 1) for seq in drafting}
            cost += self._round(sum(min(b, 2) for b in behind.values()), unit)
            for seq, b in behind.items():
                if b > 2 and not steady:
                    steps_left = 1.0 if whole else max(1.0, min(self._left.get(seq, 1) / plan[seq].expected,
                                                                 self._horizon))  # fmt: skip
                    cost += (self._round(b, unit) - self._round(2, unit)) / steps_left
            for r in range(1, max(drafting.values())):
                cost += self._round(sum(1 for n in drafting.values() if n > r), unit)
        return cost

    def _round(self, b: int, unit: float) -> float:
        """A draft round of b tokens in the target's units: as this engine measured rounds of b (seconds
        over the target's one-token time, as the target's own measured sizes are), else calibrated."""
        live, one = self.draft_costs.measured(b), self.state.costs.one
        return live / one if live is not None and one else unit * self.draft_costs.relative(b)

    def _tokens_left(self, s: Slot) -> int:
        assert s.job is not None
        room = self.target.n_ctx - (len(s.context) - 1)
        return max(1, min(room, s.job.config.max_tokens - len(s.job.result.token_ids)))

    def catch_up(self, s: Slot) -> tuple[int, int]:
        """(the context offset the draft cache will follow, how much of context[offset:] it keeps): its
        next round decodes the rest. A cache more than the window behind re-reads only the window."""
        assert self.draft is not None
        offset = s.draft_offset
        window = min(WINDOW, self.draft.n_batch // self.n_slots)
        for _ in range(2):
            ctx = s.context[offset:]
            keep = min(self.draft.common_prefix(ctx, s.seq), len(ctx) - 1)
            if len(ctx) - keep <= window:
                break
            offset = len(s.context) - window
        return offset, keep

    def _behind(self, s: Slot) -> int:
        """Tokens the slot's draft cache must decode in its next round."""
        offset, keep = self.catch_up(s)
        return len(s.context) - offset - keep

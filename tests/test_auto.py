"""The auto drafter's controller, on numpy fakes with simulated decode costs (tests/fakes.py).

A fake's decode of n tokens "takes" call_cost + token_cost * n seconds, so the
cost tables the controller learns are the ones given here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_cli.engine.drafters import DraftRequest, ModelDrafter, NgramDrafter
from specdec_cli.engine.drafters.auto import RETRY_SHARE, AutoDrafter, AutoState
from specdec_cli.engine.estimates import Acceptance, BatchCosts, best_length, perfect_speedup
from specdec_cli.engine.events import DrafterDropped
from specdec_cli.engine.sampling import SamplerSettings
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.engine.stats import Stats
from tests.fakes import FakeModel, greedy_reference

V = 24
PROMPT = [1, 2, 3, 4, 5, 6, 1, 2, 3]

# Batch of b costs b single decodes (a CPU in exact mode, at worst): nothing can pay.
EXPENSIVE = {"call_cost": 0.0, "token_cost": 1.0}
# Batch of b costs 1 + 0.02 (b - 1) (a GPU, a bandwidth-bound target): drafting pays.
CHEAP = {"call_cost": 1.0, "token_cost": 0.02}


def state_for(target: FakeModel, draft: FakeModel | None) -> AutoState:
    """What calibration would give: the fakes' own cost tables."""
    one = target.call_cost + target.token_cost
    state = AutoState()
    state.costs = BatchCosts({b: (target.call_cost + target.token_cost * b) / one for b in range(1, 10)}, one)
    if draft is not None:
        state.draft_token_seconds = draft.call_cost + draft.token_cost
    return state


def run(target: FakeModel, draft: FakeModel | None, state: AutoState, max_tokens: int = 80, **cfg: object):
    config = GenerateOptions(adaptive=False, max_tokens=max_tokens, draft_max=8, **cfg)  # type: ignore[arg-type]
    model = ModelDrafter(draft, window=16) if draft is not None else None
    auto = AutoDrafter(NgramDrafter(1, 3), model, 8, state)
    gen = SpeculativeGenerator(target, auto, PROMPT, config)
    events = list(gen.events())
    return gen.result, Stats.of(events)


def test_expensive_verification_drafts_nothing_and_never_touches_the_draft() -> None:
    target = FakeModel(V, 512, seed=4, **EXPENSIVE)
    draft = FakeModel(V, 512, seed=4, noise=0.1, call_cost=0.5, token_cost=0.5)
    state = state_for(target, draft)
    res, stats = run(target, draft, state)
    assert res.token_ids == greedy_reference(FakeModel(V, 512, seed=4), PROMPT, 80)[0]
    assert stats.by_drafter.get("model") is None
    assert draft.decoded_tokens == 0  # paused before its first prefill: no cost at all
    assert stats.notes and "always accepted would run at 0.67x" in stats.notes[0]  # K=1: 2 / (1 + 2)
    # The n-gram lookup is only verified when its shadow score says it pays; with batches
    # this expensive even a perfect proposal only breaks even, so plain decodes win.
    assert stats.plain_steps >= stats.steps - 2
    assert all(p >= 1.0 for p in stats.predicted)


def test_cheap_verification_keeps_a_good_draft_model() -> None:
    target = FakeModel(V, 512, seed=4, **CHEAP)
    draft = FakeModel(V, 512, seed=4, noise=0.1, call_cost=0.05, token_cost=0.001)
    res, stats = run(target, draft, state_for(target, draft))
    assert res.token_ids == greedy_reference(FakeModel(V, 512, seed=4), PROMPT, 80)[0]
    assert stats.by_drafter["model"][2] >= 0.6 * len(res.token_ids)  # most tokens came from the draft model
    assert stats.accepted / stats.drafted > 0.6
    assert stats.tokens_per_step > 2.5
    assert not any("paused" in n for n in stats.notes)


def test_a_draft_that_stops_agreeing_is_paused_and_retried_within_budget() -> None:
    # A large vocabulary and a long window: text that does not repeat, so the n-gram lookup rarely helps.
    target = FakeModel(500, 4096, seed=7, window=4, **CHEAP)
    # An unrelated draft: almost never right. Its tokens cost 0.3 target tokens.
    draft = FakeModel(500, 4096, seed=99, window=4, call_cost=0.3, token_cost=0.0)
    state = state_for(target, draft)
    res, stats = run(target, draft, state, max_tokens=1500)
    assert res.token_ids == greedy_reference(FakeModel(500, 4096, seed=7, window=4), PROMPT, 1500)[0]
    assert any("paused" in n for n in stats.notes)
    retries = sum(n == "retrying the paused draft model" for n in stats.notes)
    assert retries >= 1  # paused, not abandoned
    # Time spent in the draft model after the pause (catch-ups and retry drafts) stays
    # within the retry budget: RETRY_SHARE of the generation time.
    paused_at = next(i for i, st in enumerate(res.steps) if st.note and "paused" in st.note)
    after = res.steps[paused_at + 1 :]
    spent = sum(st.t_draft for st in after)
    total = sum(st.t_draft + st.t_target for st in after)
    assert 0 < spent <= RETRY_SHARE * total


def test_controller_prefers_the_ngram_proposal_on_repetitive_text() -> None:
    target = FakeModel(V, 512, seed=11, window=1, **CHEAP)  # window 1: the text cycles, lookup is right
    res, stats = run(target, None, state_for(target, None), max_tokens=120)
    assert res.token_ids == greedy_reference(FakeModel(V, 512, seed=11, window=1), PROMPT, 120)[0]
    assert stats.by_drafter["ngram"][0] > stats.steps / 2
    assert stats.tokens_per_step > 3


def test_sampling_with_auto_keeps_every_invariant() -> None:
    target = FakeModel(V, 512, seed=4, **CHEAP)
    draft = FakeModel(V, 512, seed=4, noise=0.3, call_cost=0.05, token_cost=0.001)
    res, stats = run(target, draft, state_for(target, draft), seed=3,
                     temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)  # fmt: skip
    assert len(res.token_ids) == 80 and stats.accepted <= stats.drafted


def test_speedup_model_numbers() -> None:
    """Batch costs as measured for SmolLM2 Q4_1 on a 2-core AMD EPYC: c(2)=1.75, c(5)=3.82, c(9)=6.65."""
    costs = BatchCosts({2: 1.75, 5: 3.82, 9: 6.65})
    # A perfect free drafter: best at K = 8 (9 / 6.65 = 1.35x; c(3), c(4) interpolate).
    k, best = perfect_speedup(costs, 8)
    assert k == 8 and abs(best - 9 / 6.65) < 1e-9
    # The default pair's draft costs a target token: even a perfect one loses.
    assert perfect_speedup(costs, 8, draft_cost=1.0)[1] < 1.0
    # With 50% acceptance a free drafter should not be verified at all.
    assert best_length(Acceptance(prior=0.5), costs, 8) == (0, 1.0)


def _expected_from_counts(acc: Acceptance, k: int) -> float:
    """E(k) recomputed from position 0, as the docstring's formula reads (no cached prefix)."""
    total, prior, p = 0.0, acc.prior, 1.0
    for i in range(k):
        t = acc.tries[i] if i < len(acc.tries) else 0.0
        h = acc.hits[i] if i < len(acc.hits) else 0.0
        prior = (h + prior * acc.weight) / (t + acc.weight)
        p *= prior
        total += p
    return 1.0 + total


OPS = st.one_of(
    st.tuples(st.just("observe"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("forget"), st.floats(0.1, 1.0)),
    st.tuples(st.just("begin_proposal")),
    st.tuples(st.just("record"), st.integers(0, 9), st.booleans()),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(OPS, max_size=30), st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_acceptance_estimates_kept_between_observations_equal_a_fresh_computation(
    ops: list[tuple], ks: list[int]
) -> None:
    """The planner prices every draft length of every slot each step: E(k) and the rates are kept and
    extended between observations. They must be the very numbers a computation from scratch gives,
    bit for bit, after any mix of observations (whole or position by position, as the gate records
    them) and forgetting, whatever lengths were asked before."""
    acc = Acceptance(prior=0.6)
    for op, *args in ops:
        for k in ks:  # ask before every change, so that stale values would show
            assert acc.expected(k) == _expected_from_counts(acc, k)
        getattr(acc, op)(*args)
    for k in ks:
        assert acc.expected(k) == _expected_from_counts(acc, k)
        assert acc.rate(k) == acc._rates(k + 1)[-1]
        assert acc.p_run(k) == [acc.p_run(i)[-1] for i in range(1, k + 1)]


def test_one_slow_decode_does_not_make_batches_look_free() -> None:
    """The n-gram gate's open-ended loss: a moving average of single-token times, inflated by one
    slow decode, made c(2) look like 1.1; the gate then verified every step and, doing no plain
    decode any more, never corrected it. Medians of recent timings, and costs that never fall
    as the batch grows, keep the estimate where it belongs."""
    costs = BatchCosts()
    for t in [0.010] * 6 + [0.040]:  # one decode four times slower than the rest
        costs.observe(1, t)
    for _ in range(3):
        costs.observe(2, 0.0175)
    assert abs(costs.relative(2) - 1.75) < 1e-9
    assert costs.relative(3) >= costs.relative(2)  # unmeasured sizes follow the measured marginal cost
    # With 30% acceptance at position 1 a free drafter is not verified at all.
    assert best_length(Acceptance(prior=0.3, weight=100), costs, 8)[0] == 0
    # Noisy larger batches never make a bigger batch cheaper than a smaller one.
    for _ in range(3):
        costs.observe(5, 0.012)
    assert costs.relative(5) >= 1.75


class ColdDraft(FakeModel):
    """A draft whose first drafting calls are slow (a GPU context's first launches load kernels and capture
    graphs): `cold` calls of one or two tokens cost `extra` more each, then it runs at its own cost."""

    def __init__(self, *args: object, cold: int, extra: float, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.cold, self.extra = cold, extra

    def decode(self, tokens, n_logits=1):  # type: ignore[no-untyped-def]
        if len(tokens) <= 2 and self.cold > 0:
            self.cold -= 1
            self.decode_seconds += self.extra
        return super().decode(tokens, n_logits)


@pytest.mark.parametrize("calibrated", [True, False])
def test_a_cold_first_draft_step_does_not_pause_a_calibrated_draft(calibrated: bool) -> None:
    """Measured on an H200: a 2-layer draft's first step in a fresh context timed at 1.6 target tokens (it
    costs an eighth), auto paused it at once and never retried (a paused draft that cannot pay is not retried),
    so `specdec run` drafted 2 tokens of 128. A calibrated draft time counts as two timings in the median: one
    cold step (here far colder, so that it pauses the draft alone) cannot outvote it. Without calibration the
    one timing is all there is, and it pauses the draft (as before)."""
    target = FakeModel(V, 512, seed=4, **CHEAP)
    draft = ColdDraft(V, 512, seed=4, noise=0.1, call_cost=0.05, token_cost=0.001, cold=1, extra=20.0)
    state = state_for(target, None)
    if calibrated:
        state.calibrated_draft(draft.call_cost + draft.token_cost)
    else:
        state.draft_token_seconds = draft.call_cost + draft.token_cost
    res, stats = run(target, draft, state)
    assert res.token_ids == greedy_reference(FakeModel(V, 512, seed=4), PROMPT, 80)[0]
    paused = any("paused" in n for n in stats.notes)
    assert paused is not calibrated
    if calibrated:
        assert stats.by_drafter["model"][2] >= 0.6 * len(res.token_ids)


class NanModel(FakeModel):
    """A draft with corrupt weights: every row it returns is NaN."""

    def decode(self, tokens, n_logits=1):  # type: ignore[no-untyped-def]
        rows = super().decode(tokens, n_logits)
        return np.full_like(rows, np.nan)


def test_a_corrupt_draft_is_dropped_and_the_ngram_lookup_goes_on() -> None:
    target = FakeModel(V, 512, seed=4, **CHEAP)
    draft = NanModel(V, 512, seed=4, call_cost=0.05, token_cost=0.001)
    config = GenerateOptions(adaptive=False, max_tokens=60, draft_max=8, seed=1, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    auto = AutoDrafter(NgramDrafter(1, 3), ModelDrafter(draft, window=16), 8, state_for(target, draft))
    gen = SpeculativeGenerator(target, auto, PROMPT, config)
    events = list(gen.events())
    dropped = [e for e in events if isinstance(e, DrafterDropped)]
    assert len(dropped) == 1 and "n-gram lookup goes on alone" in dropped[0].reason
    assert gen.drafter is auto and auto.model is None
    stats = Stats.of(events)
    assert "model" not in stats.by_drafter  # nothing the corrupt draft proposed was verified
    assert stats.by_drafter["ngram"][0] > 0 and len(gen.result.token_ids) == 60


def test_without_calibration_it_times_a_plain_decode_before_drafting() -> None:
    """No calibration (SPECDEC_CALIBRATE=0): nothing prices a step until a single decode is timed.
    Before the fix every choice looked free, so it drafted forever at half the target's speed."""
    target = FakeModel(V, 512, seed=4, **EXPENSIVE)
    draft = FakeModel(V, 512, seed=4, noise=0.1, call_cost=0.5, token_cost=0.5)
    res, stats = run(target, draft, AutoState())  # no costs at all
    assert res.token_ids == greedy_reference(FakeModel(V, 512, seed=4), PROMPT, 80)[0]
    assert stats.plain_steps >= BatchCosts.MIN_SAMPLES
    # once measured, batches cost b single decodes and a draft token half a target token: plain wins.
    # Before that, a batch size not yet timed is priced by the prior, so the lookup (right every time
    # here: the fake's text cycles) tries a few sizes until they are measured (growing a few positions past
    # what it has seen at a time: 1, 2, 5, 8).
    assert stats.plain_steps >= stats.steps - 8, stats.by_drafter
    assert not any(s.drafted for s in res.steps[-20:]), [len(s.drafted) for s in res.steps]


def test_a_model_step_after_other_steps_pays_its_share_of_the_catch_up() -> None:
    """After lookup or plain steps the draft's cache is behind: the model step that follows first decodes
    what they produced. That cost, spread over the model steps that usually follow one another, is priced:
    far behind with an expensive catch-up, a plain decode wins; one token behind, the model does."""
    target = FakeModel(V, 512, seed=4, **CHEAP)
    draft = FakeModel(V, 512, seed=4, noise=0.1, call_cost=0.1, token_cost=0.01)
    state = state_for(target, draft)
    state.draft_batch_token_seconds = 0.5 * (target.call_cost + target.token_cost)  # half a target token each
    state.model_run = 2.0
    auto = AutoDrafter(NgramDrafter(1, 3), ModelDrafter(draft, window=64), 8, state)
    text = [int(t) for t in np.random.default_rng(1).integers(7, V, 60)]  # nothing for the lookup to copy
    auto.begin(text[:20])
    req = DraftRequest(text, 4, SamplerSettings(temperature=0.0), np.random.default_rng(0), frozenset())
    assert auto.propose(req).source != "model"  # 41 tokens behind: a share of 10 target tokens
    assert auto._catch_up_share(len(text)) == pytest.approx(41 * 0.5 / 2.0)
    auto.begin(text[:-1])  # caught up but for the last token
    assert auto.propose(req).source == "model"


def test_an_in_context_copy_grows_a_few_positions_past_what_came_true() -> None:
    """A copy's positions that no proposal has reached are priced a little worse than the last one seen: two
    right proposals of four tokens once priced a 40-token copy at 0.99 a position (the first run's prompt: the
    target took none of it, one step at 4.6 target tokens' cost). With the F32 pair's measured batch costs."""
    from specdec_cli.engine.drafters.gate import HIT, ShadowScore

    costs = BatchCosts({2: 1.01, 5: 1.52, 10: 2.26, 20: 3.78, 40: 5.51, 65: 6.0})
    chosen = []
    for table in (ShadowScore().tables[HIT], Acceptance()):  # the in-context table; one without `unseen`
        for _ in range(2):
            table.observe(4, 4)  # two proposals, every one of their four positions right, none known further
        chosen.append(best_length(table, costs, 40)[0])
    assert 4 < chosen[0] <= 8, chosen  # it still grows past the evidence, a few positions
    assert chosen[1] >= 2 * chosen[0], chosen  # priced as the position before, the copy ran on
    grown = ShadowScore().tables[HIT]  # once the text has shown 30 positions right, a 30-token copy is priced so
    for _ in range(2):
        grown.observe(30, 30)
    assert best_length(grown, costs, 40)[0] >= 30

"""Properties of the draft-then-verify loop, on numpy fakes (tests/fakes.py), for every drafter.

Greedy output equals the target alone, whatever the drafter proposes; stop
tokens end generation even inside an accepted run; no output past --max-tokens
or the context; after every generation the target's cache holds exactly the
context it must, and the draft's cache a prefix of it; stats add up.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_cli.engine.drafters import Drafter, DraftRequest, ModelDrafter, NgramDrafter, Outcome, Proposal
from specdec_cli.engine.drafters.policies import compose
from specdec_cli.engine.settings import GenerateOptions, SamplerSettings
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.engine.stats import Stats
from tests.fakes import FakeModel, greedy_reference

V = 24
KINDS = ("model", "ngram", "random")


class RandomDrafter:
    """Proposes arbitrary tokens (stop tokens included): the verifier must not care."""

    name = "random"
    free = True

    def __init__(self, seed: int) -> None:
        import numpy as np

        self.rng = np.random.default_rng(seed)

    def decode_seconds(self) -> float:
        return 0.0

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, req: DraftRequest) -> Proposal:
        from specdec_cli.engine.sampling import Dist

        toks = [int(t) for t in self.rng.integers(0, V, size=int(self.rng.integers(0, req.k + 1)))]
        return Proposal(toks, [Dist.point(t) for t in toks], req.k, self.name)

    def accept(self, outcome: Outcome) -> None:
        pass


class CheckedModelDrafter(ModelDrafter):
    """A model drafter whose cache is checked at every proposal: it holds the
    conversation exactly (rejected tokens gone), then the draft's own tokens."""

    def propose(self, req: DraftRequest) -> Proposal:
        proposal = super().propose(req)
        ctx = list(req.context)
        assert self.model.tokens[: len(ctx)] == ctx
        assert self.model.tokens[len(ctx) :] == proposal.tokens[:-1]
        return proposal


def make_drafter(kind: str, draft: FakeModel, seed: int) -> Drafter:
    if kind == "model":
        return CheckedModelDrafter(draft)
    if kind == "ngram":
        return NgramDrafter(1, 3)
    return RandomDrafter(seed)


cases = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(KINDS),
        "prompt": st.lists(st.integers(0, V - 1), min_size=1, max_size=12),
        "max_tokens": st.integers(1, 40),
        "draft_max": st.integers(1, 8),
        "adaptive": st.booleans(),
        "noise": st.sampled_from([0.0, 0.3, 1.0]),
        "eog": st.sets(st.integers(0, V - 1), max_size=2),
        "n_ctx": st.integers(13, 64),
        "seed": st.integers(0, 2**16),
    }
)


def run_case(c: dict, sampler: SamplerSettings | None = None):
    target = FakeModel(V, c["n_ctx"], seed=c["seed"], eog=sorted(c["eog"]))
    draft = FakeModel(V, c["n_ctx"] + 16, seed=c["seed"], noise=c["noise"], eog=sorted(c["eog"]))
    config = GenerateOptions(
        max_tokens=c["max_tokens"],
        draft_max=c["draft_max"],
        adaptive=c["adaptive"],
        **vars(sampler or SamplerSettings()),
        seed=c["seed"],
    )
    drafter = compose(make_drafter(c["kind"], draft, c["seed"]), config)
    gen = SpeculativeGenerator(target, drafter, c["prompt"], config)
    events = list(gen.events())
    return target, draft, gen.result, events


def check_invariants(c: dict, target: FakeModel, draft: FakeModel, res, events) -> None:
    prompt, out = c["prompt"], res.token_ids
    assert len(out) <= c["max_tokens"]
    assert not set(out) & c["eog"], "a stop token was emitted"
    assert (res.stop_reason == "length") == (len(out) == c["max_tokens"])
    # The target's cache holds the context but its last, pending token. After a
    # stop token that token is the pending one, unless it was an accepted draft
    # token: then it (and what was verified after it) stays cached, never emitted.
    n = len(prompt) + len(out)
    assert len(target.tokens) <= target.n_ctx
    if res.stop_reason == "eos":
        assert target.tokens[:n] == prompt + out
        assert len(target.tokens) == n or target.tokens[n] in c["eog"]
    else:
        assert target.tokens == (prompt + out)[:-1]
    # Stats add up: every emitted token counted once, accepted <= drafted.
    stats = Stats.of(events)
    assert stats.emitted == len(out)
    assert stats.accepted <= stats.drafted
    if stats.steps:  # tokens per pass: the end token counts as the last pass's product, once
        assert stats.tokens_per_step == pytest.approx((len(out) + (res.stop_reason == "eos")) / stats.steps)
    assert sum(len(s.emitted) for s in res.steps) == len(out)
    for s in res.steps:
        assert s.n_accepted <= len(s.drafted) <= max(s.k, 0)
        assert sum(t.source == "draft" for t in s.emitted) <= s.n_accepted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_greedy_equals_target_alone(c: dict) -> None:
    target, draft, res, events = run_case(c)
    ref_target = FakeModel(V, c["n_ctx"], seed=c["seed"], eog=sorted(c["eog"]))
    expected, why = greedy_reference(ref_target, c["prompt"], c["max_tokens"])
    assert res.token_ids == expected
    assert res.stop_reason == why
    check_invariants(c, target, draft, res, events)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases, st.sampled_from([0.5, 1.0, 2.0]))
def test_sampled_runs_keep_every_invariant(c: dict, temperature: float) -> None:
    target, draft, res, events = run_case(c, SamplerSettings(temperature, top_k=0, top_p=1.0, min_p=0.0))
    check_invariants(c, target, draft, res, events)


def test_a_stop_token_inside_an_accepted_run_ends_generation() -> None:
    """The draft proposes [a, EOS, b]: the target accepts all three, only `a` is emitted."""
    target = FakeModel(V, 64, seed=5)
    context = [1, 2]
    a = int(target.logits_after(context).argmax())
    eos = int(target.logits_after([*context, a]).argmax())
    target = FakeModel(V, 64, seed=5, eog=[eos])
    b = int(target.logits_after([*context, a, eos]).argmax())

    class Scripted(RandomDrafter):
        def propose(self, req: DraftRequest) -> Proposal:
            from specdec_cli.engine.sampling import Dist

            return Proposal([a, eos, b], [Dist.point(t) for t in (a, eos, b)], req.k, "scripted")

    gen = SpeculativeGenerator(target, Scripted(0), context, GenerateOptions(adaptive=False, max_tokens=10, draft_max=3))
    events = list(gen.events())
    assert gen.result.token_ids == [a]
    assert gen.result.stop_reason == "eos"
    (step,) = gen.result.steps
    assert step.n_accepted == 2  # a and the stop token were consumed; b was not
    assert Stats.of(events).emitted == 1


def test_a_plain_run_ending_on_the_end_token_makes_one_token_per_pass() -> None:
    """The pass that chose the end token produced it: a plain run reads 1.00 tokens per pass, not n / (n + 1)."""
    out, _ = greedy_reference(FakeModel(V, 64, seed=5), [1, 2], 12)
    target = FakeModel(V, 64, seed=5, eog=[out[6]])
    gen = SpeculativeGenerator(target, None, [1, 2], GenerateOptions(adaptive=False, max_tokens=12))
    stats = Stats.of(list(gen.events()))
    assert gen.result.stop_reason == "eos" and stats.emitted < stats.steps
    assert stats.tokens_per_step == 1.0


def test_batches_are_what_was_verified() -> None:
    """Every target decode after prefill is [pending, drafts...]: k + 1 tokens, never more than draft_max + 1."""
    target = FakeModel(V, 256, seed=3)
    draft = FakeModel(V, 256, seed=3, noise=0.3)
    config = GenerateOptions(max_tokens=60, draft_max=5, adaptive=True)
    gen = SpeculativeGenerator(target, compose(ModelDrafter(draft), config), [4, 5, 6], config)
    list(gen.events())
    verify_batches = target.batches[1:]  # the first is the prefill
    assert verify_batches == [len(s.drafted) + 1 for s in gen.result.steps]
    assert max(verify_batches) <= 6
    # A draft this close to the target gets most of its tokens accepted.
    assert sum(s.n_accepted for s in gen.result.steps) > len(gen.result.token_ids) / 2


def test_cancellation_leaves_both_caches_consistent() -> None:
    target = FakeModel(V, 256, seed=9)
    draft = FakeModel(V, 256, seed=9, noise=0.3)
    steps = 0

    def stop() -> bool:
        return steps >= 3

    config = GenerateOptions(adaptive=False, max_tokens=100, draft_max=4)
    gen = SpeculativeGenerator(target, ModelDrafter(draft), [1, 2, 3], config, should_stop=stop)
    for ev in gen.events():
        steps += ev.__class__.__name__ == "Step"
    res = gen.result
    assert res.stop_reason == "interrupted" and len(res.steps) == 3
    assert target.tokens == [1, 2, 3, *res.token_ids][:-1]
    ctx = [1, 2, 3, *res.token_ids]
    assert draft.tokens == ctx[: len(draft.tokens)]
    # Going on from here (as the API does for the next call) reuses both caches.
    expected, _ = greedy_reference(FakeModel(V, 256, seed=9), ctx, 5)
    gen2 = SpeculativeGenerator(target, ModelDrafter(draft), ctx, GenerateOptions(adaptive=False, max_tokens=5, draft_max=4))
    before = target.decoded_tokens
    list(gen2.events())
    assert gen2.result.token_ids == expected
    # The prefill evaluated nothing: the cache already held ctx[:-1].
    assert target.decoded_tokens - before == sum(len(s.drafted) + 1 for s in gen2.result.steps)



@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=700), st.data())
def test_first_difference_finds_the_first_differing_index(a: list[int], data: st.DataObject) -> None:
    """The cache's common prefix (engine/kv_cache.py): where two token lists first differ, found from the end."""
    from specdec_cli.engine.kv_cache import first_difference

    i = data.draw(st.integers(0, len(a) - 1))
    tail = data.draw(st.lists(st.integers(0, 3), min_size=len(a) - i - 1, max_size=len(a) - i - 1))
    b = [*a[:i], a[i] + 1, *tail]
    assert first_difference(a, b, len(a)) == i == first_difference(b, a, len(a))


class LogitsTarget(FakeModel):
    """Greedy's rows handed to the verifier as logits (its general path), not as argmaxes."""

    def decode_argmax(self, tokens: list[int], n_logits: int = 1) -> object:  # type: ignore[override]
        return self.decode(tokens, n_logits)


@pytest.mark.parametrize(("seed", "max_tokens", "eos_at"), [(5, 12, None), (5, 12, 6), (3, 1, None), (7, 30, 0)])
def test_a_plain_greedy_steps_short_way_records_what_verification_records(seed: int, max_tokens: int,
                                                                         eos_at: int | None) -> None:  # fmt: skip
    """Plain greedy steps (no drafts, the argmaxes given) are verified without comparing or rolling back
    (`SpeculativeGenerator._plain`): the same tokens, steps, stops and cache as the general verification of the
    same rows' logits, whether the run ends on the length, on the end token, or at once."""
    out, _ = greedy_reference(FakeModel(V, 64, seed=seed), [1, 2], max_tokens)
    eog = [] if eos_at is None else [out[eos_at]]
    runs = []
    for cls in (FakeModel, LogitsTarget):
        target = cls(V, 64, seed=seed, eog=eog)
        gen = SpeculativeGenerator(target, None, [1, 2], GenerateOptions(adaptive=False, max_tokens=max_tokens))
        steps = [(e.index, e.k, e.drafted, e.n_accepted, e.emitted, e.stop, e.drafter, e.t_draft)
                 for e in gen.events() if hasattr(e, "emitted")]  # fmt: skip
        runs.append((steps, gen.result.token_ids, gen.result.text, gen.result.stop_reason, target.tokens))
    assert runs[0] == runs[1] and runs[0][0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=4), min_size=1, max_size=12))
def test_emitted_text_is_the_incremental_decoders(pieces: list[bytes]) -> None:
    """`_emit`'s text per token (a whole piece decoded at once where no character is held back) is what an
    incremental UTF-8 decoder gives token by token: characters split across pieces, invalid bytes replaced."""
    import codecs

    target = FakeModel(n_vocab=len(pieces) + 1)
    target.token_text = pieces.__getitem__  # type: ignore[method-assign]
    options = GenerateOptions(max_tokens=100)
    gen = SpeculativeGenerator(target, None, [len(pieces)], options)
    emitted, stop = gen._emit(range(len(pieces)), ["target"] * len(pieces))
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    assert [e.text for e in emitted] == [decoder.decode(p) for p in pieces] and stop is None

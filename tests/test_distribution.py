"""Sampling is lossless: emitted tokens follow the target's processed distribution.

The draft model on the real models: target SmolLM2 Q4_1, draft its Q2_K requantization (they
disagree often enough that rejections and residual resampling happen at every position), K=2, temperature 1,
top-k 20. Position 1 is tested unconditionally; position 2 given the most likely
first token. Each is a chi-square goodness-of-fit test against the distribution
computed from the target's own logits; it fails below p = 1e-3.

The same harness with a planted bug (resampling from p instead of max(0, p - q)) gives
p-values far below the threshold: `python -m benchmarks.planted_bug` shows it. The n-gram lookup's
and the auto drafter's tests run on the fake (tests/fakes.py: numpy logits, the real sampler and
loop) and assert that the planted bug fails them; `--drafter ngram|auto` runs them on the real models.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from specdec_cli.engine import sampling
from specdec_cli.engine.drafters import DraftRequest, ModelDrafter, NgramDrafter, Proposal
from specdec_cli.engine.drafters.auto import AutoDrafter, AutoState
from specdec_cli.engine.drafters.pool import TokenPool
from specdec_cli.engine.estimates import BatchCosts
from specdec_cli.engine.model import Model
from specdec_cli.models import packaged
from tests import distribution
from tests.fakes import N_BYTES, FakeGGUF

N_SAMPLES = 1200


def test_sampled_tokens_follow_target_distribution(smol: Model, smol_q2k: Model) -> None:
    results = distribution.run(smol, ModelDrafter(smol_q2k), N_SAMPLES)
    for r in results:
        assert r.n >= 200, f"too few samples at position {r.position}: {r.n}"
        assert r.pvalue > distribution.P_THRESHOLD, r


def repeated_text(target: FakeGGUF) -> str:
    """A text that repeats its own start, so the n-gram lookup proposes the fake's likely next tokens (its
    greedy continuation): X + X[:30], where X is the fake's greedy text after "ok". The fake's logits
    depend on the last 24 tokens, which are the same as when X was generated."""
    ctx = list(b"ok")
    for _ in range(40):
        row = target.logits_after(ctx)
        row[N_BYTES:] = -np.inf  # bytes only: no control tokens in the text
        ctx.append(int(np.argmax(row)))
    x = bytes(ctx).decode()
    return x + x[:30]


def test_sampled_tokens_follow_target_distribution_with_ngram_drafter(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the fake (its logits are numpy's; the sampler and the loop are the real ones): the n-gram lookup's
    point-mass drafts, accepted with p(x) and otherwise resampled from p without x. The same harness on
    the real models: `python -m benchmarks.planted_bug --drafter ngram`; and the auto drafter's test below
    mixes n-gram drafts with the draft model's on them."""
    target = FakeGGUF(packaged.smollm2_path(), n_ctx=512)
    text = repeated_text(target)
    drafter = NgramDrafter(2, 4)
    drafter.begin(target.tokenize(text, add_special=True, parse_special=True))
    assert len(drafter.lookup(2)) == 2, "the text must give the drafter something to propose"
    results = distribution.run(target, drafter, N_SAMPLES, text=text)
    for r in results:
        assert r.n >= 200, f"too few samples at position {r.position}: {r.n}"
        assert r.pvalue > distribution.P_THRESHOLD, r
    # The test can fail: resampling from p instead of p without the rejected token is caught.
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)
    bugged = distribution.run(target, NgramDrafter(2, 4), N_SAMPLES, text=text)
    assert min(r.pvalue for r in bugged) < distribution.P_THRESHOLD, bugged


class _FrozenCosts(BatchCosts):
    """Costs that do not learn: verification and drafting stay cheap, so auto keeps choosing to draft."""

    def observe(self, batch: int, seconds: float) -> None:
        pass


class _CountingAuto(AutoDrafter):
    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.chosen: Counter[str] = Counter()

    def propose(self, req: DraftRequest) -> Proposal:
        proposal = super().propose(req)
        self.chosen[proposal.source or "plain"] += 1
        self.state.draft_token_seconds = 0.35  # frozen too: a draft token costs 0.35 target tokens
        return proposal


def test_sampled_tokens_follow_target_distribution_with_auto_drafter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The auto drafter switches between the draft model and the n-gram lookup (here with a token pool:
    earlier texts, pool.py) from what it has seen in earlier samples: the choice must not leak into the
    distribution. On the fake (a draft fake is the target's function plus noise); the same on the real
    models: `python -m benchmarks.planted_bug --drafter auto`."""
    target = FakeGGUF(Path("target.gguf"), n_ctx=512)
    draft = FakeGGUF(Path("draft.gguf"), n_ctx=512)
    text = repeated_text(target)
    prompt = target.tokenize(text, add_special=True, parse_special=True)
    # The pool holds the prompt and a sampled continuation: its match is longer than the context's,
    # so it drafts at the first step (point masses of likely tokens, not the greedy ones).
    earlier, rng = list(prompt), np.random.default_rng(0)
    for _ in range(8):
        d = sampling.process(target.logits_after(earlier), distribution.SAMPLER)
        earlier.append(int(rng.choice(d.ids, p=d.probs)))
    pool = TokenPool()
    pool.add(earlier)
    assert pool.propose(prompt, 2)[1] > 4, "the pool's match must beat the context's"

    def run() -> tuple[list[distribution.ChiSquare], Counter[str]]:
        # Cheap verification, a draft token at 0.35 target tokens: the lookup wins where it has a
        # proposal it has been right about, the draft model elsewhere, plain decodes when neither pays.
        state = AutoState(costs=_FrozenCosts({b: 1 + 0.1 * (b - 1) for b in range(1, 10)}, 1.0))
        state.draft_token_seconds = 0.35
        drafter = _CountingAuto(NgramDrafter(2, 4, pool=pool), ModelDrafter(draft, window=64), 2, state)
        return distribution.run(target, drafter, N_SAMPLES, text=text), drafter.chosen

    results, chosen = run()
    assert chosen["model"] > 100 and chosen["ngram"] > 100, chosen
    for r in results:
        assert r.n >= 200, f"too few samples at position {r.position}: {r.n}"
        assert r.pvalue > distribution.P_THRESHOLD, r
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)  # the planted bug is caught
    assert min(r.pvalue for r in run()[0]) < distribution.P_THRESHOLD

"""Sampling is lossless on the real models: emitted tokens follow the target's processed distribution.

Target SmolLM2 Q4_1, draft its Q2_K requantization (they disagree often enough that
rejections and residual resampling happen at every position), K=2, temperature 1,
top-k 20. Position 1 is tested unconditionally; position 2 given the most likely
first token. Each is a chi-square goodness-of-fit test against the distribution
computed from the target's own logits; it fails below p = 1e-3.

The same harness with a planted bug (resampling from p instead of max(0, p - q)) gives
p-values far below the threshold: `python -m benchmarks.planted_bug` shows it.
"""

from __future__ import annotations

from specdec_cli.engine.drafters import ModelDrafter, NgramDrafter
from specdec_cli.engine.model import Model
from tests import distribution

N_SAMPLES = 1200


def test_sampled_tokens_follow_target_distribution(smol: Model, smol_q2k: Model) -> None:
    results = distribution.run(smol, ModelDrafter(smol_q2k), N_SAMPLES)
    for r in results:
        assert r.n >= 200, f"too few samples at position {r.position}: {r.n}"
        assert r.pvalue > distribution.P_THRESHOLD, r


def test_sampled_tokens_follow_target_distribution_with_ngram_drafter(smol: Model) -> None:
    drafter = NgramDrafter(2, 4)
    drafter.prefill(smol.tokenize(distribution.NGRAM_PROMPT, add_special=True, parse_special=True))
    assert len(drafter.lookup(2)) == 2, "the prompt must give the drafter something to propose"
    results = distribution.run(smol, drafter, N_SAMPLES, text=distribution.NGRAM_PROMPT)
    for r in results:
        assert r.n >= 200, f"too few samples at position {r.position}: {r.n}"
        assert r.pvalue > distribution.P_THRESHOLD, r

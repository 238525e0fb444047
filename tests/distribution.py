"""Sampling-mode losslessness on real models: a chi-square test of emitted tokens against
the target's processed distribution. Shared by the test suite and by the planted-bug check
in scripts/ (which must make this test fail)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy import stats as sstats  # type: ignore[import-untyped]

from specdec_cli.engine.drafters import Drafter
from specdec_cli.engine.model import Model
from specdec_cli.engine.sampling import SamplerSettings, process
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import generate

SAMPLER = SamplerSettings(temperature=1.0, top_k=20, top_p=1.0, min_p=0.0)
PROMPT = "My favourite animal is the"
# For the n-gram drafter: the last two tokens, "is the", occurred before, followed by
# " cat.", so it proposes " cat" then "." as point masses; the target accepts x with
# probability p(x) and otherwise resamples from p without x.
NGRAM_PROMPT = "My favourite animal is the cat. Your favourite animal is the"
P_THRESHOLD = 1e-3  # a correct engine fails one such test in a thousand


@dataclass
class ChiSquare:
    position: int
    n: int
    pvalue: float
    bins: int


def chi_square(counts: Counter[int], probs: dict[int, float], position: int) -> ChiSquare:
    n = sum(counts.values())
    big = [t for t, p in probs.items() if p * n >= 5]
    observed = [counts.get(t, 0) for t in big]
    expected = [probs[t] * n for t in big]
    rest_obs = n - sum(observed)
    rest_exp = n - sum(expected)
    if rest_exp >= 1e-9:
        observed.append(rest_obs)
        expected.append(rest_exp)
    elif rest_obs:
        return ChiSquare(position, n, 0.0, len(big))  # a token with zero target probability
    _, pvalue = sstats.chisquare(observed, np.array(expected) * n / sum(expected))
    return ChiSquare(position, n, float(pvalue), len(observed))


def target_dist(target: Model, context: list[int]) -> dict[int, float]:
    target.reset()
    row = target.decode(context)[0]
    d = process(row, SAMPLER)
    target.reset()
    return {int(i): float(p) for i, p in zip(d.ids, d.probs, strict=True)}


def reference(target: Model, text: str = PROMPT) -> tuple[list[int], dict[int, float], int, dict[int, float]]:
    """(prompt tokens, the target's distribution at position 1, its most likely first token,
    the distribution at position 2 after that token)."""
    prompt = target.tokenize(text, add_special=True, parse_special=True)
    p1 = target_dist(target, prompt)
    mode = max(p1, key=lambda t: p1[t])
    return prompt, p1, mode, target_dist(target, prompt + [mode])


def run(target: Model, drafter: Drafter, n_samples: int, draft_max: int = 2, text: str = PROMPT) -> list[ChiSquare]:
    """Position 1 unconditionally, position 2 given the most likely first token."""
    prompt, p1, mode, p2 = reference(target, text)
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    for seed in range(n_samples):
        cfg = GenerateOptions(adaptive=False, max_tokens=3, draft_max=draft_max, **vars(SAMPLER), seed=seed)
        ids = generate(target, drafter, prompt, cfg).token_ids
        first[ids[0]] += 1
        if ids[0] == mode and len(ids) > 1:
            second[ids[1]] += 1
    return [chi_square(first, p1, 1), chi_square(second, p2, 2)]

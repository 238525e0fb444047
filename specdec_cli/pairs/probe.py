"""`pair-check --probe`: measure a pair, predict its speedup for each K, then check the prediction.

The model (after Leviathan et al.): with per-token acceptance a, a step
that drafts K tokens emits E(K) = (1 - a^(K+1)) / (1 - a) tokens on average and
costs K draft decodes plus one target batch of K+1 tokens. In units of one
target token:

    speedup(K) = E(K) / (K * c_draft + c_verify(K + 1))

a is measured as greedy agreement: along the target's own greedy output, how often
the draft's argmax is the target's token. c_draft and c_verify(b) are timed
(engine/costs.py); the check runs the recommended K through the API, whose stats
give both speeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdec_cli.api import Generation, Speculator
from specdec_cli.engine.costs import batch_costs, median_decode_seconds
from specdec_cli.engine.estimates import Acceptance, BatchCosts, step_speedup
from specdec_cli.engine.settings import MODEL, NONE

PROBE_PROMPTS = {
    "code": "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "chat": "Hi! Can you suggest three names for a pet cat, and say why?",
    "prose": "Describe a quiet morning in a small fishing village.",
    "input-grounded": (
        "Here is a note: 'The meeting moved from Tuesday to Thursday at 3 pm in room 204. "
        "Bring the quarterly report and the budget draft.' Repeat the note's key facts as a list."
    ),
}
MAX_K = 8


@dataclass(frozen=True)
class Prediction:
    k: int
    verify_cost: float  # target batch of k+1 tokens, in target tokens
    tokens_per_step: float
    speedup: float


@dataclass(frozen=True)
class ProbeResult:
    acceptance: float
    n_tokens: int
    draft_cost: float
    target_ms: float
    predictions: list[Prediction]
    recommended_k: int
    predicted_speedup: float
    measured_speedup: float
    measured_acceptance: float
    spec_tps: float
    base_tps: float


def predict(a: float, draft_cost: float, verify_cost: dict[int, float]) -> list[Prediction]:
    """The auto drafter's speedup model (engine/estimates.py), with acceptance a at every position."""
    acc, costs = Acceptance(prior=a), BatchCosts(verify_cost)
    out = []
    for k in range(1, MAX_K + 1):
        e = acc.expected(k)
        out.append(Prediction(k, costs.relative(k + 1), e, step_speedup(e, k, draft_cost, costs)))
    return out


def _throughput(runs: list[Generation]) -> float:
    seconds = sum(g.stats.generation_seconds for g in runs)
    return sum(len(g.token_ids) for g in runs) / seconds if seconds else 0.0


def run_probe(spec: Speculator, *, n_tokens: int = 48) -> ProbeResult:
    target, draft = spec.target, spec.draft
    assert draft is not None, "the probe needs a draft model"
    prompts = [spec.tokenize(text) for text in PROBE_PROMPTS.values()]

    # Target alone: its greedy output (the path to score the draft on) and its speed.
    base = [spec.generate(p, drafter=NONE, max_tokens=n_tokens) for p in prompts]
    agree = total = 0
    if spec.cross:
        # Different tokenizers: the draft's argmax is not a target token; score one-token drafts
        # (re-tokenized as the drafter does) verified by the target, along the same greedy paths.
        for p in prompts:
            one = spec.generate(p, drafter=MODEL, draft_max=1, adaptive=False, max_tokens=n_tokens)
            agree += one.stats.accepted
            total += one.stats.drafted
    else:
        for prompt, g in zip(prompts, base, strict=True):
            path = g.token_ids
            if not path:
                continue
            draft.prefill(prompt.ids[:-1])
            rows = draft.decode([prompt.ids[-1], *path[:-1]], n_logits=len(path))
            agree += int(np.count_nonzero(rows.argmax(axis=1) == np.asarray(path)))
            total += len(path)
    a = agree / total if total else 0.0

    # Costs, in units of one target token.
    ctx, probe_ids = prompts[0].ids, prompts[-1].ids[: MAX_K + 1]
    t1, verify = batch_costs(target, ctx, probe_ids, MAX_K + 1)
    if spec.cross:  # the draft reads its own tokens of the same text
        d_ctx = spec.draft_tokens(ctx)
        d1 = median_decode_seconds(draft, d_ctx, d_ctx[-1:], 15)
    else:
        d1 = median_decode_seconds(draft, ctx, probe_ids[:1], 15)
    preds = predict(a, d1 / t1, verify)
    best = max(preds, key=lambda p: p.speedup)

    # Check the recommendation for real, on the same prompts.
    spec_runs = [
        spec.generate(p, drafter=MODEL, draft_max=best.k, adaptive=False, max_tokens=n_tokens) for p in prompts
    ]
    drafted = sum(g.stats.drafted for g in spec_runs)
    accepted = sum(g.stats.accepted for g in spec_runs)
    base_tps, spec_tps = _throughput(base), _throughput(spec_runs)
    return ProbeResult(
        acceptance=a,
        n_tokens=total,
        draft_cost=d1 / t1,
        target_ms=t1 * 1000,
        predictions=preds,
        recommended_k=best.k,
        predicted_speedup=best.speedup,
        measured_speedup=spec_tps / base_tps if base_tps else 0.0,
        measured_acceptance=accepted / drafted if drafted else 0.0,
        spec_tps=spec_tps,
        base_tps=base_tps,
    )

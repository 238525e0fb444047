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

import time
from dataclasses import dataclass

import numpy as np

from specdec_cli.api import Generation, PromptTokens, Speculator
from specdec_cli.engine.costs import batch_costs, median_decode_seconds
from specdec_cli.engine.estimates import Acceptance, BatchCosts, step_speedup
from specdec_cli.engine.heads import chain_rates, decode_hidden, targets_for
from specdec_cli.engine.settings import HEADS, MODEL, NONE

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


def _check(spec: Speculator, prompts: list[PromptTokens], base: list[Generation], drafter: str, k: int,
           n_tokens: int) -> dict[str, float]:  # fmt: skip
    """The recommended draft length run for real on the same prompts, against the target alone's runs (`base`):
    the measured fields of a probe's result."""
    runs = [spec.generate(p, drafter=drafter, draft_max=k, adaptive=False, max_tokens=n_tokens) for p in prompts]
    drafted, accepted = sum(g.stats.drafted for g in runs), sum(g.stats.accepted for g in runs)
    base_tps, spec_tps = _throughput(base), _throughput(runs)
    return {"measured_speedup": spec_tps / base_tps if base_tps else 0.0,
            "measured_acceptance": accepted / drafted if drafted else 0.0, "spec_tps": spec_tps, "base_tps": base_tps}


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

    return ProbeResult(
        acceptance=a,
        n_tokens=total,
        draft_cost=d1 / t1,
        target_ms=t1 * 1000,
        predictions=preds,
        recommended_k=best.k,
        predicted_speedup=best.speedup,
        **_check(spec, prompts, base, MODEL, best.k, n_tokens),
    )


@dataclass(frozen=True)
class HeadsProbeResult:
    """`pair-check --probe --heads`: the heads measured as the draft is, a draft of k guesses per step."""

    chain: list[float]  # P(heads 1..j all right) along the target's greedy output, j = 1..K
    n_positions: int
    guess_cost: float  # a guess of every head, in target tokens
    target_ms: float
    predictions: list[Prediction]
    recommended_k: int
    predicted_speedup: float
    measured_speedup: float
    measured_acceptance: float
    spec_tps: float
    base_tps: float


def run_heads_probe(spec: Speculator, *, n_tokens: int = 48) -> HeadsProbeResult:
    """The heads' guesses scored along the target's own greedy answers to the probe prompts (hidden states read
    once more with the embeddings output on), their time, the speedup predicted per draft length
    E(k) / (c_guess + c_verify(k+1)), and the recommended length run for real with `--drafter heads`."""
    heads, target = spec.heads, spec.target
    assert heads is not None, "the heads probe needs heads"
    prompts = [spec.tokenize(text) for text in PROBE_PROMPTS.values()]
    base = [spec.generate(p, drafter=NONE, max_tokens=n_tokens) for p in prompts]
    hidden, labels = [], []
    for prompt, g in zip(prompts, base, strict=True):
        if not g.token_ids:
            continue
        text = np.array(prompt.ids + g.token_ids, np.int64)
        target.rollback(0)
        h = decode_hidden(target, list(text))[1]
        start = len(prompt.ids) - 1  # the state that gave the first answer token
        hidden.append(h[start:])
        labels.append(targets_for(text, heads.n_heads)[:, start:])
    target.rollback(0)
    h_all = np.concatenate(hidden) if hidden else np.zeros((0, heads.n_embd), np.float32)
    chain = chain_rates(heads, h_all, np.concatenate(labels, axis=1) if labels else np.zeros((heads.n_heads, 0)))
    ctx, probe_ids = prompts[0].ids, prompts[-1].ids[: heads.n_heads + 1]
    t1, verify = batch_costs(target, ctx, probe_ids, heads.n_heads + 1)
    row = h_all[0] if len(h_all) else np.zeros(heads.n_embd, np.float32)
    t0 = time.perf_counter()
    for _ in range(20):
        heads.guess(row, heads.n_heads)
    guess = (time.perf_counter() - t0) / 20 / t1
    costs = BatchCosts(verify)
    preds = []
    for k in range(1, heads.n_heads + 1):
        e = 1.0 + sum(chain[:k])
        preds.append(Prediction(k, costs.relative(k + 1), e, e / (guess + costs.relative(k + 1))))
    best = max(preds, key=lambda p: p.speedup)
    return HeadsProbeResult(chain, len(h_all), guess, t1 * 1000, preds, best.k, best.speedup,
                            **_check(spec, prompts, base, HEADS, best.k, n_tokens))  # fmt: skip

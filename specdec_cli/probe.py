"""`pair-check --probe`: measure a pair, predict its speedup for each K, then check the prediction.

The model (FACTS.md, after Leviathan et al.): with per-token acceptance a, a step
that drafts K tokens emits E(K) = (1 - a^(K+1)) / (1 - a) tokens on average and
costs K draft decodes plus one target batch of K+1 tokens. In units of one
target token:

    speedup(K) = E(K) / (K * c_draft + c_verify(K + 1))

a is measured as greedy agreement: along the target's own greedy output, how often
the draft's argmax is the target's token. c_draft and c_verify(b) are timed here.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec_cli import runner
from specdec_cli.engine.drafters import ModelDrafter
from specdec_cli.engine.model import Model
from specdec_cli.engine.speculative import GenerationConfig, generate

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


def expected_tokens(a: float, k: int) -> float:
    if a >= 1.0:
        return float(k + 1)
    return (1 - a ** (k + 1)) / (1 - a)


def predict(a: float, draft_cost: float, verify_cost: dict[int, float]) -> list[Prediction]:
    out = []
    for k in range(1, MAX_K + 1):
        e = expected_tokens(a, k)
        out.append(Prediction(k, verify_cost[k + 1], e, e / (k * draft_cost + verify_cost[k + 1])))
    return out


def _median_decode_seconds(m: Model, base: list[int], batch: list[int], repeats: int) -> float:
    m.prefill(base)
    times = []
    for _ in range(repeats):
        m.rollback(len(base))
        t0 = time.perf_counter()
        m.decode(batch, n_logits=len(batch))
        times.append(time.perf_counter() - t0)
    m.rollback(len(base))
    return statistics.median(times)


def run_probe(
    target_path: Path, draft_path: Path, *, n_ctx: int = 2048, n_threads: int | None = None, n_tokens: int = 48
) -> ProbeResult:
    with (
        Model(target_path, n_ctx=n_ctx, n_threads=n_threads) as target,
        Model(draft_path, n_ctx=n_ctx, n_threads=n_threads) as draft,
    ):
        prompts = [
            runner.tokenize_prompt(target, text, use_chat=None, system=None)[0] for text in PROBE_PROMPTS.values()
        ]

        # Target alone: its greedy output (the path to score the draft on) and its speed.
        base_tokens, base_seconds = 0, 0.0
        agree, total = 0, 0
        for prompt in prompts:
            res = generate(target, None, prompt, GenerationConfig(max_tokens=n_tokens))
            base_tokens += len(res.token_ids)
            base_seconds += sum(s.t_draft + s.t_target + s.t_other for s in res.steps)
            path = res.token_ids
            if not path:
                continue
            draft.reset()
            draft.prefill(prompt[:-1])
            rows = draft.decode([prompt[-1], *path[:-1]], n_logits=len(path))
            agree += int(np.count_nonzero(rows.argmax(axis=1) == np.asarray(path)))
            total += len(path)
        a = agree / total if total else 0.0

        # Costs, in units of one target token.
        base = prompts[0]
        probe_ids = prompts[-1][: MAX_K + 1]
        t1 = _median_decode_seconds(target, base, probe_ids[:1], 15)
        d1 = _median_decode_seconds(draft, base, probe_ids[:1], 15)
        verify = {b: _median_decode_seconds(target, base, probe_ids[:b], 9) / t1 for b in range(1, MAX_K + 2)}
        preds = predict(a, d1 / t1, verify)
        best = max(preds, key=lambda p: p.speedup)

        # Check the recommendation for real, on the same prompts.
        spec_tokens, spec_seconds, drafted, accepted = 0, 0.0, 0, 0
        drafter = ModelDrafter(draft)
        for prompt in prompts:
            res = generate(target, drafter, prompt, GenerationConfig(max_tokens=n_tokens, draft_max=best.k))
            spec_tokens += len(res.token_ids)
            spec_seconds += sum(s.t_draft + s.t_target + s.t_other for s in res.steps)
            drafted += sum(len(s.drafted) for s in res.steps)
            accepted += sum(s.n_accepted for s in res.steps)

    base_tps = base_tokens / base_seconds if base_seconds else 0.0
    spec_tps = spec_tokens / spec_seconds if spec_seconds else 0.0
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

"""Sampler maths on numpy arrays: processed distributions and rejection sampling.

Why it is shaped like this: speculative sampling is lossless only if target and
draft are judged on the *same* processed distributions the target alone would
sample from. So there is one `process` function (llama.cpp's chain order: top-k,
top-p, min-p, then temperature), used for the baseline, the draft and the
verifier alike. Distributions are kept sparse (the surviving ids only), which is
what makes a 262k-token vocabulary cheap: with top-k the full row is never sorted
or softmaxed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specdec_cli.engine.settings import SamplerSettings

__all__ = [
    "Dist",
    "SamplerSettings",
    "accept_probability",
    "finite_argmax",
    "process",
    "residual",
    "rows_finite",
    "sample",
    "verify_greedy",
    "verify_sampled",
]


@dataclass(frozen=True)
class Dist:
    """A sparse probability distribution: `ids` sorted by probability, descending."""

    ids: np.ndarray  # int64
    probs: np.ndarray  # float64, sums to 1

    def prob(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def dense(self, n_vocab: int) -> np.ndarray:
        out = np.zeros(n_vocab, dtype=np.float64)
        out[self.ids] = self.probs
        return out

    @staticmethod
    @functools.lru_cache(maxsize=8192)
    def point(token: int) -> Dist:
        """All of the mass on `token`: one shared object per token (read-only), as n-gram lookups propose
        dozens of tokens for each slot at every step."""
        ids, probs = np.array([token], dtype=np.int64), np.array([1.0])
        ids.flags.writeable = probs.flags.writeable = False
        return Dist(ids, probs)


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


def process(logits: np.ndarray, s: SamplerSettings) -> Dist:
    """The distribution the target (or draft) samples from under settings `s`.

    `logits` is one raw row (any float dtype, may be a view into llama.cpp's
    buffer: it is not modified). Order as in llama.cpp's default chain:
    top-k, top-p and min-p on the raw logits, then temperature.
    """
    if s.greedy:
        return Dist.point(int(np.argmax(logits)))
    n = logits.shape[0]
    if 0 < s.top_k < n:
        ids = np.argpartition(logits, n - s.top_k)[n - s.top_k :]
    else:
        ids = np.arange(n)
    vals = logits[ids].astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    ids, vals = ids[order], vals[order]
    # Shift by the maximum before dividing by the temperature: (v - max) / T <= 0, so even
    # a tiny temperature gives exp(-inf) = 0 for the rest, never inf - inf = NaN.
    vals = vals - vals[0]

    if s.top_p < 1.0:
        cum = np.cumsum(_softmax(vals))
        keep = int(np.searchsorted(cum, s.top_p, side="left")) + 1
        ids, vals = ids[:keep], vals[:keep]
    if s.min_p > 0.0:
        keep = max(1, int(np.count_nonzero(vals >= vals[0] + np.log(s.min_p))))
        ids, vals = ids[:keep], vals[:keep]
    return Dist(ids.astype(np.int64), _softmax(vals / s.temperature))


def rows_finite(rows: np.ndarray) -> bool:
    """True when every logit in `rows` is finite: one vectorised pass, no temporary mask.

    A NaN anywhere makes the sum NaN and an infinity makes it infinite; finite logits
    large enough to overflow the sum (beyond 1e34) are garbage too. Called on every
    verification batch and every draft row, so it must cost next to nothing.
    """
    return bool(np.isfinite(np.add.reduce(rows, axis=None)))


def sample(dist: Dist, rng: np.random.Generator) -> int:
    """Inverse-CDF draw; one uniform per call, so a seed fixes the run."""
    if dist.ids.size == 1:
        return int(dist.ids[0])
    cum = np.cumsum(dist.probs)
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(dist.ids[min(i, dist.ids.size - 1)])


def residual(p: Dist, q: Dist) -> Dist | None:
    """normalise(max(0, p - q)): where to resample after rejecting a draft token.

    None when p <= q everywhere (then rejection has probability zero in exact
    arithmetic; the caller falls back to p, which is then equal to q).
    """
    q_at = np.zeros(p.ids.size)
    common, p_idx, q_idx = np.intersect1d(p.ids, q.ids, assume_unique=True, return_indices=True)
    if common.size:
        q_at[p_idx] = q.probs[q_idx]
    mass = np.maximum(p.probs - q_at, 0.0)
    total = mass.sum()
    if total <= 1e-12:
        return None
    keep = mass > 0
    return Dist(p.ids[keep], mass[keep] / total)


def accept_probability(p: Dist, q: Dist, token: int) -> float:
    """min(1, p(x) / q(x)) for a token the drafter drew from q."""
    qx, px = q.prob(token), p.prob(token)
    if not (math.isfinite(qx) and math.isfinite(px)):
        # min(1, p / nan) is 1 in Python: a NaN here would accept anything. The engine
        # checks logits before they reach this point; this is the last line of defence.
        raise ValueError(f"non-finite probability in the acceptance test (p={px}, q={qx})")
    if qx <= 0.0:
        # The drafter cannot have drawn it; treat it as a point mass proposal.
        qx = 1.0
    return min(1.0, px / qx)


def verify_sampled(
    target_dist: Callable[[int], Dist],
    drafted: Sequence[int],
    draft_dists: Sequence[Dist],
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Rejection sampling over K drafted tokens.

    `target_dist(i)` gives the target's processed distribution at draft position
    i (0..K); it is called lazily, so positions after a rejection cost nothing.
    Returns (number accepted, the token the target adds): the residual sample at
    the first rejection, or a bonus token from position K when all pass.
    """
    for i, (x, q) in enumerate(zip(drafted, draft_dists, strict=True)):
        p = target_dist(i)
        if rng.random() < accept_probability(p, q, x):
            continue
        r = residual(p, q)
        return i, sample(r if r is not None else p, rng)
    return len(drafted), sample(target_dist(len(drafted)), rng)


def finite_argmax(rows: np.ndarray) -> np.ndarray | None:
    """Each row's argmax (a 1-D row: a 0-d array), or None when a row holds a NaN or a +inf: numpy's argmax
    returns the first NaN where there is one, and an infinity is a maximum, so checking the chosen values
    sees both, in the one pass over the logits the argmax makes anyway (`rows_finite` adds another; over a
    vocabulary of logits that has just left the caches, that pass was most of a greedy step's host time).
    A -inf cannot be an argmax unless the whole row is: greedy ignores it, and the sampler's softmax does too."""
    top = rows.argmax(axis=-1)
    if rows.ndim == 1:  # a draft's row: math on one float, not a numpy call (they cost several us after a decode)
        return top if math.isfinite(rows[top]) else None
    return top if all(math.isfinite(rows[i, t]) for i, t in enumerate(top.tolist())) else None


def verify_greedy(target_argmax: np.ndarray | list[int], drafted: Sequence[int]) -> tuple[int, int]:
    """Greedy verification: keep the drafted prefix that equals the target's argmax.

    `target_argmax[i]` is the target's choice at position i (0..K).
    """
    # a few ints: plain Python beats numpy's per-call cost here
    top = target_argmax if isinstance(target_argmax, list) else target_argmax.tolist()
    n = 0
    for t, d in zip(top, drafted, strict=False):
        if t != d:
            break
        n += 1
    return n, top[n]

"""The sampler maths on numpy arrays: masks, residuals, and the exactness of rejection sampling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from specdec_cli.engine.sampling import (
    Dist,
    SamplerSettings,
    accept_probability,
    finite_argmax,
    process,
    residual,
    rows_finite,
    sample,
    verify_greedy,
    verify_sampled,
)
from specdec_cli.engine.settings import GenerateOptions

V = 12


def dist_from_dense(p: np.ndarray) -> Dist:
    ids = np.flatnonzero(p > 0)
    order = np.argsort(-p[ids], kind="stable")
    return Dist(ids[order].astype(np.int64), p[ids][order] / p[ids].sum())


def exact_output(p: Dist, q: Dist, n: int) -> np.ndarray:
    """P(emitted token = x) for one drafted position, by enumeration, using the module's own parts."""
    out = np.zeros(n)
    for x, qx in zip(q.ids, q.probs, strict=True):
        a = accept_probability(p, q, int(x))
        out[x] += qx * a
        reject = qx * (1 - a)
        if reject > 0:
            r = residual(p, q)
            # As in verify_sampled: a residual with no mass left falls back to p.
            out += reject * (r if r is not None else p).dense(n)
    return out


logit_rows = arrays(np.float32, V, elements=st.floats(-8, 8, width=32))


# ------------------------------------------------------------------ process
def test_point_masses_are_shared_and_cannot_be_changed() -> None:
    """n-gram lookups propose dozens of tokens per slot every step: one read-only `Dist.point` per token."""
    a = Dist.point(17)
    assert a is Dist.point(17) and a.prob(17) == 1.0 and a.prob(3) == 0.0
    with pytest.raises(ValueError):
        a.probs[0] = 0.5


def test_greedy_is_argmax_point_mass() -> None:
    row = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    d = process(row, SamplerSettings(temperature=0))
    assert d.ids.tolist() == [1] and d.probs.tolist() == [1.0]


def test_top_k_keeps_exactly_the_k_largest() -> None:
    row = np.array([5.0, 1.0, 4.0, 3.0, 2.0], dtype=np.float32)
    d = process(row, SamplerSettings(temperature=1, top_k=2, top_p=1, min_p=0))
    assert sorted(d.ids.tolist()) == [0, 2]
    expected = np.exp([5.0, 4.0]) / np.exp([5.0, 4.0]).sum()
    np.testing.assert_allclose(d.probs, expected)


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    row = np.log(probs).astype(np.float32)
    d = process(row, SamplerSettings(temperature=1, top_k=0, top_p=0.8, min_p=0))
    assert d.ids.tolist() == [0, 1]  # 0.5 + 0.3 reaches 0.8
    d = process(row, SamplerSettings(temperature=1, top_k=0, top_p=0.81, min_p=0))
    assert d.ids.tolist() == [0, 1, 2]


def test_min_p_drops_tokens_below_fraction_of_top() -> None:
    probs = np.array([0.6, 0.3, 0.07, 0.03])
    row = np.log(probs).astype(np.float32)
    d = process(row, SamplerSettings(temperature=1, top_k=0, top_p=1, min_p=0.1))
    assert d.ids.tolist() == [0, 1, 2]  # 0.03 < 0.1 * 0.6
    np.testing.assert_allclose(d.probs, probs[:3] / probs[:3].sum())


def test_temperature_applies_after_masks() -> None:
    row = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    d = process(row, SamplerSettings(temperature=0.5, top_k=0, top_p=1, min_p=0))
    expected = np.exp(row / 0.5) / np.exp(row / 0.5).sum()
    np.testing.assert_allclose(d.dense(3), expected)


def test_process_does_not_modify_the_logits_view() -> None:
    row = np.array([2.0, 1.0, 0.0, -3.0], dtype=np.float32)
    before = row.copy()
    process(row, SamplerSettings(temperature=0.7, top_k=2, top_p=0.9, min_p=0.05))
    np.testing.assert_array_equal(row, before)


@settings(max_examples=200, deadline=None)
@given(row=logit_rows, k=st.integers(0, V), p=st.floats(0.05, 1.0), mp=st.floats(0.0, 0.9), t=st.floats(0.1, 3.0))
def test_process_is_a_distribution_over_surviving_tokens(
    row: np.ndarray, k: int, p: float, mp: float, t: float
) -> None:
    d = process(row, SamplerSettings(temperature=t, top_k=k, top_p=p, min_p=mp))
    assert d.ids.size >= 1
    assert abs(d.probs.sum() - 1) < 1e-9
    assert np.all(d.probs > 0)
    assert len(set(d.ids.tolist())) == d.ids.size
    if 0 < k:
        assert d.ids.size <= k
    assert np.all(np.diff(d.probs) <= 1e-12)  # sorted, most likely first
    assert int(d.ids[0]) in np.flatnonzero(row == row.max()).tolist()


# ----------------------------------------------------------------- residual
def test_residual_is_normalised_positive_part() -> None:
    p = dist_from_dense(np.array([0.5, 0.3, 0.2, 0.0]))
    q = dist_from_dense(np.array([0.2, 0.5, 0.0, 0.3]))
    r = residual(p, q)
    assert r is not None
    expected = np.array([0.3, 0.0, 0.2, 0.0]) / 0.5
    np.testing.assert_allclose(r.dense(4), expected)


def test_residual_where_q_is_zero_but_p_is_not() -> None:
    p = dist_from_dense(np.array([0.4, 0.6, 0.0]))
    q = Dist.point(2)  # q has no mass where p has any
    r = residual(p, q)
    assert r is not None
    np.testing.assert_allclose(r.dense(3), p.dense(3))
    assert accept_probability(p, q, 2) == 0.0


def test_residual_of_equal_distributions_is_none() -> None:
    p = dist_from_dense(np.array([0.5, 0.5]))
    assert residual(p, p) is None


@settings(max_examples=300, deadline=None)
@given(
    pp=arrays(np.float64, V, elements=st.floats(0, 1)),
    qq=arrays(np.float64, V, elements=st.floats(0, 1)),
)
def test_rejection_sampling_is_exact(pp: np.ndarray, qq: np.ndarray) -> None:
    """For any p and q, accept-or-resample emits tokens distributed exactly as p."""
    if pp.sum() <= 1e-6 or qq.sum() <= 1e-6:
        return
    p, q = dist_from_dense(pp), dist_from_dense(qq)
    np.testing.assert_allclose(exact_output(p, q, V), p.dense(V), atol=1e-9)


def test_wrong_residual_would_be_caught() -> None:
    """The exactness check above is not vacuous: resampling from p instead of the residual fails it."""
    p = dist_from_dense(np.array([0.5, 0.3, 0.2]))
    q = dist_from_dense(np.array([0.1, 0.8, 0.1]))
    out = np.zeros(3)
    for x, qx in zip(q.ids, q.probs, strict=True):
        a = accept_probability(p, q, int(x))
        out[x] += qx * a
        out += qx * (1 - a) * p.dense(3)  # the bug
    assert np.abs(out - p.dense(3)).max() > 0.05


# ------------------------------------------------------------------ verify
def test_greedy_all_accepted_gives_bonus() -> None:
    assert verify_greedy(np.array([4, 5, 6, 7]), [4, 5, 6]) == (3, 7)


def test_greedy_first_rejected() -> None:
    assert verify_greedy(np.array([9, 5, 6, 7]), [4, 5, 6]) == (0, 9)


def test_greedy_middle_rejected() -> None:
    assert verify_greedy(np.array([4, 8, 6, 7]), [4, 5, 6]) == (1, 8)


def test_greedy_k1_and_k0() -> None:
    assert verify_greedy(np.array([3, 1]), [3]) == (1, 1)
    assert verify_greedy(np.array([2, 1]), [3]) == (0, 2)
    assert verify_greedy(np.array([2]), []) == (0, 2)


def test_sampled_all_accepted_when_draft_equals_target() -> None:
    rng = np.random.default_rng(0)
    p = dist_from_dense(np.array([0.2, 0.5, 0.3]))
    bonus_seen = set()
    for _ in range(200):
        drafted = [sample(p, rng) for _ in range(3)]
        n, tok = verify_sampled(lambda i: p, drafted, [p, p, p], rng)
        assert n == 3  # p/q = 1 everywhere: always accepted
        bonus_seen.add(tok)
    assert bonus_seen == {0, 1, 2}  # the bonus token is sampled from the target


def test_sampled_first_rejected_resamples_from_residual() -> None:
    rng = np.random.default_rng(1)
    p = dist_from_dense(np.array([0.6, 0.4, 0.0]))
    q = Dist.point(2)  # a token the target never emits
    for _ in range(100):
        n, tok = verify_sampled(lambda i: p, [2], [q], rng)
        assert n == 0 and tok in (0, 1)


def test_sampled_k1_monte_carlo_matches_target() -> None:
    """K=1 end to end with the real RNG path, 40k draws, against p (chi-square)."""
    from scipy import stats as sstats  # type: ignore[import-untyped]

    rng = np.random.default_rng(123)
    p = dist_from_dense(np.array([0.45, 0.25, 0.2, 0.1]))
    q = dist_from_dense(np.array([0.1, 0.6, 0.05, 0.25]))
    counts = np.zeros(4)
    n_draws = 40_000
    for _ in range(n_draws):
        x = sample(q, rng)
        n, tok = verify_sampled(lambda i: p, [x], [q], rng)
        counts[x if n == 1 else tok] += 1
    _, pvalue = sstats.chisquare(counts, p.dense(4) * n_draws)
    assert pvalue > 1e-4


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="^temperature must be a finite number >= 0"):
        GenerateOptions(temperature=-0.1).validate()
    with pytest.raises(ValueError, match=r"^top_p must be in \(0, 1\], got 0"):
        GenerateOptions(top_p=0).validate()


# ------------------------------------------------- non-finite values (hostile input)
@pytest.mark.parametrize("temp", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_temperature_is_rejected(temp: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        GenerateOptions(temperature=temp).validate()


@pytest.mark.parametrize(("field", "value"), [("top_p", float("nan")), ("min_p", float("nan"))])
def test_nan_masks_are_rejected(field: str, value: float) -> None:
    with pytest.raises(ValueError):
        GenerateOptions(**{field: value}).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("temp", [1e-300, 1e-30, 1e-6])
def test_tiny_temperature_gives_a_finite_distribution(temp: float) -> None:
    """(v - max) / T before exp: a tiny T concentrates on the argmax instead of making inf - inf = NaN."""
    row = np.array([2.0, 1.0, 0.5, -3.0], dtype=np.float32)
    d = process(row, SamplerSettings(temperature=temp, top_k=0, top_p=1, min_p=0))
    assert np.isfinite(d.probs).all()
    assert d.ids[0] == 0 and d.probs[0] == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [(0, 0), (1, 5), (2, 11)])
def test_rows_finite_sees_one_bad_value_anywhere(bad: float, where: tuple[int, int]) -> None:
    rows = np.random.default_rng(0).normal(size=(3, V)).astype(np.float32)
    assert rows_finite(rows)
    rows[where] = bad
    assert not rows_finite(rows)
    assert not rows_finite(rows[where[0]])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", [(0, 0), (1, 5), (2, V - 1)])
def test_finite_argmax_sees_a_nan_or_an_infinity_in_its_one_pass(bad: float, where: tuple[int, int]) -> None:
    """Greedy's check: numpy's argmax lands on the first NaN (and an infinity is a maximum), so checking the
    chosen logits sees any of them, in one pass instead of two; a lone -inf cannot change an argmax."""
    rows = np.random.default_rng(1).normal(size=(3, V)).astype(np.float32)
    assert finite_argmax(rows).tolist() == rows.argmax(axis=1).tolist()
    assert int(finite_argmax(rows[1])) == int(rows[1].argmax())
    rows[1, 3] = -np.inf
    assert finite_argmax(rows) is not None
    rows[where] = bad
    assert finite_argmax(rows) is None and finite_argmax(rows[where[0]]) is None


def test_acceptance_test_refuses_nan_instead_of_accepting() -> None:
    """min(1, p / nan) is 1 in Python: a NaN q must raise, never accept."""
    p = dist_from_dense(np.array([0.5, 0.5, 0.0]))
    q = Dist(np.array([0, 1], dtype=np.int64), np.array([np.nan, np.nan]))
    with pytest.raises(ValueError, match="non-finite"):
        accept_probability(p, q, 0)

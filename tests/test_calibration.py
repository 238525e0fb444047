"""Calibration: the draft model's starting acceptance is its measured agreement with the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec_cli.calibration import calibrate, starting_state
from specdec_cli.engine.drafters.auto import CALIBRATED_WEIGHT, MODEL_PRIOR
from specdec_cli.engine.estimates import Acceptance, BatchCosts, best_length
from specdec_cli.engine.model import Model


def test_calibration_measures_how_often_the_draft_agrees_with_the_target(
    smol: Model, smol_q2k: Model, smol_twin: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDEC_CALIBRATE", "1")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))  # an empty cache: calibration measures
    twin = calibrate(smol, smol_twin, 2, 3)
    q2k = calibrate(smol, smol_q2k, 2, 3)
    assert twin is not None and q2k is not None
    assert twin.draft_agreement == 1.0  # the same weights: the same argmax at every position
    assert q2k.draft_agreement is not None and 0.3 < q2k.draft_agreement < 0.95  # 0.61 measured
    # Another tokenizer's ids mean other tokens: no agreement is measured (nor cached as if it were).
    cross = calibrate(smol, smol_q2k, 2, 3, same_vocab=False)
    assert cross is not None and cross.draft_agreement is None
    # Cached, and what the auto drafter starts from.
    assert calibrate(smol, smol_q2k, 2, 3) == q2k
    state = starting_state(smol, smol_q2k, 2, 3)
    assert (state.model.prior, state.model.weight) == (q2k.draft_agreement, CALIBRATED_WEIGHT)
    assert starting_state(smol, smol_q2k, 2, 3, same_vocab=False).model.prior == MODEL_PRIOR


def test_one_early_miss_no_longer_pauses_a_draft_that_agrees_96_percent() -> None:
    """The F32 pair's draft agrees with its target on 96% of the probe text (98% along its answers). With
    the uncalibrated prior (80%, worth two observations) a hit and then a miss in its first two steps
    priced it under a plain decode and paused it; calibrated, it goes on drafting."""
    costs = BatchCosts({2: 1.17, 3: 1.26, 4: 1.43, 5: 1.53}, 0.021)  # the F32 target, calibrated on a Xeon
    draft_cost = 0.5  # target tokens a draft token costs, as measured in its steps
    guessed, calibrated = Acceptance(prior=MODEL_PRIOR), Acceptance(prior=0.96, weight=CALIBRATED_WEIGHT)
    for acc in (guessed, calibrated):
        acc.observe(2, 2)
        acc.observe(4, 0)
    assert best_length(guessed, costs, 4, draft_cost)[0] == 0
    k, speedup = best_length(calibrated, costs, 4, draft_cost)
    assert k >= 1 and speedup > 1.05


@pytest.mark.slow  # real models, without a fixture that would mark it
def test_a_pairs_draft_keeps_llamas_faster_kernels_and_its_target_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact mode (engine/native.py) is the target's: its batches must compute what single decodes do. A draft
    only proposes, so it keeps flash attention and repacked weights (6.1-7.0 against 7.4-8.1 ms a SmolLM2 token here)."""
    from specdec_cli import api

    monkeypatch.setenv("SPECDEC_CALIBRATE", "0")
    with api.load(n_ctx=256) as spec:  # the default pair
        assert spec.draft is not None
        assert (getattr(spec.target, "exact", None), getattr(spec.draft, "exact", None)) == (True, False)


def test_costs_and_probe_verdicts_are_kept_per_llama_cpp_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set-up that builds new kernels installs a new wheel beside the same cache: costs calibrated and
    verdicts probed on the old one must not be reused (stale costs priced a batch of two F32 tokens at 1.72
    single decodes where the new kernels take 1.13, and auto drafted where it lost)."""
    from types import SimpleNamespace

    from specdec_cli import calibration
    from specdec_cli.engine import kernels, native

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    target = SimpleNamespace(path=model, kernels=kernels.INVARIANT, placement=None)
    digest = native.build_id.__wrapped__  # uncached
    keys = []
    for build in ("aaaa", "bbbb"):
        monkeypatch.setattr(native, "build_id", lambda build=build: build)
        keys.append((calibration._key(target, None, 2, 5), kernels._key(model, 2, kernels.INVARIANT)))
    assert keys[0][0] != keys[1][0] and keys[0][1] != keys[1][1]
    assert digest() == digest() != ""  # the real digest is stable

"""Hostile and careless input: corrupt weights, non-finite settings. Nothing wrong is ever emitted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.engine import prompting
from specdec_cli.engine.drafters import ModelDrafter
from specdec_cli.engine.events import DrafterDropped, Step
from specdec_cli.engine.model import Model
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.engine.speculative import SpeculativeGenerator, generate
from specdec_cli.errors import ModelOutputError
from tests.conftest import THREADS

cli = CliRunner()
PROMPT = "Tell me a short story about a lighthouse."


def _tokens(model: Model) -> list[int]:
    return prompting.tokenize_prompt(model, PROMPT, use_chat=True, system=None)[0]


def test_the_corrupt_draft_really_produces_non_finite_logits(corrupt_draft_path: Path) -> None:
    """Not vacuous: the file loads, and its logits are NaN or infinite."""
    with Model(corrupt_draft_path, n_ctx=256, n_threads=THREADS) as m:
        rows = m.decode(_tokens(m))
        assert not np.isfinite(rows).all()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_corrupt_draft_is_dropped_and_the_output_is_the_targets(
    temperature: float, smol: Model, corrupt_draft_path: Path
) -> None:
    """In sampling mode a NaN q would make min(1, p/q) = 1 accept every garbage token."""
    prompt = _tokens(smol)
    cfg = GenerateOptions(adaptive=False, max_tokens=24, draft_max=4, temperature=temperature, seed=3)
    alone = generate(smol, None, prompt, cfg)
    with Model(corrupt_draft_path, n_ctx=1024, n_threads=THREADS) as bad:
        gen = SpeculativeGenerator(smol, ModelDrafter(bad), prompt, cfg)
        events = list(gen.events())
    dropped = [e for e in events if isinstance(e, DrafterDropped)]
    assert len(dropped) == 1 and "corrupt-draft.gguf" in dropped[0].reason
    assert len(alone.token_ids) == 24 and gen.result.token_ids == alone.token_ids
    assert all(not s.drafted for s in events if isinstance(s, Step))


def test_corrupt_target_is_an_error_naming_the_file(corrupt_target_path: Path) -> None:
    with Model(corrupt_target_path, n_ctx=256, n_threads=THREADS) as bad:
        with pytest.raises(ModelOutputError, match="corrupt-target.gguf"):
            generate(bad, None, _tokens(bad), GenerateOptions(adaptive=False, max_tokens=4))


def test_cli_corrupt_draft_one_warning_and_the_targets_tokens(smol_path: Path, corrupt_draft_path: Path) -> None:
    common = ["run", PROMPT, "--target", str(smol_path), "--json", "-n", "16", "--temp", "0.8", "--seed", "5"]
    common += ["--ctx-size", "512", "--threads", str(THREADS)]
    res = cli.invoke(app, [*common, "--draft", str(corrupt_draft_path), "--drafter", "model"])
    assert res.exit_code == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("Warning: ") and "corrupt-draft.gguf" in warnings[0]
    base = cli.invoke(app, [*common, "--no-draft"])
    assert json.loads(res.stdout)["token_ids"] == json.loads(base.stdout)["token_ids"]
    assert json.loads(res.stdout)["stats"]["drafted"] == 0


def test_cli_corrupt_target_one_line(corrupt_target_path: Path) -> None:
    res = cli.invoke(app, ["run", "hi", "--target", str(corrupt_target_path), "--no-draft", "--ctx-size", "256"])
    assert res.exit_code == 1
    err = res.stderr.strip()
    assert err.startswith("Error: ") and len(err.splitlines()) == 1 and "corrupt-target.gguf" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-nan"])
def test_cli_non_finite_temperature_is_a_usage_error(value: str) -> None:
    res = cli.invoke(app, ["run", "hi", "--temp", value])
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.startswith("Error: ") and "--temp" in err and len(err.splitlines()) == 1

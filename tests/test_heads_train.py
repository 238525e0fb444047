"""`specdec heads train` (heads_training.py): a tiny run end to end on the packaged target, its refusals, and the
best heads kept when training is interrupted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from specdec_cli import heads_training as T
from specdec_cli.cli import app
from specdec_cli.engine import heads as H
from specdec_cli.engine.drafters.pool import vocab_fingerprint
from specdec_cli.engine.model import Model


def test_a_tiny_training_run_writes_heads_the_target_accepts(tmp_path: Path) -> None:
    dest = tmp_path / "h.gguf"
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("The lighthouse keeper climbed the stairs at dusk. " * 30)
    res = CliRunner().invoke(app, ["heads", "train", "--prompts", "4", "-n", "12", "--epochs", "2", "--parallel", "2",
                                   "--from", str(tmp_path / "texts"), "--out", str(dest), "--json",
                                   "--results", str(tmp_path / "r.json")])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["file"] == str(dest) and data["texts"] >= 5 and 0 < data["tokens"] <= data["texts"] * 12
    assert [e["epoch"] for e in data["epochs"]] == [1, 2] and data["kept_epoch"] in (1, 2)
    assert len(data["held_out_accuracy"]) == 3 and all(0 <= a <= 1 for a in data["held_out_accuracy"])
    assert set(data["seconds"]) == {"generate", "read", "fit"} and data["peak_memory_mib"] > 0
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["kind"] == "heads-train" and saved["held_out_run"] == data["held_out_run"]
    assert saved["stamp"]["date"] and saved["stamp"]["cpu"]["cores"] >= 1
    assert len(saved["stamp"]["models"]["target"]["sha256"]) == 64
    run = CliRunner().invoke(app, ["run", "Explain tides.", "-n", "24", "--json", "--drafter", "heads", "--heads",
                                   str(dest)])  # fmt: skip
    alone = CliRunner().invoke(app, ["run", "Explain tides.", "-n", "24", "--json", "--no-draft"])
    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout)["token_ids"] == json.loads(alone.stdout)["token_ids"]
    assert json.loads(run.stdout)["settings"]["draft_max"] == 3  # the heads' count


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompts", "0"], "nothing to train on"),
        (["--prompts", "999"], "--prompts must be from 0 to 240"),
        (["--from", "/nonexistent/dir"], "not a folder"),
        (["--vocab", "3"], "--vocab must be"),
        (["--out", "/nonexistent/dir/h.gguf"], "no folder"),
        (["--target", "/nonexistent.gguf"], "nonexistent.gguf"),
    ],
)
def test_bad_training_options_are_one_line(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["heads", "train", "-n", "8", *args])
    assert res.exit_code in (1, 2) and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_an_interrupted_training_keeps_the_best_heads_scored(smol: Model) -> None:
    rng = np.random.default_rng(0)
    d = smol.n_embd
    hidden = [rng.standard_normal((60, d)).astype(np.float32) for _ in range(12)]
    labels = [rng.integers(100, 140, size=(2, 60)) for _ in range(12)]
    plan = T.Plan(n_heads=2, epochs=5)
    epochs: list[T.Epoch] = []

    def on_step(done: int, total: int) -> None:
        if epochs:  # Ctrl-C in the second epoch
            raise KeyboardInterrupt

    result = T.fit(smol, hidden, labels, plan, on_step, epochs.append)
    assert result.interrupted and len(result.epochs) == 1 and result.heads.settings["kept_epoch"] == 1
    assert result.heads.fingerprint == vocab_fingerprint(smol.vocab_info().texts)
    # the kept heads are the scored ones, not the ones the interrupted step was changing
    assert T.held_out_loss(result.heads, np.concatenate(hidden[9:10]), labels[9]) == pytest.approx(epochs[0].loss)
    with pytest.raises(KeyboardInterrupt):  # nothing scored yet: nothing to keep
        T.fit(smol, hidden, labels, plan, lambda done, total: (_ for _ in ()).throw(KeyboardInterrupt()), print)
    assert isinstance(result.heads, H.Heads)

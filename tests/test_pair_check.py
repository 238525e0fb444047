"""`specdec pair-check`: verdicts and reasons on real models and on vocabularies built with `gguf`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader
from typer.testing import CliRunner

from specdec_cli.cli import app
from tests import vocab_fixtures as vf
from tests.conftest import THREADS

runner = CliRunner()
CROSS = "compatible (different tokenizers)"


def check(*args: str) -> tuple[int, dict[str, Any], str]:
    res = runner.invoke(app, ["pair-check", *args, "--json"])
    out = json.loads(res.stdout) if res.stdout.strip() else {}
    return res.exit_code, out, res.stderr


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("vocabs")
    reader = GGUFReader(smol_path)
    add_bos = vf.set_key("tokenizer.ggml.add_bos_token", True)

    def all_control(f: dict[str, Any]) -> None:  # no token is plain text: nothing to draft with
        f["tokenizer.ggml.token_type"] = [3] * len(f["tokenizer.ggml.token_type"])
        add_bos(f)  # and a flag that llama.cpp's same-vocabulary rule refuses
    return {
        "reference": vf.write_vocab_gguf(reader, d / "reference.gguf"),
        "padded": vf.write_vocab_gguf(reader, d / "padded.gguf", vf.pad(64)),
        "padded_too_much": vf.write_vocab_gguf(reader, d / "padded200.gguf", vf.pad(200)),
        "text_changed": vf.write_vocab_gguf(reader, d / "text.gguf", vf.change_text(1000, "zz_changed_zz")),
        "add_bos": vf.write_vocab_gguf(reader, d / "add_bos.gguf", add_bos),
        "all_control": vf.write_vocab_gguf(reader, d / "control.gguf", all_control),
        "add_bos_other_id": vf.write_vocab_gguf(
            reader, d / "bos.gguf", vf.set_key("tokenizer.ggml.bos_token_id", 3, add_bos)
        ),
    }


def test_packaged_models_draft_across_tokenizers(smol_path: Path, gemma_path: Path) -> None:
    code, out, _ = check(str(smol_path), str(gemma_path))
    assert code == 0 and out["verdict"] == "compatible (different tokenizers)"
    assert "vocabulary types differ" in out["reason"]
    assert out["cross"]["intersection"] > 40_000 and out["cross"]["modes"] == ["greedy", "sampling"]
    assert out["target"]["n_vocab"] == 49152 and out["draft"]["n_vocab"] == 262144
    assert out["target"]["vocab_type"] == "BPE" and out["draft"]["vocab_type"] == "SPM"
    assert not all(r["same"] for r in out["round_trips"])


def test_model_and_derived_draft_are_compatible(smol_path: Path, smol_q2k_path: Path) -> None:
    code, out, _ = check(str(smol_path), str(smol_q2k_path))
    assert code == 0 and out["verdict"] == "compatible"
    assert out["target"]["quantization"] == "Q4_1" and out["draft"]["quantization"] == "Q2_K"
    assert out["templates_equal"] is True
    assert all(r["same"] for r in out["round_trips"])
    assert any(r["probe"] == "conversation (chat template)" for r in out["round_trips"])
    assert out["special_differences"] == []


def test_named_pair(smol_q2k_path: Path) -> None:
    code, out, _ = check("--pair", "smollm2-135m-q2k")
    assert code == 0 and out["verdict"] == "compatible"


def test_padded_vocabulary(vocabs: dict[str, Path]) -> None:
    code, out, _ = check(str(vocabs["reference"]), str(vocabs["padded"]))
    assert code == 0 and out["verdict"] == "compatible (padded)"
    assert "differ by 64 tokens at the end" in out["reason"]


def test_padding_beyond_llama_cpp_tolerance(vocabs: dict[str, Path]) -> None:
    code, out, _ = check(str(vocabs["reference"]), str(vocabs["padded_too_much"]))
    assert code == 0 and out["verdict"] == CROSS  # beyond llama.cpp's rule: drafted across tokenizers
    assert "differ by 200" in out["reason"]


def test_one_token_text_changed(vocabs: dict[str, Path]) -> None:
    code, out, _ = check(str(vocabs["reference"]), str(vocabs["text_changed"]))
    assert code == 0 and out["verdict"] == CROSS
    assert "1 token ids have different text" in out["reason"]
    assert out["verdict"] and out["draft"]["n_vocab"] == out["target"]["n_vocab"]


def test_text_change_names_the_token_in_run_refusal(vocabs: dict[str, Path]) -> None:
    from specdec_cli import pairs
    from specdec_cli.engine.model import Model

    with Model(vocabs["reference"], vocab_only=True) as a, Model(vocabs["text_changed"], vocab_only=True) as b:
        v = pairs.check(a.vocab_info(), b.vocab_info())
    assert v.first_difference().startswith("id 1000 (")
    assert "zz_changed_zz" in v.first_difference()


def test_different_bos_id(vocabs: dict[str, Path]) -> None:
    code, out, _ = check(str(vocabs["add_bos"]), str(vocabs["add_bos_other_id"]))
    assert code == 0 and out["verdict"] == CROSS
    assert "BOS ids differ: target 1, draft 3" in out["reason"]


def test_different_add_bos_flag(vocabs: dict[str, Path]) -> None:
    code, out, _ = check(str(vocabs["reference"]), str(vocabs["add_bos"]))
    assert code == 0 and out["verdict"] == CROSS
    assert "add-BOS flags differ" in out["reason"]


def test_table_output_on_a_pipe(smol_path: Path, smol_q2k_path: Path) -> None:
    res = runner.invoke(app, ["pair-check", str(smol_path), str(smol_q2k_path)])
    assert res.exit_code == 0
    for needle in ("architecture", "quantization", "round trip", "memory to run both", "verdict: compatible"):
        assert needle in res.stdout


@pytest.mark.parametrize("kind", ["missing", "not_gguf", "truncated"])
def test_bad_files_one_line(kind: str, tmp_path: Path, smol_path: Path, not_gguf: Path, truncated_gguf: Path) -> None:
    bad = {"missing": tmp_path / "none.gguf", "not_gguf": not_gguf, "truncated": truncated_gguf}[kind]
    res = runner.invoke(app, ["pair-check", str(smol_path), str(bad)])
    assert res.exit_code == 1
    err = res.stderr.strip()
    assert err.startswith("Error: ") and len(err.splitlines()) == 1 and "Traceback" not in err
    assert {"missing": "not found", "not_gguf": "not a GGUF", "truncated": "not within the file bounds"}[kind] in err


def test_usage_errors() -> None:
    assert runner.invoke(app, ["pair-check"]).exit_code == 2
    assert runner.invoke(app, ["pair-check", "a.gguf", "b.gguf", "--pair", "x"]).exit_code == 2


def test_probe_predicts_and_measures(smol_path: Path, smol_q2k_path: Path, tmp_path: Path) -> None:
    import numpy as np

    from specdec_cli.engine import heads as H
    from specdec_cli.engine.drafters.pool import vocab_fingerprint
    from specdec_cli.engine.model import Model

    with Model(smol_path, vocab_only=True) as m:
        fingerprint = vocab_fingerprint(m.vocab_info().texts)
    subset = np.arange(0, 4000, dtype=np.int32)
    H.Heads.initial(2, H.output_rows(smol_path, subset), subset, fingerprint).save(tmp_path / "h.gguf")
    code, out, _ = check(str(smol_path), str(smol_q2k_path), "--probe", "--threads", str(THREADS), "--heads", str(tmp_path / "h.gguf"))
    assert code == 0
    h = out["heads_probe"]  # the heads measured as the draft is: a chain of right guesses, never rising
    assert len(h["chain"]) == 2 and 0 <= h["chain"][1] <= h["chain"][0] <= 1 and h["n_positions"] > 100
    assert [r["k"] for r in h["predictions"]] == [1, 2] and h["guess_cost"] > 0
    for r in h["predictions"]:
        e = 1 + sum(h["chain"][: r["k"]])
        assert r["tokens_per_step"] == pytest.approx(e)
        assert r["speedup"] == pytest.approx(e / (h["guess_cost"] + r["verify_cost"]))
    assert h["recommended_k"] == max(h["predictions"], key=lambda r: r["speedup"])["k"] and h["base_tps"] > 0
    p = out["probe"]
    assert 0.3 < p["acceptance"] <= 1.0  # the Q2_K draft agrees with its Q4_1 source most of the time
    assert [r["k"] for r in p["predictions"]] == list(range(1, 9))
    best = max(p["predictions"], key=lambda r: r["speedup"])
    assert p["recommended_k"] == best["k"] and p["predicted_speedup"] == best["speedup"]
    assert p["measured_speedup"] > 0 and p["spec_tps"] > 0 and p["base_tps"] > 0
    # the speedup model's own arithmetic, from the reported measurements
    for r in p["predictions"]:
        k, a = r["k"], p["acceptance"]
        e = (1 - a ** (k + 1)) / (1 - a)
        assert r["tokens_per_step"] == pytest.approx(e)
        assert r["speedup"] == pytest.approx(e / (k * p["draft_cost"] + r["verify_cost"]))


def test_heads_are_probed_only_with_probe(smol_path: Path, smol_q2k_path: Path) -> None:
    res = runner.invoke(app, ["pair-check", str(smol_path), str(smol_q2k_path), "--heads", "h.gguf"])
    assert res.exit_code == 2 and "add --probe" in res.stderr


def test_memory_warning_when_the_pair_will_not_fit(smol_path: Path, smol_q2k_path: Path) -> None:
    res = runner.invoke(app, ["pair-check", str(smol_path), str(smol_q2k_path), "--ctx-size", "50000000", "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["fits_in_memory"] is False
    assert res.stderr.startswith("Warning: running both needs about")


def test_a_draft_with_nothing_in_common_is_incompatible(vocabs: dict[str, Path], smol_path: Path) -> None:
    code, out, _ = check(str(vocabs["reference"]), str(vocabs["all_control"]))
    assert code == 1 and out["verdict"] == "incompatible"
    assert "token texts are target tokens" in out["reason"]
    res = runner.invoke(app, ["run", "hi", "--target", str(smol_path), "--draft", str(vocabs["all_control"])])
    err = res.stderr.strip()
    assert res.exit_code == 1 and err.startswith("Error: ") and len(err.splitlines()) == 1
    assert "cannot speculate together" in err and "pair-check" in err


def test_a_pair_is_checked_once_a_process_until_a_file_changes(vocabs: dict[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`check_pair` before each load: the same two files' verdict is remembered, a rewritten file checked again."""
    import shutil

    from specdec_cli.models import loading

    monkeypatch.setattr(loading, "_VERDICTS", {})
    checked: list[Path] = []
    real = loading._check_vocabularies
    monkeypatch.setattr(loading, "_check_vocabularies", lambda t, d, o: checked.append(d) or real(t, d, o))
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    shutil.copy(vocabs["reference"], target)
    shutil.copy(vocabs["reference"], draft)
    assert loading.check_pair(target, draft).verdict == "compatible"
    assert loading.check_pair(target, draft).verdict == "compatible" and checked == [draft]
    shutil.copy(vocabs["text_changed"], draft)  # the same name, another vocabulary
    assert loading.check_pair(target, draft).verdict == CROSS and checked == [draft, draft]
    assert loading.check_pair(target, draft, opener=loading.open_llama).verdict == CROSS and len(checked) == 2

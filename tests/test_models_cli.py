"""`specdec models list|show|path` on the bundled models.toml and a user file, through CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.models import registry
from tests.conftest import THREADS

runner = CliRunner()


def models(*args: str) -> Any:
    return runner.invoke(app, ["models", *args])


def assert_one_line_error(res: Any, code: int, *needles: str) -> None:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    err = res.stderr.strip()
    assert err.startswith("Error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in res.stdout + res.stderr
    for needle in needles:
        assert needle in err, err


def test_list_json_shows_every_pair_and_what_is_on_disk() -> None:
    registry.user_models_toml().unlink()  # the suite's default (conftest.py): here, the shipped one
    res = models("list", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    names = [p["name"] for p in out["pairs"]]
    assert names[0] == out["default"] == "smollm2-135m-f32-q4"
    assert len(names) == len(registry.load().pairs) >= 12
    assert out["user_file"] == str(registry.user_models_toml())
    by_name = {p["name"]: p for p in out["pairs"]}
    assert by_name["smollm2-135m-q2k"]["on_disk"] == "yes"  # packaged; the Q2_K is built offline
    hub_pair = by_name["llama3.3-70b-3.2-1b"]
    assert hub_pair["on_disk"] == "no"
    assert hub_pair["target"]["url"].endswith(
        "/bartowski/Llama-3.3-70B-Instruct-GGUF/resolve/main/Llama-3.3-70B-Instruct-Q4_K_M.gguf"
    )
    assert hub_pair["target"]["size_gb"] == 42.5 and hub_pair["target"]["path"] is None


def test_list_table_names_the_files_it_read() -> None:
    res = models("list")
    assert res.exit_code == 0, res.stderr
    assert "smollm2-135m-q2k (default)" in res.stdout  # the user file's default (conftest.py) wins
    assert "Llama-3.3-70B-Instruct-Q4_K_M.gguf" in res.stdout and "~42.5 GB" in res.stdout
    assert str(registry.user_models_toml()) in res.stdout


def test_show_gives_url_size_and_what_was_not_verified() -> None:
    res = models("show", "gemma3-12b-1b")
    assert res.exit_code == 0, res.stderr
    assert "https://huggingface.co/ggml-org/gemma-3-12b-it-GGUF/resolve/main/gemma-3-12b-it-Q4_K_M.gguf" in res.stdout
    assert "unverified: repo and file name follow" in res.stdout
    assert "on disk: no" in res.stdout
    out = json.loads(models("show", "gemma3-12b-1b", "--json").stdout)
    assert out["draft"]["repo"] == "lmstudio-community/gemma-3-1b-it-GGUF" and out["draft"]["unverified"] is None


def test_path_prints_the_default_pairs_files() -> None:
    res = models("path", "smollm2-135m-q2k")
    assert res.exit_code == 0, res.stderr
    target, draft = (Path(p) for p in res.stdout.split())
    assert target.is_file() and draft.is_file() and draft.name.startswith("SmolLM2-135M-Instruct.Q4_1.Q2_K")
    res = models("path", "smollm2-135m-q2k", "--role", "draft")
    assert res.exit_code == 0 and Path(res.stdout.strip()) == draft


def test_bad_input_is_one_line() -> None:
    assert_one_line_error(models("show", "nope"), 1, "no pair named 'nope'")
    assert_one_line_error(models("path", "nope"), 1, "no pair named 'nope'")
    assert_one_line_error(models("pull", "nope"), 1, "no pair named 'nope'")
    assert_one_line_error(models("path", "smollm2-135m-q2k", "--role", "both"), 2, "--role must be target or draft")
    assert_one_line_error(models("path", "qwen3-8b-0.6b"), 1, "not on disk: run `specdec models pull qwen3-8b-0.6b`")


def test_a_broken_user_file_is_named_with_its_line() -> None:
    path = registry.user_models_toml()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[pairs.mine]\ndescription = "x"\ntarget = { path = "/t.gguf" }\ndraft = { path = "/d.gguf" \n')
    assert_one_line_error(models("list"), 1, f"{path}:4:", "invalid TOML")
    res = runner.invoke(app, ["run", "hi"])
    assert_one_line_error(res, 1, f"{path}:4:")


def test_a_user_pair_with_local_paths_runs(smol_path: Path, smol_q2k_path: Path) -> None:
    path = registry.user_models_toml()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'default = "local"\n[pairs.local]\ndescription = "my files"\ndraft_max = 3\n'
        f'target = {{ path = "{smol_path}" }}\ndraft = {{ path = "{smol_q2k_path}" }}\n'
    )
    args = ["run", "Say hi.", "-n", "8", "--json", "--ctx-size", "512", "--threads", str(THREADS), "--drafter", "model"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["models"]["pair"] == "local" and out["settings"]["draft_max"] == 3
    assert out["models"]["target"] == str(smol_path)


def test_pull_of_an_offline_pair_needs_no_network() -> None:
    res = models("pull", "smollm2-135m-q2k")
    assert res.exit_code == 0, res.stderr
    assert [Path(p).is_file() for p in res.stdout.split()] == [True, True]

"""`specdec run` through typer's CliRunner: exit codes, one-line errors, the JSON contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from tests.conftest import THREADS

runner = CliRunner()
FAST = ["--ctx-size", "512", "--threads", str(THREADS)]


def run(*args: str, input: str | None = None) -> Any:
    return runner.invoke(app, ["run", *args], input=input)


def run_json(*args: str) -> dict[str, Any]:
    res = run(*args, "--json", *FAST)
    assert res.exit_code == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, "stdout must hold exactly one JSON object"
    return json.loads(lines[0])


def assert_one_line_error(res: Any, code: int, *needles: str) -> None:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    err = res.stderr.strip()
    assert err.startswith("Error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in res.stdout + res.stderr
    for needle in needles:
        assert needle in err, err


# -------------------------------------------------------------- JSON contract
def test_json_on_embedded_default_pair_adds_up() -> None:
    out = run_json("Name three colours.", "-n", "32", "--drafter", "model")
    assert set(out) >= {"text", "token_ids", "n_tokens", "stop_reason", "models", "settings", "stats"}
    s = out["stats"]
    assert out["n_tokens"] == len(out["token_ids"]) > 0
    assert out["models"]["pair"] == "smollm2-135m-q2k" and out["models"]["draft"]
    assert 0 < s["accepted"] <= s["drafted"]
    assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["drafted"], abs=1e-6)
    ended = out["stop_reason"] == "eos"  # the pass that chose the end token produced it: counted, not emitted
    assert s["tokens_per_step"] == pytest.approx((out["n_tokens"] + ended) / s["steps"], abs=1e-6)
    assert s["emitted_from_draft"] + s["emitted_from_target"] == out["n_tokens"]
    assert s["emitted_from_draft"] == s["accepted"]
    assert len(s["accepted_by_position"]) == out["settings"]["draft_max"]
    assert all(0 <= x <= 1 for x in s["accepted_by_position"])
    assert s["tokens_per_second"] > 0 and s["wall_seconds"] > 0


def test_no_draft_same_shape_and_same_tokens() -> None:
    spec = run_json("Name three colours.", "-n", "32", "--drafter", "model")
    base = run_json("Name three colours.", "-n", "32", "--no-draft")
    assert base["token_ids"] == spec["token_ids"]
    assert base["stats"]["drafted"] == 0 and base["stats"]["accepted"] == 0
    assert base["stats"]["tokens_per_step"] == 1.0
    assert base["models"]["draft"] is None
    assert set(base["stats"]) == set(spec["stats"])


def test_drafter_none_is_the_target_alone() -> None:
    """One drafter name everywhere: `--drafter none` (as the API and the server say it) is `--no-draft`."""
    a, b = run_json("Name three colours.", "-n", "8", "--drafter", "none"), run_json("Name three colours.", "-n", "8",
                                                                                       "--no-draft")  # fmt: skip
    assert a["token_ids"] == b["token_ids"] and a["settings"]["drafter"] is None and a["stats"]["drafted"] == 0
    res = run("hi", "--drafter", "nope")
    assert res.exit_code == 2 and "auto" in res.output and "none" in res.output


def test_default_is_the_auto_drafter_and_says_what_it_chose() -> None:
    """On this CPU the default pair's draft costs about a target token: auto pauses it and says why."""
    text = "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog."
    out = run_json(text, "-n", "40")
    base = run_json(text, "-n", "40", "--no-draft")
    assert out["token_ids"] == base["token_ids"]
    assert out["settings"]["drafter"] == "auto"
    s = out["stats"]
    table = s["drafters"]
    assert sum(row["steps"] for row in table.values()) == s["steps"]
    assert sum(row["drafted"] for row in table.values()) == s["drafted"]
    assert sum(row["accepted"] for row in table.values()) == s["accepted"] <= s["drafted"]
    assert s["predicted_speedup"] is not None and s["predicted_speedup"] >= 1.0
    if table.get("model", {}).get("steps", 0) == 0:  # the draft model was paused: the note says why
        assert any("paused" in n and "draft costs" in n for n in s["notes"]), s["notes"]


def test_prompt_from_stdin() -> None:
    res = run("-", "--json", "-n", "4", *FAST, input="Say hello.\n")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["n_tokens"] == 4


def test_plain_output_when_not_a_terminal() -> None:
    res = run("Say hello.", "-n", "8", *FAST)
    assert res.exit_code == 0
    assert "\x1b[" not in res.stdout  # no colour codes in a pipe
    assert "drafted" in res.stderr and "accepted" in res.stderr  # plain summary on stderr
    assert "drafted" not in res.stdout


def test_context_running_out_keeps_text() -> None:
    res = run("1, 2, 3, 4, 5, 6, 7, 8, 9,", "--raw", "--json", "-n", "500", "--ctx-size", "48", "--threads", str(THREADS))
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["stop_reason"] == "context" and out["text"]


def test_raw_mode_and_system_prompt() -> None:
    raw = run_json("The capital of France is", "-n", "4", "--raw")
    assert raw["settings"]["chat_template"] is False
    sys_ = run_json("Hi", "-n", "4", "--system", "You are terse.")
    assert sys_["settings"]["chat_template"] is True and sys_["settings"]["system"] == "You are terse."


# ----------------------------------------------------------------- bad input
def test_missing_model_file(tmp_path: Path) -> None:
    assert_one_line_error(run("hi", "--target", str(tmp_path / "x.gguf"), "--no-draft"), 1, "not found")


def test_not_a_gguf_file(not_gguf: Path) -> None:
    assert_one_line_error(run("hi", "--target", str(not_gguf), "--no-draft"), 1, "not a GGUF file")


def test_truncated_gguf(truncated_gguf: Path, smol_path: Path) -> None:
    res = run("hi", "--target", str(truncated_gguf), "--no-draft", *FAST)
    assert_one_line_error(res, 1, "truncated")


def test_a_pair_with_different_tokenizers_is_accepted_with_a_note(smol_path: Path, gemma_path: Path) -> None:
    res = run("hi", "--target", str(smol_path), "--draft", str(gemma_path), "-n", "4", *FAST)
    assert res.exit_code == 0, res.stderr
    assert res.stderr.count("drafting across tokenizers") == 1


def test_prompt_longer_than_context() -> None:
    res = run("word " * 100, "--raw", "--ctx-size", "32", "--threads", str(THREADS))
    assert_one_line_error(res, 1, "--ctx-size")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--draft-max", "0"], "--draft-max"),
        (["--temp", "-0.5"], "--temp"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--top-p", "0"], "--top-p"),
        (["--draft-min", "5", "--draft-max", "3"], "--draft-min"),
        (["--draft-p-min", "1.5"], "--draft-p-min"),
        (["--ngram-min", "3", "--ngram-max", "2"], "--ngram-min"),
        (["--drafter", "ngram", "--no-draft"], "--no-draft"),
    ],
)
def test_usage_errors_exit_2(args: list[str], needle: str) -> None:
    assert_one_line_error(run("hi", *args), 2, needle)


def test_contradictory_model_options(smol_path: Path) -> None:
    assert_one_line_error(run("hi", "--target", str(smol_path), "--drafter", "model"), 2, "--draft")
    assert_one_line_error(
        run("hi", "--drafter", "ngram", "--target", str(smol_path), "--draft", str(smol_path)), 2, "--draft"
    )
    assert_one_line_error(run("hi", "--pair", "x", "--target", str(smol_path)), 2, "--pair")


def test_unknown_pair() -> None:
    assert_one_line_error(run("hi", "--pair", "no-such-pair"), 1, "no-such-pair")


def test_raw_with_system_is_usage_error() -> None:
    assert_one_line_error(run("hi", "--raw", "--system", "x", *FAST), 2, "--system")


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["run", "hi", "--frobnicate"], "No such option: --frobnicate"), (["run", "hi", "--temp", "abc"], "'--temp'")],
)
def test_click_usage_errors_are_one_line_too(args: list[str], needle: str) -> None:
    """Through the real entry point: Click's own parse errors also end in one `Error:` line, exit 2."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("Error: ") and len(err.splitlines()) == 1 and needle in err, err


# ------------------------------------------------------------ n-gram drafter
def test_ngram_drafter_json_adds_up_and_matches_target_alone(smol_path: Path) -> None:
    text = "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog."
    spec = run_json(text, "-n", "40", "--drafter", "ngram")
    base = run_json(text, "-n", "40", "--no-draft")
    assert spec["token_ids"] == base["token_ids"]
    assert spec["models"]["draft"] is None
    st = spec["settings"]
    assert st["drafter"] == "ngram" and st["ngram"] == [2, 4] and st["adaptive_k"] is True
    s = spec["stats"]
    assert 0 < s["accepted"] <= s["drafted"]
    assert s["emitted_from_draft"] + s["emitted_from_target"] == spec["n_tokens"]
    assert s["seconds"]["draft_decode"] == 0.0
    # --target alone is enough for the n-gram drafter
    own = run_json(text, "-n", "8", "--drafter", "ngram", "--target", str(smol_path), "--fixed-k", "-k", "3")
    assert own["token_ids"] == base["token_ids"][:8] and own["settings"]["adaptive_k"] is False


# --------------------------------------------------------------------- bench
def bench(*args: str) -> Any:
    return runner.invoke(app, ["bench", *args])


@pytest.mark.slow
def test_bench_json_compares_configurations_side_by_side() -> None:
    res = bench(
        "--configs", "target,ngram:auto,model:2", "--category", "input-grounded", "--repeats", "1", "--warmup", "0",
        "-n", "24", "--threads", str(THREADS), "--ctx-size", "1024", "--ngram-draft-max", "8", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    rows = {r["config"]: r for r in out["results"]}
    assert set(rows) == {"target", "ngram:auto", "model:2"}
    assert rows["target"]["speedup"] == pytest.approx(1.0)
    for name in ("ngram:auto", "model:2"):
        r = rows[name]
        assert r["identical"] is True  # greedy: the same tokens as the target alone
        assert r["runs"] == 5 and r["tokens"] == rows["target"]["tokens"]
        assert 0 <= r["acceptance_rate"] <= 1
        assert sum(r["split"].values()) == pytest.approx(1.0, abs=1e-3)
        assert 0 <= r["overhead_fraction"] < 1
    assert rows["ngram:auto"]["split"]["draft_decode"] == 0
    assert rows["model:2"]["split"]["draft_decode"] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--configs", "model:zero"], "model:zero"),
        (["--configs", "eagle:3"], "eagle:3"),
        (["--configs", "target,target"], "twice"),
        (["--category", "no-such"], "no-such"),
    ],
)
def test_bench_bad_configs(args: list[str], needle: str) -> None:
    assert_one_line_error(bench(*args), 2, needle)


def test_bench_bad_prompts_file(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "fine"}\n{"oops": 1}\n')
    assert_one_line_error(bench("--prompts", str(f)), 2, "line 2")
    assert_one_line_error(bench("--prompts", str(tmp_path / "missing.jsonl")), 2, "missing.jsonl")


@pytest.mark.parametrize("command", ["run", "chat", "serve", "bench", "pair-check", "models list"])
def test_help_shows_flags_without_a_value_type(command: str) -> None:
    """A flag takes no value: its help row has no type (typer 0.29 printed `--help <bool>`); options keep theirs."""
    res = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output
    rows = [line for line in res.output.splitlines() if "--help" in line]
    assert rows and "Show this message" in rows[0]
    if command == "run":
        assert "<int>" in res.output and "<path>" in res.output

"""The README's first command on the shipped default pair: drafts accepted, `--compare`'s line, same text."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.comparison import Comparison
from specdec_cli.models import registry
from tests.conftest import THREADS

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_first_run() -> list[str]:
    """The arguments of the `specdec run` the README's first command ends with."""
    text = README.read_text()
    m = re.search(r"bash scripts/setup\.sh && \.venv/bin/specdec (run .*)", text)
    assert m, "the README's first command is set-up && specdec run ..."
    return shlex.split(m.group(1))


def test_the_readme_first_run_shows_speculation_and_the_same_text(smol_path: Path) -> None:
    """What a newcomer sees: the default pair (the shipped one, not the suite's) drafts, the target accepts,
    and `--compare` runs the target alone after it: the same tokens. Speed is not asserted (a busy machine)."""
    args = readme_first_run()
    assert "--compare" in args
    registry.user_models_toml().unlink()  # conftest's suite default: here, the shipped default
    res = CliRunner().invoke(app, [*args, "--json", "--threads", str(THREADS)])
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["models"]["pair"] == registry.load().default == "smollm2-135m-f32-q4"
    s, c = out["stats"], out["comparison"]
    assert s["drafted"] > 0 and s["accepted"] > 0 and s["emitted_from_draft"] > 0, s
    assert c["same_text"] is True and c["first_difference"] is None and c["sampled"] is False
    assert c["target_alone"]["text"] == out["text"] and c["target_alone"]["n_tokens"] == out["n_tokens"]
    tps = c["tokens_per_second"]
    assert tps["speculative"] == round(s["tokens_per_second"], 3) and tps["target_alone"] > 0
    assert abs(c["speedup"] - tps["speculative"] / tps["target_alone"]) < 0.01


def test_the_compare_line_says_what_was_compared(smol_path: Path) -> None:
    """Greedy: same text yes/no with where it differs; sampled: two draws, not compared token for token."""
    res = CliRunner().invoke(app, ["run", "Name three rivers.", "-n", "12", "--compare", "--threads", str(THREADS)])
    assert res.exit_code == 0, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"compare: same text: yes \(\d+ tokens\) · [\d.]+ tokens/s, the target alone [\d.]+: [\d.]+x",
                        line), line  # fmt: skip
    res = CliRunner().invoke(app, ["run", "Name three rivers.", "-n", "12", "--compare", "--temp", "0.8", "--seed", "1",
                                   "--json", "--threads", str(THREADS)])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    c = json.loads(res.stdout)["comparison"]
    assert c["sampled"] is True and c["tokens_per_second"]["target_alone"] > 0
    res = CliRunner().invoke(app, ["run", "Name three rivers.", "-n", "4", "--compare", "--no-draft", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["comparison"] is None
    res = CliRunner().invoke(app, ["run", "Name three rivers.", "-n", "4", "--compare", "--no-draft"])
    assert res.exit_code == 0 and "this run was the target alone: nothing to compare" in res.stderr


def test_a_difference_is_found_and_said(smol_path: Path) -> None:
    """The comparison itself: where two token lists first differ, one ending first included."""
    from specdec_cli.api import load

    with load(n_ctx=256, n_threads=THREADS) as spec:
        c = spec.compare("Say hi.", max_tokens=6)
    assert c.same_text and c.greedy and c.first_difference is None
    other = Comparison(c.speculative, dataclasses.replace(c.alone, token_ids=[*c.alone.token_ids[:3], -1]))
    assert not other.same_text and other.first_difference == 3 and "same text: NO, from token 3" in other.line()
    shorter = Comparison(c.speculative, dataclasses.replace(c.alone, token_ids=c.alone.token_ids[:2]))
    assert shorter.first_difference == 2

"""The one settings type: every parameter checked once, named as each front end names it."""

from __future__ import annotations

import dataclasses
import math

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.cli.options import DraftOptions, SamplingOptions, generate_kwargs
from specdec_cli.engine.settings import PARAMS, GenerateOptions, InvalidSetting, check_load, flag

BAD = {"max_tokens": 0, "temperature": math.nan, "top_k": -1, "top_p": 0.0, "min_p": 1.0, "seed": -1,
       "draft_max": 65, "draft_min": 0, "draft_p_min": 1.0}  # fmt: skip


def test_every_parameter_has_a_bad_value_here() -> None:
    assert set(BAD) == set(PARAMS)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_names_the_parameter_and_each_front_end_renames_it(name: str) -> None:
    with pytest.raises(InvalidSetting) as info:
        GenerateOptions(**{name: BAD[name]}).validate()  # type: ignore[arg-type]
    exc = info.value
    assert exc.param == name and exc.http_param == name
    assert str(exc).startswith(f"{name} must be ")
    assert "--" not in str(exc)  # never a flag: the API and the server show this text as it is
    assert exc.named(PARAMS[name].flag).startswith(f"{PARAMS[name].flag} must be ")


def test_draft_min_is_checked_against_the_resolved_draft_max() -> None:
    with pytest.raises(InvalidSetting, match=r"^draft_min must be in \[1, draft_max=3\], got 5"):
        GenerateOptions(draft_max=3, draft_min=5).validate()
    GenerateOptions(draft_min=6).validate()  # draft_max not given: the drafter's default decides (auto's is 8)
    assert GenerateOptions(draft_min=5).resolved(3).draft_min == 3  # and draft_min is capped to it
    assert GenerateOptions().resolved(6).k_max == 6


def test_given_keeps_defaults_where_a_request_says_nothing() -> None:
    d = GenerateOptions(temperature=0.5, max_tokens=9)
    o = d.given(temperature=None, top_k=3, max_tokens=None)
    assert (o.temperature, o.top_k, o.max_tokens) == (0.5, 3, 9)


def test_load_parameters_have_flags() -> None:
    for kw, param in [({"n_ctx": 4}, "n_ctx"), ({"n_threads": 0}, "n_threads"), ({"parallel": 0}, "parallel"),
                      ({"ngram": (3, 2)}, "ngram")]:  # fmt: skip
        args = {"n_ctx": 512, "n_threads": None, **kw}
        with pytest.raises(InvalidSetting) as info:
            check_load(**args)  # type: ignore[arg-type]
        assert info.value.param == param and flag(param).startswith("--")


def test_cli_option_groups_are_the_parameters() -> None:
    """The CLI's groups are named as the parameters and default as GenerateOptions does."""
    kw = generate_kwargs(SamplingOptions(), DraftOptions())
    assert set(kw) - {"adaptive"} <= set(PARAMS)
    defaults = GenerateOptions()
    assert all(getattr(defaults, k) == v for k, v in kw.items() if k != "adaptive")
    assert {f.name for f in dataclasses.fields(SamplingOptions)} | {f.name for f in dataclasses.fields(DraftOptions)} \
        == set(PARAMS) - {"max_tokens"}


@pytest.mark.parametrize(("args", "line"), [
    (["--temp", "-1"], "Error: --temp must be a finite number >= 0 (0 = greedy), got -1.0"),
    (["--draft-max", "0"], "Error: --draft-max must be from 1 to 64, got 0 (drafter none runs the target alone)"),
    (["-n", "0"], "Error: --max-tokens must be >= 1, got 0"),
    (["--drafter", "ngram", "--no-draft"], "Error: --drafter ngram and --no-draft contradict each other"),
])  # fmt: skip
def test_the_command_line_names_its_flags(args: list[str], line: str) -> None:
    """Checked before any model loads: one line, exit 2."""
    res = CliRunner().invoke(app, ["run", "hello", *args])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == line


def test_every_parameter_is_a_flag_of_run_with_its_help() -> None:
    res = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "300", "TERM": "dumb"})
    for p in PARAMS.values():
        assert p.flag in res.output
        assert p.help.split(";")[0].split("(")[0].strip() in " ".join(res.output.split())


def test_the_server_schema_names_fields_as_the_parameters() -> None:
    """A request's sampling fields are the parameters' own names (so `given(...)` passes them through)."""
    from specdec_cli.server.schemas import ChatRequest, Speculative

    sampling = {"max_tokens", "temperature", "top_k", "top_p", "min_p", "seed"}
    assert sampling <= set(PARAMS) and sampling <= set(ChatRequest.model_fields)
    assert set(Speculative.model_fields) <= set(PARAMS) | {"drafter"}

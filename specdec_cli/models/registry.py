"""models.toml: named target/draft pairs, the user's overrides, and where their files are.

The bundled file ships with specdec; a file of the same shape in the platform's
config directory (`specdec models list` prints where) adds pairs or replaces
bundled ones by name, and may change `default`. Errors name the file, the line
and the field, so a typo is one edit away from fixed.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platformdirs import user_config_dir

from specdec_cli.engine.settings import MAX_DRAFT
from specdec_cli.errors import ConfigError, ModelFileError, env_directory
from specdec_cli.models import hub

SOURCE_KEYS = ("packaged", "repo", "path")
SOURCE_FIELDS = {"packaged", "requantize", "repo", "file", "revision", "path", "sha256", "size_gb", "unverified"}
PAIR_FIELDS = {"description", "target", "draft", "draft_max", "heads", "notes"}
REQUIRED = ("description", "target")  # and a draft, or heads, or both
MAX_SIZE_GB = 10_000.0


def bundled_models_toml() -> Path:
    """The models.toml shipped with specdec (inside the wheel, or the repo root)."""
    package = Path(__file__).resolve().parent.parent  # specdec_cli/
    for candidate in (package / "models.toml", package.parent / "models.toml"):
        if candidate.exists():
            return candidate
    raise ConfigError("models.toml is missing from this specdec installation; reinstall specdec")


def user_models_toml() -> Path:
    """The user's override file (SPECDEC_CONFIG_DIR overrides the platform's config directory)."""
    return env_directory("SPECDEC_CONFIG_DIR", user_config_dir("specdec")) / "models.toml"


@dataclass(frozen=True)
class Source:
    packaged: str | None = None
    requantize: str | None = None
    repo: str | None = None
    file: str | None = None
    revision: str = "main"
    path: str | None = None
    sha256: str | None = None
    size_gb: float | None = None  # as the hub's file listing shows it; None when unknown
    unverified: str | None = None  # what could not be checked when the entry was written

    @property
    def kind(self) -> str:
        if self.packaged:
            return "requantize" if self.requantize else "packaged"
        return "hub" if self.repo else "path"

    def hub_file(self) -> hub.HubFile:
        assert self.repo and self.file
        return hub.HubFile(self.repo, self.file, self.revision, self.sha256)

    def short(self) -> str:
        """The file name for a hub source (the repo is in `describe`)."""
        return self.file if self.repo and self.file else self.describe()

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
    draft: Source | None  # None: the pair drafts with its heads (and the lookup) only
    draft_max: int = 4
    notes: str = ""
    origin: Path = field(default_factory=Path)
    heads: Path | None = None  # Medusa heads for the target (`specdec heads train`), a local file

    def sources(self) -> list[tuple[str, Source]]:
        """(role, source) of its model files: the target, and the draft when it has one."""
        return [("target", self.target), *([("draft", self.draft)] if self.draft is not None else [])]


def _heads_path(text: str | None, origin: Path) -> Path | None:
    """A pair's heads file: `~` expanded, a relative path read from the folder of the file that names it."""
    if not text:
        return None
    path = Path(text).expanduser()
    return path if path.is_absolute() else origin.parent / path


@dataclass(frozen=True)
class Registry:
    pairs: dict[str, Pair]
    default: str | None
    files: tuple[Path, ...] = ()  # the files read, bundled first

    def get(self, name: str) -> Pair:
        try:
            return self.pairs[name]
        except KeyError:
            known = ", ".join(sorted(self.pairs)) or "none"
            raise ConfigError(
                f"no pair named {name!r} (known: {known}); `specdec models list` shows them, "
                f"and {user_models_toml()} can add one"
            ) from None

    def default_pair(self) -> Pair:
        if not self.default:
            raise ConfigError("models.toml declares no default pair; pass --target/--draft or --pair")
        return self.get(self.default)


# ------------------------------------------------------------------ parsing
class _Lines:
    """Line numbers for error messages: tomllib gives them only for syntax errors."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def of(self, pair: str, key: str | None = None) -> int | None:
        header = re.compile(rf"^\s*\[\s*pairs\s*\.\s*(\"?){re.escape(pair)}\1\s*\]")
        start = next((i for i, line in enumerate(self.lines) if header.match(line)), None)
        if start is None:
            return None
        if key is None:
            return start + 1
        assignment = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for i in range(start + 1, len(self.lines)):
            if self.lines[i].lstrip().startswith("["):
                break
            if assignment.match(self.lines[i]):
                return i + 1
        return start + 1


def _where(origin: Path, line: int | None) -> str:
    return f"{origin}:{line}" if line else str(origin)


def _source(data: Any, pair: str, role: str, origin: Path, lines: _Lines) -> Source:
    at = _where(origin, lines.of(pair, role))
    where = f"[pairs.{pair}].{role}"
    if not isinstance(data, dict):
        raise ConfigError(f"{at}: {where} must be a table such as {{ repo = ..., file = ... }}")
    kinds = [k for k in SOURCE_KEYS if k in data]
    if len(kinds) != 1:
        raise ConfigError(f"{at}: {where} needs exactly one of the fields {', '.join(SOURCE_KEYS)}")
    unknown = set(data) - SOURCE_FIELDS
    if unknown:
        raise ConfigError(f"{at}: {where} has unknown field(s): {', '.join(sorted(unknown))}")
    if "repo" in data and "file" not in data:
        raise ConfigError(f"{at}: {where} is missing the field 'file' (the .gguf inside {data['repo']})")
    for key, value in data.items():
        if key == "size_gb":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= MAX_SIZE_GB
            if not ok:  # written so that nan and inf fail it
                raise ConfigError(f"{at}: {where}.size_gb must be a number of gigabytes in (0, {MAX_SIZE_GB}]")
        elif not isinstance(value, str) or not value:
            raise ConfigError(f"{at}: {where}.{key} must be a non-empty string")
        elif any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(f"{at}: {where}.{key} contains control characters")
    if "repo" in data:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(data["repo"])
            if data["repo"].count("/") != 1:
                raise HFValidationError("needs exactly one '/'")
        except HFValidationError:
            raise ConfigError(
                f"{at}: {where}.repo must look like 'owner/name' (letters, digits, '-', '_', '.'), not {data['repo']!r}"
            ) from None
    if "file" in data:
        check_repo_file(data["file"], f"{at}: {where}.file")
    if "sha256" in data and not hub.SHA256.fullmatch(data["sha256"]):
        raise ConfigError(f"{at}: {where}.sha256 must be 64 lowercase hex digits")
    return Source(
        packaged=data.get("packaged"),
        requantize=data.get("requantize"),
        repo=data.get("repo"),
        file=data.get("file"),
        revision=data.get("revision", "main"),
        path=data.get("path"),
        sha256=data.get("sha256"),
        size_gb=float(data["size_gb"]) if "size_gb" in data else None,
        unverified=data.get("unverified"),
    )


def check_repo_file(name: str, where: str) -> None:
    """A file inside a repository: a relative path going nowhere outside it, ending in .gguf."""
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{where} must be a path inside the repository (no '..', '.', leading '/' or '\\'), not {name!r}")
    if not name.endswith(".gguf"):
        raise ConfigError(f"{where} must name a .gguf file, not {name!r}")


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def parse(text: str, origin: Path) -> Registry:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        pos = _TOML_POSITION.search(message)
        if pos:
            raise ConfigError(
                f"{origin}:{pos.group(1)}:{pos.group(2)}: invalid TOML: {message[: pos.start()]}"
            ) from None
        raise ConfigError(f"{origin}: invalid TOML: {message}") from None
    lines = _Lines(text)
    unknown_top = set(doc) - {"default", "pairs"}
    if unknown_top:
        raise ConfigError(f"{origin}: unknown top-level field(s): {', '.join(sorted(unknown_top))}")
    raw_pairs = doc.get("pairs", {})
    if not isinstance(raw_pairs, dict):
        raise ConfigError(f"{origin}: 'pairs' must be a table of [pairs.NAME] entries")
    pairs: dict[str, Pair] = {}
    for name, entry in raw_pairs.items():
        at = _where(origin, lines.of(name))
        where = f"[pairs.{name}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}: {where} must be a table")
        for required in REQUIRED:
            if required not in entry:
                raise ConfigError(f"{at}: {where} is missing the field '{required}'")
        if "draft" not in entry and "heads" not in entry:
            raise ConfigError(f"{at}: {where} needs a 'draft' model, a 'heads' file (`specdec heads train`), or both")
        unknown = set(entry) - PAIR_FIELDS
        if unknown:
            raise ConfigError(f"{at}: {where} has unknown field(s): {', '.join(sorted(unknown))}")
        for text_field in ("description", "notes", "heads"):
            if text_field in entry and not isinstance(entry[text_field], str):
                raise ConfigError(
                    f"{_where(origin, lines.of(name, text_field))}: {where}.{text_field} must be a string"
                )
        draft_max = entry.get("draft_max", 4)
        if not isinstance(draft_max, int) or isinstance(draft_max, bool) or not 1 <= draft_max <= MAX_DRAFT:
            raise ConfigError(
                f"{_where(origin, lines.of(name, 'draft_max'))}: {where}.draft_max must be an integer from 1 to {MAX_DRAFT}"
            )
        pairs[name] = Pair(
            name=name,
            description=entry["description"],
            target=_source(entry["target"], name, "target", origin, lines),
            draft=_source(entry["draft"], name, "draft", origin, lines) if "draft" in entry else None,
            draft_max=draft_max,
            notes=entry.get("notes", ""),
            origin=origin,
            heads=_heads_path(entry.get("heads"), origin),
        )
    default = doc.get("default")
    if default is not None and not isinstance(default, str):
        raise ConfigError(f"{origin}: default must be the name of a pair")
    return Registry(pairs, default, (origin,))


def _read(path: Path) -> Registry:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse(text, path)


def load(path: Path | None = None) -> Registry:
    """The bundled pairs plus the user's file (or only `path`, when given)."""
    if path is not None:
        reg = _read(path)
        _check_default(reg, path)
        return reg
    reg = _read(bundled_models_toml())
    user = user_models_toml()
    if user.exists():
        mine = _read(user)
        reg = Registry({**reg.pairs, **mine.pairs}, mine.default or reg.default, (*reg.files, user))
        _check_default(reg, user if mine.default else reg.files[0])
    else:
        _check_default(reg, reg.files[0])
    return reg


def _check_default(reg: Registry, origin: Path) -> None:
    if reg.default is not None and reg.default not in reg.pairs:
        raise ConfigError(f"{origin}: default = {reg.default!r} names no [pairs.{reg.default}] entry")


# ------------------------------------------------------------------ files on disk
def on_disk(source: Source) -> Path | None:
    """The source's local file if it is there now, without building or downloading anything."""
    from specdec_cli.models import packaged

    if source.packaged:
        try:
            base = packaged.packaged_path(source.packaged)
        except ModelFileError:
            return None
        return packaged.derived_if_built(base, source.requantize) if source.requantize else base
    if source.path:
        p = Path(source.path).expanduser()
        return p if p.is_file() else None
    return hub.local_path(source.hub_file())


def resolve(source: Source, pair_name: str, role: str = "model") -> Path:
    """The local file for a source, building a derived draft if needed (never downloads)."""
    from specdec_cli.models import packaged

    if source.packaged:
        base = packaged.packaged_path(source.packaged)
        return packaged.derived_draft(base, source.requantize) if source.requantize else base
    if source.path:
        return Path(source.path).expanduser()
    found = hub.local_path(source.hub_file())
    if found is not None:
        return found
    size = f" ({source.size_gb:g} GB)" if source.size_gb else ""
    raise ModelFileError(
        f"pair {pair_name!r}: the {role} {source.repo}/{source.file}{size} is not on disk: "
        f"run `specdec models pull {pair_name}`, or {hub.fetch_by_hand(source.hub_file())}"
    )


@dataclass
class PairStatus:
    """A pair and where its files are now (nothing built or downloaded to find out)."""

    pair: Pair
    target_path: Path | None
    draft_path: Path | None
    target_url: str | None = None
    draft_url: str | None = None
    partial: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of(pair: Pair) -> PairStatus:
        e = PairStatus(pair, on_disk(pair.target), on_disk(pair.draft) if pair.draft else None)
        for role, src in pair.sources():
            if src.repo:
                setattr(e, f"{role}_url", hub.file_url(src.hub_file()))
                kept = hub.partial_bytes(src.hub_file()) if getattr(e, f"{role}_path") is None else 0
                if kept:
                    e.partial[role] = kept
        return e

    @property
    def state(self) -> str:
        ready = [
            src is None or path is not None or bool(src.requantize)  # a requantized draft is built offline on first use
            for path, src in ((self.target_path, self.pair.target), (self.draft_path, self.pair.draft))
        ]
        state = {(True, True): "yes", (True, False): "target only", (False, True): "draft only"}.get(
            (ready[0], ready[1]), "no"
        ) if self.pair.draft is not None else "yes" if ready[0] else "no"
        if self.partial:
            state += " (partial download kept)"
        return state

    def as_dict(self, default: str | None) -> dict[str, object]:
        p = self.pair

        def source(src: Source, path: Path | None, url: str | None) -> dict[str, object]:
            return {
                "kind": src.kind,
                "source": src.describe(),
                "repo": src.repo,
                "file": src.file,
                "url": url,
                "size_gb": src.size_gb,
                "unverified": src.unverified,
                "path": str(path) if path else None,
            }

        return {
            "name": p.name,
            "default": p.name == default,
            "description": p.description,
            "draft_max": p.draft_max,
            "notes": p.notes,
            "origin": str(p.origin),
            "on_disk": self.state,
            "target": source(p.target, self.target_path, self.target_url),
            "draft": source(p.draft, self.draft_path, self.draft_url) if p.draft else None,
            "heads": str(p.heads) if p.heads else None,
        }

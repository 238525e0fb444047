"""`specdec models`: list, show, pull and locate the pairs models.toml names."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specdec_cli.cli_common import user_errors
from specdec_cli.errors import ModelFileError

if TYPE_CHECKING:  # imported lazily at run time, so `--help` stays fast
    from specdec_cli.registry import Pair, Source

app = typer.Typer(
    name="models",
    help="Named target/draft pairs (models.toml): list them, show one, pull its files, print its paths.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="A pair's name (see `specdec models list`).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


@dataclass
class Entry:
    """A pair and where its files are now (nothing built or downloaded to find out)."""

    pair: Pair
    target_path: Path | None
    draft_path: Path | None
    target_url: str | None = None
    draft_url: str | None = None
    partial: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> str:
        ready = [
            path is not None or bool(src.requantize)  # a requantized draft is built offline on first use
            for path, src in ((self.target_path, self.pair.target), (self.draft_path, self.pair.draft))
        ]
        state = {(True, True): "yes", (True, False): "target only", (False, True): "draft only"}.get(
            (ready[0], ready[1]), "no"
        )
        if self.partial:
            state += " (partial download kept)"
        return state


def _entry(pair: Pair) -> Entry:
    from specdec_cli import hub, registry

    e = Entry(pair, registry.on_disk(pair.target), registry.on_disk(pair.draft))
    for role, src in (("target", pair.target), ("draft", pair.draft)):
        if src.repo:
            setattr(e, f"{role}_url", hub.file_url(src.hub_file()))
            kept = hub.partial_bytes(src.hub_file()) if getattr(e, f"{role}_path") is None else 0
            if kept:
                e.partial[role] = kept
    return e


def _source_json(src: Source, path: Path | None, url: str | None) -> dict[str, object]:
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


def _entry_json(e: Entry, default: str | None) -> dict[str, object]:
    p = e.pair
    return {
        "name": p.name,
        "default": p.name == default,
        "description": p.description,
        "draft_max": p.draft_max,
        "notes": p.notes,
        "origin": str(p.origin),
        "on_disk": e.state,
        "target": _source_json(p.target, e.target_path, e.target_url),
        "draft": _source_json(p.draft, e.draft_path, e.draft_url),
    }


@app.command("list")
def models_list(json_out: JsonOpt = False) -> None:
    """Every pair: target, draft, sizes, and whether the files are on disk."""
    from specdec_cli import registry, render

    with user_errors():
        reg = registry.load()
        entries = [_entry(p) for p in reg.pairs.values()]
    if json_out:
        payload = {
            "default": reg.default,
            "files": [str(f) for f in reg.files],
            "user_file": str(registry.user_models_toml()),
            "pairs": [_entry_json(e, reg.default) for e in entries],
        }
        typer.echo(json.dumps(payload))
        return
    render.models_table(entries, default=reg.default, files=list(reg.files), user_file=registry.user_models_toml())


@app.command("show")
def models_show(name: NameArg, json_out: JsonOpt = False) -> None:
    """One pair in full: sources, URLs, sizes, what was not verified, paths on disk."""
    from specdec_cli import registry, render

    with user_errors():
        reg = registry.load()
        e = _entry(reg.get(name))
    if json_out:
        typer.echo(json.dumps(_entry_json(e, reg.default)))
        return
    render.model_show(e, default=reg.default)


@app.command("path")
def models_path(
    name: NameArg,
    role: Annotated[
        str | None, typer.Option(help="Print only the target's or only the draft's path.", show_default=False)
    ] = None,
) -> None:
    """Print the pair's local files, target then draft, one per line (for scripts).

    Exit code 1, with how to pull, when a file is not on disk.
    """
    from specdec_cli import registry

    if role not in (None, "target", "draft"):
        from specdec_cli.cli_common import usage_error

        raise usage_error(f"--role must be target or draft, not {role!r}")
    with user_errors():
        pair = registry.load().get(name)
        roles = [r for r in ("target", "draft") if role in (None, r)]
        paths = [registry.resolve(getattr(pair, r), pair.name, r) for r in roles]
        for p in paths:
            if not p.is_file():
                raise ModelFileError(f"pair {pair.name!r}: {p} does not exist")
    for p in paths:
        typer.echo(str(p))


@app.command("pull")
def models_pull(
    name: NameArg,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show huggingface-hub's own log (retries).")] = False,
) -> None:
    """Download the pair's files into the Hugging Face cache, resuming an interrupted download.

    Honours HF_TOKEN, HF_ENDPOINT, HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE.

    Prints the two paths (target, draft) on stdout when both are on disk.
    """
    from specdec_cli import hub, registry, render

    if not verbose:
        from huggingface_hub.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # its retry warnings; our progress and errors say what matters
    sink = render.DownloadProgress()
    paths: list[Path] = []
    with user_errors(on_error=sink.finish):
        pair = registry.load().get(name)
        try:
            for role in ("target", "draft"):
                src = getattr(pair, role)
                if src.repo:
                    already = hub.local_path(src.hub_file())
                    if already is None:
                        paths.append(hub.pull(src.hub_file(), sink))
                    else:
                        sink.note(f"{role}: {src.describe()} is already on disk")
                        paths.append(already)
                elif src.requantize and registry.on_disk(src) is None:
                    sink.note(f"{role}: building the {src.requantize} requantization of {src.packaged} (no network)")
                    paths.append(registry.resolve(src, pair.name, role))
                else:
                    path = registry.resolve(src, pair.name, role)
                    if not path.is_file():
                        raise ModelFileError(
                            f"pair {pair.name!r}: the {role} is a local path that does not exist: {path}"
                        )
                    paths.append(path)
        except KeyboardInterrupt:
            sink.finish()
            from specdec_cli.render import error_line

            error_line(f"interrupted: what was downloaded is kept; run `specdec models pull {name}` again to resume")
            raise typer.Exit(130) from None
        finally:
            sink.finish()
    for p in paths:
        typer.echo(str(p))
    sys.stdout.flush()

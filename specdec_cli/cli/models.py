"""`specdec models`: list, show, pull and locate the pairs models.toml names."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from specdec_cli.cli.options import JsonOpt
from specdec_cli.cli.output import Output, usage_error, user_errors
from specdec_cli.errors import ExitCode, ModelFileError

app = typer.Typer(
    name="models",
    help="Named target/draft pairs (models.toml): list them, show one, pull its files, print its paths.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="A pair's name (see `specdec models list`).", show_default=False)]


@app.command("list")
def models_list(json_out: JsonOpt = False) -> None:
    """Every pair: target, draft, sizes, and whether the files are on disk."""
    from specdec_cli.models import registry

    out = Output(json_out)
    with out.errors():
        reg = registry.load()
        entries = [registry.PairStatus.of(p) for p in reg.pairs.values()]

    def human() -> None:
        from specdec_cli.render.models import models_table

        models_table(entries, default=reg.default, files=list(reg.files), user_file=registry.user_models_toml())

    payload = {
        "default": reg.default,
        "files": [str(f) for f in reg.files],
        "user_file": str(registry.user_models_toml()),
        "pairs": [e.as_dict(reg.default) for e in entries],
    }
    out.result(payload, human)


@app.command("show")
def models_show(name: NameArg, json_out: JsonOpt = False) -> None:
    """One pair in full: sources, URLs, sizes, what was not verified, paths on disk."""
    from specdec_cli.models import registry

    out = Output(json_out)
    with out.errors():
        reg = registry.load()
        e = registry.PairStatus.of(reg.get(name))

    def human() -> None:
        from specdec_cli.render.models import model_show

        model_show(e, default=reg.default)

    out.result(e.as_dict(reg.default), human)


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
    from specdec_cli.models import registry

    if role not in (None, "target", "draft"):
        raise usage_error(f"--role must be target or draft, not {role!r}")
    with user_errors():
        pair = registry.load().get(name)
        if role == "draft" and pair.draft is None:
            raise ModelFileError(f"pair {pair.name!r} has no draft model (it drafts with its heads)")
        paths = [registry.resolve(src, pair.name, r) for r, src in pair.sources() if role in (None, r)]
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
    from specdec_cli.models import hub, registry
    from specdec_cli.render import error_line
    from specdec_cli.render.models import DownloadProgress

    if not verbose:
        from huggingface_hub.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # its retry warnings; our progress and errors say what matters
    sink = DownloadProgress()
    paths: list[Path] = []
    with user_errors(on_error=sink.finish):
        pair = registry.load().get(name)
        try:
            for role, src in pair.sources():
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
            error_line(f"interrupted: what was downloaded is kept; run `specdec models pull {name}` again to resume")
            raise typer.Exit(ExitCode.INTERRUPTED) from None
        finally:
            sink.finish()
    for p in paths:
        typer.echo(str(p))
    sys.stdout.flush()

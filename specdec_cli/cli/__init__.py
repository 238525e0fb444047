"""The `specdec` command line: this module only registers the commands (as huggingface_hub's `hf.py` does).

Each command lives in its own module and calls the library (`specdec_cli.api`);
options shared by several commands are defined once in `options.py`, and
`output.py` decides between human output and `--json`.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from specdec_cli import __version__
from specdec_cli.cli import bench, chat, models, pair_check, run

app = typer.Typer(
    name="specdec",
    help="Lossless speculative decoding for local GGUF models: faster, with exactly the target's output.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specdec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Lossless speculative decoding for local GGUF models."""


app.command("run")(run.run)
app.command("pair-check")(pair_check.pair_check)
app.command("chat")(chat.chat)
app.command("bench")(bench.bench)
app.add_typer(models.app)


def main() -> None:
    """Entry point: Click's own usage errors (unknown option, bad type) become one line too."""
    from specdec_cli.render import error_line

    try:
        rv = app(prog_name="specdec", standalone_mode=False)
    except typer.TyperException as exc:  # Click's UsageError and friends
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        error_line(exc.format_message() + hint)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)

"""The `specdec` command line: this module only registers the commands (as huggingface_hub's `hf.py` does).

Each command lives in its own module and calls the library (`specdec_cli.api`);
options shared by several commands are defined once in `options.py`, and
`output.py` decides between human output and `--json`.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Annotated

import typer
import typer.core

from specdec_cli import __version__
from specdec_cli.cli import bench, chat, heads, models, ngram_cache, pair_check, rpc_server, run, serve
from specdec_cli.errors import ExitCode


def _flags_show_no_type() -> None:
    """Typer 0.29's help shows every flag with a value type (`--help <bool>`, `--json <bool>`), as if
    it took `true`/`false`; a flag takes no value, so its type column stays empty (as click prints it)."""
    shown = typer.core.TyperOption.display_type_rich

    def display_type_rich(self: typer.core.TyperOption, ctx: typer.core._click.Context) -> str | None:
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    typer.core.TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_type()

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
app.command("serve")(serve.serve)
app.command("rpc-server")(rpc_server.rpc_server)
app.add_typer(models.app)
app.add_typer(ngram_cache.app)
app.add_typer(heads.app)


def main() -> None:
    """Entry point: every failure ends in one line on stderr and a non-zero exit.

    Click's own usage errors (unknown option, bad type) become one line too; a
    reader that goes away (`| head`) ends the run quietly, as other CLIs do; an
    output that cannot be written (closed, a full disk) is one line; anything
    else is reported as an internal error (SPECDEC_DEBUG=1 shows the traceback).
    """
    from specdec_cli.render import error_line

    if sys.stdout is None:  # started with stdout closed (`>&-`)
        error_line("stdout is closed: there is nowhere to write the output")
        sys.exit(ExitCode.ERROR)
    try:
        rv = app(prog_name="specdec", standalone_mode=False)
    except typer.TyperException as exc:  # Click's UsageError and friends
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        error_line(exc.format_message() + hint)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(ExitCode.ERROR)
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(ExitCode.BROKEN_PIPE)
    except OSError as exc:
        _silence_stdout()
        if exc.filename is None and exc.errno in (errno.ENOSPC, errno.EBADF, errno.EIO, errno.EDQUOT):
            error_line(f"cannot write the output: {exc.strerror}")
        else:
            error_line(str(exc))
        sys.exit(ExitCode.ERROR)
    except Exception as exc:  # a bug: still one line, with a way to see more
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        error_line(f"internal error: {type(exc).__name__}: {exc} (SPECDEC_DEBUG=1 shows where; please report it)")
        sys.exit(ExitCode.INTERNAL)
    _flush_stdout()
    sys.exit(rv if isinstance(rv, int) else 0)


def _flush_stdout() -> None:
    """Flush now, so a failed write is reported here and not as 'Exception ignored' at exit."""
    from specdec_cli.render import error_line

    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(ExitCode.BROKEN_PIPE)
    except OSError as exc:
        _silence_stdout()
        error_line(f"cannot write the output: {exc.strerror}")
        sys.exit(ExitCode.ERROR)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass

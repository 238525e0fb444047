"""What every command shares: one `Error:` line for a user's mistake, and its exit code."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator
from typing import Any

import typer

from specdec_cli.errors import SpecdecError


@contextlib.contextmanager
def user_errors(on_error: Any = None) -> Iterator[None]:
    """Map SpecdecError to one `Error:` line and its exit code; SPECDEC_DEBUG=1 shows the traceback."""
    try:
        yield
    except SpecdecError as exc:
        if on_error is not None:
            on_error()
        if os.environ.get("SPECDEC_DEBUG"):
            traceback.print_exc()
        from specdec_cli.render import error_line

        error_line(str(exc))
        raise typer.Exit(exc.exit_code) from None


def usage_error(message: str) -> typer.Exit:
    from specdec_cli.render import error_line

    error_line(message)
    return typer.Exit(2)

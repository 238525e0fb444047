"""The one place that decides human output or `--json` (as huggingface_hub's CLI does in its output module).

A command builds its result (a JSON-able payload and a function that shows it
to a person) and hands both to `Output`; it never branches on `--json` itself.
Errors go through `Output.errors()`: a `SpecdecError` becomes one `Error:` line
on stderr and its exit code (1, or 2 for usage errors); `SPECDEC_DEBUG=1`
shows the traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

import typer

from specdec_cli.errors import ExitCode, SpecdecError

if TYPE_CHECKING:
    from specdec_cli.render.generation import Renderer


def usage_error(message: str) -> typer.Exit:
    from specdec_cli.render import error_line

    error_line(message)
    return typer.Exit(ExitCode.USAGE)


class Output:
    def __init__(self, json_mode: bool = False, out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        self.json = json_mode
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._teardown: list[Callable[[], None]] = []

    # ------------------------------------------------------------ results
    def result(self, payload: dict[str, Any], human: Callable[[], None]) -> None:
        """One JSON object on stdout, or the human rendering."""
        if self.json:
            self.out.write(json.dumps(payload, ensure_ascii=False) + "\n")
            self.out.flush()
        else:
            human()

    def generation(self, title: str, heads: bool = False, compare: bool = False) -> Renderer:
        """Streams a generation: coloured text and a live panel, plain text, or JSON at the end. `heads`: the
        legend names the heads' colour (they are loaded); `compare`: a comparison follows (`Renderer.compared`)."""
        from specdec_cli.render.generation import make_renderer

        renderer = make_renderer(self.json, self.out, self.err, title=title, heads=heads, compare=compare)
        self._teardown.append(renderer.abort)
        return renderer

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        """A spinner with `message` on a terminal while something runs (never with --json or on a pipe)."""
        if self.json or not self.err.isatty():
            yield
            return
        from rich.console import Console

        with Console(file=self.err).status(message):
            yield

    @contextlib.contextmanager
    def progress(self, total: int) -> Iterator[Callable[[str], None]]:
        """A progress bar on a terminal (never with --json); yields the function that advances it."""
        if self.json or not self.err.isatty():
            yield lambda _label: None
            return
        from specdec_cli.render.reports import bench_progress

        with bench_progress(total) as advance:
            yield advance

    # ------------------------------------------------------- diagnostics
    def warning(self, message: str) -> None:
        from specdec_cli.render import warning

        warning(message, self.err)

    def note(self, message: str) -> None:
        """Information for a person (never with --json): stderr."""
        if not self.json:
            self.err.write(message + "\n")

    @contextlib.contextmanager
    def errors(self, on_error: Callable[[], None] | None = None) -> Iterator[None]:
        """Map SpecdecError to one `Error:` line and its exit code."""
        try:
            yield
        except SpecdecError as exc:
            for teardown in self._teardown:
                teardown()
            if on_error is not None:
                on_error()
            if os.environ.get("SPECDEC_DEBUG"):
                traceback.print_exc()
            from specdec_cli.engine.settings import InvalidSetting, flag
            from specdec_cli.render import error_line

            # a parameter's message, with the parameter called by its flag here
            error_line(exc.named(flag(exc.param)) if isinstance(exc, InvalidSetting) else str(exc), self.err)
            raise typer.Exit(exc.exit_code) from None


def user_errors(on_error: Callable[[], None] | None = None) -> contextlib.AbstractContextManager[None]:
    """`Output().errors()` for commands with no other output to decide."""
    return Output().errors(on_error)


def read_prompt(prompt: str | None) -> str:
    """The PROMPT argument, or stdin; checked to be UTF-8 before any model loads."""
    from specdec_cli.engine.native import encode_utf8

    if prompt is None or prompt == "-":
        if prompt is None and sys.stdin.isatty():
            raise usage_error("give a PROMPT, or pipe one on stdin (use - to read stdin explicitly)")
        text = sys.stdin.read()
        if not text.strip():
            raise usage_error("the prompt read from stdin is empty")
        encode_utf8(text, "the prompt read from stdin")
        return text.rstrip("\n")
    encode_utf8(prompt, "the prompt")
    return prompt

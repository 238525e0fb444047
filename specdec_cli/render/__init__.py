"""All terminal output lives in this package; nothing else imports Rich.

- `generation`: token colouring, the live stats panel, run and chat summaries;
- `reports`: pair-check, the probe and bench tables, bench progress;
- `models`: `specdec models` tables and download progress.

stdout carries results only (the generated text, tables a command is asked
for, or one JSON object); legends, live panels, progress, warnings and errors
go to stderr. The helpers here are plain writes, so `--help` and error paths
never import Rich.
"""

from __future__ import annotations

import os
import re
import sys
from typing import IO


def no_color() -> bool:
    return bool(os.environ.get("NO_COLOR"))


# C0 controls but newline and tab, DEL, and C1 controls: what a terminal acts on instead of showing.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escape(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def visible(text: str) -> str:
    """Control characters as `\\x1b`-style escapes, so generated text cannot drive the terminal.

    Used wherever model output or file metadata reaches a terminal; `--json`
    and pipes get the exact text.
    """
    return _CONTROL.sub(_escape, text)


def one_line(text: str) -> str:
    """`visible`, and newlines escaped too: an error or warning stays one line."""
    return _CONTROL_OR_NEWLINE.sub(_escape, text)


def error_line(message: str, err: IO[str] | None = None) -> None:
    (err or sys.stderr).write(f"Error: {one_line(message)}\n")


def warning(message: str, err: IO[str] | None = None) -> None:
    (err or sys.stderr).write(f"Warning: {one_line(message)}\n")


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def rate(x: float | None) -> str:
    """An acceptance rate, or "-" where nothing was drafted (None)."""
    return "-" if x is None else pct(x)

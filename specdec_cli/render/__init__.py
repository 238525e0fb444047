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
import sys
from typing import IO


def no_color() -> bool:
    return bool(os.environ.get("NO_COLOR"))


def error_line(message: str, err: IO[str] | None = None) -> None:
    (err or sys.stderr).write(f"Error: {message}\n")


def warning(message: str, err: IO[str] | None = None) -> None:
    (err or sys.stderr).write(f"Warning: {message}\n")


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"

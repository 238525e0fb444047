"""One error family whose messages tell the user what to do next.

The CLI's entry point maps every `SpecdecError` to a single `Error: ...` line on
stderr and exit code 1; nothing below the CLI prints or exits.
"""

from __future__ import annotations

import os
from pathlib import Path


class SpecdecError(Exception):
    """A problem the user can act on; its message is shown as is."""

    exit_code = 1


class UsageError(SpecdecError, ValueError):
    """A value or a combination of options that cannot work (exit code 2).

    Also a ValueError, so that Python callers of the API can catch it as one.
    """

    exit_code = 2


class ModelFileError(SpecdecError):
    """A model path that is missing, not GGUF, truncated, or unloadable."""


class IncompatiblePairError(SpecdecError):
    """Target and draft cannot speculate together (vocabularies differ)."""


class ContextError(SpecdecError):
    """The prompt does not fit in the context window."""


class ConfigError(SpecdecError):
    """models.toml (or a user override file) is invalid."""


class UnsupportedModelError(SpecdecError):
    """The model cannot do what was asked (no cache rollback, no chat template)."""


class ModelOutputError(SpecdecError):
    """A model produced logits that are not finite numbers (corrupt weights)."""


class InternalError(SpecdecError):
    """A bug met while generating (a 500 in the server), as opposed to the request's own fault."""


def env_directory(variable: str, default: str | os.PathLike[str]) -> Path:
    """A directory named by an environment variable (or the default), refused if it is a file."""
    raw = os.environ.get(variable)
    path = Path(raw).expanduser() if raw else Path(default)
    if path.exists() and not path.is_dir():
        where = f"{variable}={raw}" if raw else str(path)
        raise ConfigError(f"{where} is not a directory: point {variable} at a directory (or unset it)")
    return path

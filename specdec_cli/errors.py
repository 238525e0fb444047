"""One error family whose messages tell the user what to do next, and the one table of what each is.

Each class says, once, how the CLI exits on it (`exit_code`, one `Error: ...` line on stderr) and
how the server answers it (`http_status`, OpenAI's error `type` and `code`, and the request field
at fault); nothing below the CLI and the server prints, exits or picks a status.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path


class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1  # a SpecdecError the user can act on (or a failed check: pair-check's verdict)
    USAGE = 2  # a bad value or option (Click's own parse errors too)
    INTERNAL = 70  # a bug (EX_SOFTWARE); SPECDEC_DEBUG=1 shows the traceback
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
    BROKEN_PIPE = 141  # the reader went away (`| head`): 128 + SIGPIPE


class SpecdecError(Exception):
    """A problem the user can act on; its message is shown as is."""

    exit_code = ExitCode.ERROR
    http_status = 400
    http_type = "invalid_request_error"
    http_code: str | None = "invalid_request"
    http_param: str | None = None  # the request field at fault


class UsageError(SpecdecError, ValueError):
    """A value or a combination of options that cannot work.

    Also a ValueError, so that Python callers of the API can catch it as one.
    """

    exit_code = ExitCode.USAGE
    http_code = "invalid_value"


class ModelFileError(SpecdecError):
    """A model path that is missing, not GGUF, truncated, or unloadable."""


class IncompatiblePairError(SpecdecError):
    """Target and draft cannot speculate together (vocabularies differ)."""


class ContextError(SpecdecError):
    """The prompt does not fit in the context window."""

    http_code = "context_length_exceeded"
    http_param = "messages"


class ConfigError(SpecdecError):
    """models.toml (or a user override file) is invalid."""


class UnsupportedModelError(SpecdecError):
    """The model cannot do what was asked (no cache rollback, no chat template)."""


class ModelOutputError(SpecdecError):
    """A model produced logits that are not finite numbers (corrupt weights)."""


class PoolFileError(SpecdecError):
    """A token pool file (`--ngram-cache`) that is damaged, or was saved for another vocabulary."""


class RpcError(SpecdecError):
    """An RPC server (`--rpc`) that cannot be reached, speaks another protocol, runs inexact kernels, ran
    out of memory, or stopped answering: the message names the endpoint. The server answers 503: the fault
    is elsewhere, and a later request may succeed once the RPC server is back."""

    http_status = 503
    http_type = "server_error"
    http_code = "rpc_server_unavailable"


class DeviceError(SpecdecError):
    """llama.cpp's libraries or the GPU cannot do what was asked: a library that does not load (a GPU build on a
    machine without the NVIDIA driver), a model or a context that does not fit in the GPU's memory."""

    http_status = 503
    http_type = "server_error"
    http_code = "device_unavailable"


class InternalError(SpecdecError):
    """A bug met while generating (a 500 in the server), as opposed to the request's own fault."""

    http_status = 500
    http_type = "server_error"
    http_code = None

    @classmethod
    def of(cls, exc: BaseException) -> InternalError:
        """The bug `exc`, as the request or job that met it is told."""
        return cls(f"internal error: {type(exc).__name__}: {exc}")


def env_directory(variable: str, default: str | os.PathLike[str]) -> Path:
    """A directory named by an environment variable (or the default), refused if it is a file."""
    raw = os.environ.get(variable)
    path = Path(raw).expanduser() if raw else Path(default)
    if path.exists() and not path.is_dir():
        where = f"{variable}={raw}" if raw else str(path)
        raise ConfigError(f"{where} is not a directory: point {variable} at a directory (or unset it)")
    return path

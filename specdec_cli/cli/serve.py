"""`specdec serve`: an OpenAI-compatible server with lossless speculative decoding."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Annotated

import typer

from specdec_cli.cli.options import (
    DrafterOptions,
    DraftOptions,
    MaxTokensOpt,
    ModelOptions,
    NgramOptions,
    RuntimeOptions,
    SamplingOptions,
    generate_kwargs,
    load,
    placement_note,
    with_options,
)
from specdec_cli.cli.output import Output
from specdec_cli.engine.settings import DEFAULT_PROMPT_CACHE_MB

GRACEFUL_SECONDS = 10  # on SIGINT/SIGTERM: time for in-flight generations to finish before they are cancelled


@with_options
def serve(
    *,
    models: ModelOptions,
    drafting: DrafterOptions,
    draft: DraftOptions,
    ngram: NgramOptions,
    sampling: SamplingOptions,
    runtime: RuntimeOptions,
    max_tokens: MaxTokensOpt = 1024,
    host: Annotated[str, typer.Option(help="Address to listen on.", rich_help_panel="Server")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", rich_help_panel="Server")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(help="Require this key (Authorization: Bearer KEY); default: $SPECDEC_API_KEY.",
                     rich_help_panel="Server", show_default=False),
    ] = None,  # fmt: skip
    max_queue: Annotated[
        int, typer.Option(help="Requests that may wait for a slot; past this, 503.", rich_help_panel="Server")
    ] = 8,
    parallel: Annotated[
        int,
        typer.Option("--parallel", "-np", help="Slots: requests generated together, each step one batch "
                     "(each slot has its own --ctx-size). 1: one at a time.", rich_help_panel="Server"),
    ] = 4,
    fair: Annotated[
        bool,
        typer.Option("--fair/--no-fair", help="Keep drafting and prompt reading from holding up other streams: a "
                     "step's drafts add at most half a plain step, and short prompts are read first (--no-fair: "
                     "tokens per second over all slots only).", rich_help_panel="Server"),
    ] = True,
    prompt_cache_mb: Annotated[
        float,
        typer.Option("--prompt-cache-mb", help="Memory for slots' caches kept for prompts that come back (a "
                     "conversation another request's prompt displaced from its slot): restored instead of read "
                     "again, bit for bit. 0: none.", rich_help_panel="Server"),
    ] = DEFAULT_PROMPT_CACHE_MB,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option("--cors-origin", help="Let web pages from this origin call the server (repeat it; * for any "
                     "origin); pages from this machine (localhost, 127.0.0.1, [::1]) always may.",
                     rich_help_panel="Server", show_default=False),
    ] = None,
) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (--parallel requests at a time, the rest queued)."""
    import uvicorn

    from specdec_cli.api import GenerateOptions
    from specdec_cli.engine.settings import NONE, check_load
    from specdec_cli.errors import UsageError
    from specdec_cli.models import registry
    from specdec_cli.server.app import Server, ServerSettings

    QuietExit = _quiet_exit_class()  # noqa: N806
    out = Output()
    with out.errors():
        options = GenerateOptions(max_tokens=max_tokens, **generate_kwargs(sampling, draft, drafting.fixed_k)).validate()
        if not 0 <= port <= 65535:
            raise UsageError(f"--port must be from 0 to 65535, got {port}")
        if max_queue < 0:
            raise UsageError(f"--max-queue must be >= 0, got {max_queue}")
        check_load(n_ctx=runtime.ctx_size, n_threads=runtime.threads, parallel=parallel, prompt_cache_mb=prompt_cache_mb,
                   burst_ms=runtime.burst_ms)
        key = api_key or os.environ.get("SPECDEC_API_KEY") or None
        sock = listen(host, port)  # before loading: a port in use is one line, at once
        with sock, load(models, runtime, ngram, drafting.kind, parallel=parallel, prompt_cache_mb=prompt_cache_mb) as spec:
            model_id = spec.choice.pair or spec.choice.target.name
            aliases = frozenset({"default"}) if model_id == registry.load().default else frozenset()
            def log(line: str) -> None:  # one line per request, as llama-server and uvicorn write them
                out.err.write(line + "\n")
                out.err.flush()

            settings = ServerSettings(model_id, options, key, max_queue, aliases, tuple(cors_origin or ()), fair)
            server = Server(spec, settings, log=log)
            config = uvicorn.Config(server.app(), log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=GRACEFUL_SECONDS, lifespan="off")  # fmt: skip
            web = QuietExit(config)
            web.on_exit = server.stop_streams
            bound = sock.getsockname()[1]
            drafter = spec.drafter if spec.drafter != NONE else f"none ({NONE.label})"
            out.err.write(
                f"specdec serve: {model_id} (drafter {drafter}, {parallel} slot{'s' if parallel > 1 else ''}"
                f"{placement_note(spec)}) "
                f"on http://{host}:{bound}/v1"
                f"{' (API key required)' if key else ''}; Ctrl-C stops\n"
            )
            out.err.flush()
            try:
                web.run(sockets=[sock])
            finally:
                server.shutdown()


def _quiet_exit_class() -> type:
    import uvicorn

    class QuietExit(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown (exit 130 or -15); a server
        asked to stop that stopped cleanly exits 0. `on_exit`: told of the signal (the server's streams end)."""

        on_exit: Callable[[], None] | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            if self.on_exit is not None:
                self.on_exit()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return QuietExit


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, or one clear line (in use, not an address of this machine)."""
    from specdec_cli.errors import SpecdecError

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it (Linux): without it, a client that keeps its connection (the
        # openai SDK does) got each first chunk ~40 ms late (Nagle's algorithm waiting on a delayed ACK).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        raise SpecdecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock

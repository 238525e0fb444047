"""A `text/event-stream` response over ASGI: the stream of a generation, with little to do per event.

sse-starlette served this before (as in llama-cpp-python's server). Per response it starts a task group
of three tasks, a shutdown watcher that polls uvicorn, and an anyio scope and an event encoder per chunk:
with a fake generation (no model), a stream's first chunk came a fifth of its time later than with this
class, and on this project's 2-core machines every microsecond of the server's own work is taken from
llama.cpp's threads while they decode. What a generation's stream needs is smaller: the headers, a
`data:` line per payload as the generator yields them (payloads that are ready together go out in one
write), a comment line every `ping` seconds as a keep-alive, the end of the body, and the client's
disconnect noticed (the generation is then cancelled). A server asked to stop calls `stop` on every
open stream (`Server.stop_streams`): its generation finishes at its next step, so the stream ends with
its finish and `[DONE]`, and a stream still open after the grace period is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),  # a reverse proxy (nginx) must not hold the events back
]
PING = b": ping\n\n"


class EventStream(Response):  # a Response to Starlette's routes; its own __call__
    """Send what `events` yields (lists of event payloads: one `data:` line each, in one write) as a
    server-sent event stream. `closed()` runs however the stream ends: finished, failed, or the client gone
    (then the generator is closed, which runs its `finally`)."""

    def __init__(self, events: AsyncIterator[list[str]], closed: Callable[[], None], *, ping: float,
                 finish: Callable[[], None], open_streams: set[EventStream]) -> None:  # fmt: skip
        """`finish()`: end the generation early (its stream then ends properly); `open_streams`: where the
        stream is while it is sent (the server's, for `stop`)."""
        self.events = events
        self.closed = closed
        self.ping = ping
        self.finish = finish
        self.open_streams = open_streams
        self.status_code = 200  # read by the route wrapper for its log line
        self.background = None
        self._task: asyncio.Task[object] | None = None

    def stop(self, grace: float) -> None:
        """The server is stopping: finish the generation now, cut the stream if it is still open after `grace`
        seconds (call on the event loop)."""
        self.finish()
        if self._task is not None:
            asyncio.get_running_loop().call_later(grace, self._task.cancel)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        this = self._task = asyncio.current_task()
        assert this is not None
        self.open_streams.add(self)
        gone = ended = False  # the client left; the body's end is sent (uvicorn then answers receive() so)

        async def watch() -> None:  # the only message uvicorn sends a request after its body
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not ended:
                gone = True
                this.cancel()

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(self.ping)
                await send({"type": "http.response.body", "body": PING, "more_body": True})

        watcher = asyncio.ensure_future(watch())
        pinger = asyncio.ensure_future(keep_alive()) if self.ping > 0 else None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            async for payloads in self.events:
                body = "".join(f"data: {p}\n\n" for p in payloads).encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
            ended = True
            if pinger is not None:
                pinger.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:  # the server's own cancellation (shutdown past its grace): not ours to swallow
                raise
        finally:
            self.open_streams.discard(self)
            for task in (watcher, pinger):
                if task is not None:
                    task.cancel()
            with contextlib.suppress(BaseException):
                await self.events.aclose()  # type: ignore[attr-defined]
            self.closed()

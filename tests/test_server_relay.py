"""How a generation's events reach its request, on the fake model (tests/fakes.py), in seconds.

With `--parallel`, the batch engine's thread relays each generation's events as it steps
(`GenerationRun.listen`): no worker thread waits per generation, so a token costs no thread switch;
the worker threads only tokenize and start, and the queue bound still holds. The stream itself is
`server/sse.py`'s `EventStream`: events as they come, a keep-alive comment, the client's disconnect,
and the server's stop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from specdec_cli import api
from specdec_cli.engine.events import Step
from specdec_cli.engine.settings import GenerateOptions
from specdec_cli.server.app import Server, ServerSettings
from specdec_cli.server.sse import PING, EventStream
from tests.fakes import open_fake
from tests.server_fixtures import in_process

PROMPTS = ["Name three rivers.", "Write a line about the sea.", "Say hello.", "Count to five."]

pytestmark = pytest.mark.usefixtures("fake_models")  # every model file a fake (tests/conftest.py)


@pytest.fixture(scope="module")
def par() -> Iterator[api.Speculator]:
    with api.load(open_model=open_fake, n_ctx=1024, parallel=2) as s:
        yield s


# ------------------------------------------------------------------ the engine's thread relays
def test_listen_gives_what_events_gives_then_one_end(par: api.Speculator) -> None:
    pulled = par.start(PROMPTS[0], max_tokens=24, drafter="ngram")
    expected = [ev.emitted for ev in pulled.events() if isinstance(ev, Step)]
    run = par.start(PROMPTS[0], max_tokens=24, drafter="ngram")
    assert run.batched
    got: list[Any] = []
    ends: list[BaseException | None] = []
    done = threading.Event()
    threads: set[str] = set()

    def on_event(ev: Any) -> None:
        threads.add(threading.current_thread().name)
        if isinstance(ev, Step):
            got.append(ev.emitted)

    def on_end(error: BaseException | None) -> None:
        ends.append(error)
        done.set()

    run.listen(on_event, on_end)
    assert done.wait(30)
    time.sleep(0.05)  # nothing after the end
    assert ends == [None]
    # the second run may copy the first from the token pool: the same tokens, in other steps
    assert [t.id for s in got for t in s] == [t.id for s in expected for t in s] == run.generation.token_ids
    assert run.generation.token_ids == pulled.generation.token_ids
    assert run.stats.steps == len(got)
    assert threads <= {"specdec-batch", threading.current_thread().name}  # the engine's (or this, for events before)


def test_a_listener_that_raises_ends_its_generation_only(par: api.Speculator) -> None:
    """A bug in one request's relay ends that request with the error; the engine and the others go on."""
    solo = par.generate(PROMPTS[1], max_tokens=24).token_ids
    bad = par.start(PROMPTS[0], max_tokens=200)
    good = par.start(PROMPTS[1], max_tokens=24)
    ends: dict[str, BaseException | None] = {}
    done = threading.Event()

    def on_end(name: str) -> Any:
        def end(error: BaseException | None) -> None:
            ends[name] = error
            if len(ends) == 2:
                done.set()

        return end

    def broken(ev: Any) -> None:
        if isinstance(ev, Step):
            raise ValueError("a relay bug")

    bad.listen(broken, on_end("bad"))
    good.listen(lambda ev: None, on_end("good"))
    assert done.wait(30)
    assert isinstance(ends["bad"], ValueError) and ends["good"] is None
    assert good.generation.token_ids == solo
    assert par.generate(PROMPTS[2], max_tokens=8).token_ids  # the engine still serves


def test_batched_server_streams_from_the_engine_thread_within_the_queue_bound(par: api.Speculator,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Streams and whole answers at once on 2 slots, max-queue 1: the texts are the API's, each token is relayed
    by the engine's thread, at most 2 generations run at a time, and past the queue a request gets a 503."""
    expected = {p: par.generate([{"role": "user", "content": p}], max_tokens=16).text for p in PROMPTS}
    decode = par.target.decode_many
    monkeypatch.setattr(par.target, "decode_many", lambda *a, **k: (time.sleep(0.01), decode(*a, **k))[1])
    relayed_by: set[str] = set()
    running: list[int] = []
    server = Server(par, ServerSettings("fake-pair", GenerateOptions(max_tokens=32), max_queue=1))
    server.worker.on_step = lambda ev: relayed_by.add(threading.current_thread().name)

    async def go(http: httpx.AsyncClient) -> list[tuple[str, int, str]]:
        async def one(i: int) -> tuple[str, int, str]:
            await asyncio.sleep(0.02 * i)  # each taken from the queue (or running) before the next comes
            prompt, stream = PROMPTS[i % len(PROMPTS)], i % 2 == 0
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "stream": stream}
            r = await http.post("/v1/chat/completions", json=body)
            if r.status_code != 200 or not stream:
                text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
                return prompt, r.status_code, text
            chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            assert r.text.rstrip().endswith("data: [DONE]")
            return prompt, r.status_code, "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                                                  if c["choices"])  # fmt: skip

        async def watch() -> None:
            while True:
                running.append(server.worker.running)
                await asyncio.sleep(0.002)

        watcher = asyncio.ensure_future(watch())
        try:
            return await asyncio.gather(*(one(i) for i in range(6)))
        finally:
            watcher.cancel()

    results = in_process(server, go)
    statuses = sorted(status for _, status, _ in results)
    assert 503 in statuses and statuses.count(200) >= 3, statuses
    for prompt, status, text in results:
        if status == 200:
            assert text == expected[prompt], prompt
    assert relayed_by == {"specdec-batch"}
    assert max(running) <= 2


# ------------------------------------------------------------------ the stream
def run_stream(events: Any, receive: Any, *, ping: float = 0, stop_after: float | None = None,
               grace: float = 0.05) -> tuple[list[bytes], list[str], bool]:  # fmt: skip
    """An EventStream over fake ASGI callables: the bodies sent, what happened, whether it was cut."""
    sent: list[bytes] = []
    log: list[str] = []
    streams: set[EventStream] = set()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])
            if not message.get("more_body"):
                log.append("end")

    async def main() -> bool:
        stream = EventStream(events(log), lambda: log.append("closed"), ping=ping,
                             finish=lambda: log.append("finish"), open_streams=streams)  # fmt: skip
        task = asyncio.ensure_future(stream({"type": "http"}, receive, send))
        if stop_after is not None:
            await asyncio.sleep(stop_after)
            for s in list(streams):
                s.stop(grace)
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    cut = asyncio.run(main())
    assert not streams  # it left the server's set however it ended
    return sent, log, cut


async def never(_: Any = None) -> dict[str, Any]:
    await asyncio.sleep(3600)
    raise AssertionError


def test_a_stream_sends_its_events_then_ends() -> None:
    async def events(log: list[str]) -> Any:
        yield ['{"a": 1}']
        yield ['{"b": 2}', "[DONE]"]  # ready together: one write

    sent, log, cut = run_stream(events, never)
    assert sent == [b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\ndata: [DONE]\n\n', b""]
    assert log == ["end", "closed"] and not cut


def test_a_quiet_stream_gets_keep_alive_comments() -> None:
    async def events(log: list[str]) -> Any:
        yield ["1"]
        await asyncio.sleep(0.25)
        yield ["2"]

    sent, _, _ = run_stream(events, never, ping=0.05)
    assert sent[0] == b"data: 1\n\n" and sent[-2:] == [b"data: 2\n\n", b""]
    assert 2 <= sent.count(PING) <= 6


def test_a_client_that_leaves_closes_the_stream_and_its_generator() -> None:
    async def events(log: list[str]) -> Any:
        try:
            yield ["1"]
            await asyncio.sleep(3600)
            yield ["never"]
        finally:
            log.append("generator closed")

    async def leaves() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    sent, log, cut = run_stream(events, leaves)
    assert sent == [b"data: 1\n\n"] and not cut  # no end of body for a client that is gone
    assert log == ["generator closed", "closed"]


def test_the_server_stopping_finishes_a_stream_or_cuts_it_after_the_grace() -> None:
    async def finishes(log: list[str]) -> Any:  # its generation ends at the next step once finish() is called
        yield ["1"]
        while "finish" not in log:
            await asyncio.sleep(0.01)
        yield ["last", "[DONE]"]

    sent, log, cut = run_stream(finishes, never, stop_after=0.05, grace=5)
    assert sent[-2:] == [b"data: last\n\ndata: [DONE]\n\n", b""] and not cut
    assert log == ["finish", "end", "closed"]

    async def stuck(log: list[str]) -> Any:
        yield ["1"]
        await asyncio.sleep(3600)
        yield ["never"]

    sent, log, cut = run_stream(stuck, never, stop_after=0.05, grace=0.05)
    assert cut and sent == [b"data: 1\n\n"] and log == ["finish", "closed"]


def test_a_steps_tokens_reach_the_request_in_one_update_a_chunk_each() -> None:
    """A step that emits several tokens (accepted drafts) is one update to the request (one hand-over to the
    event loop, one write) holding a piece of text per token; the stop strings still cut within it, and the token
    count is of the tokens behind the text sent."""
    from types import SimpleNamespace

    from specdec_cli.engine.events import DRAFT, TARGET, EmittedToken
    from specdec_cli.server.worker import Delta, Job, _Relay

    got: list[Any] = []
    job = Job(prompt="p", options=GenerateOptions(), stops=["STOP"], emit=got.append)
    relay = _Relay(SimpleNamespace(on_step=None), job, None)  # type: ignore[arg-type]

    def step(*texts: str) -> Step:
        toks = tuple(EmittedToken(i, t, DRAFT if i < len(texts) - 1 else TARGET) for i, t in enumerate(texts))
        return Step(0, 4, (), len(texts) - 1, toks, 0.0, 0.0, 0.0, 0.0)

    relay.event(step("a", "b", "", "c"))  # the third token completes no text (half a character)
    relay.event(step("d", "ST", "OP", "e"))  # a stop string, across two tokens
    assert got == [Delta(("a", "b", "c"), 4), Delta(("d",), 5)] and job.cancel.is_set()


def test_a_streams_first_text_waits_for_its_write_once_and_a_whole_answer_never() -> None:
    """On two cores that both decode, the event loop's thread waited a whole decode for a core before writing a
    stream's first token: the relaying thread now waits for the write (`Job.first_written`), once, on the first
    text, at most FIRST_CHUNK_WAIT_SECONDS; an answer read whole does not wait."""
    from types import SimpleNamespace

    from specdec_cli.engine.events import TARGET, EmittedToken
    from specdec_cli.server import worker

    class Recording(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            self.waits: list[float | None] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            return super().wait(0)

    def step(text: str) -> Step:
        return Step(0, 0, (), 0, (EmittedToken(1, text, TARGET),), 0.0, 0.0, 0.0, 0.0)

    for stream, waits in ((True, [worker.FIRST_CHUNK_WAIT_SECONDS]), (False, [])):
        job = worker.Job(prompt="p", options=GenerateOptions(), stops=[], emit=lambda u: None, stream=stream)
        job.first_written = Recording()
        relay = worker._Relay(SimpleNamespace(on_step=None), job, None)  # type: ignore[arg-type]
        relay.event(step(""))  # no text yet (half a character): nothing sent, nothing waited for
        for text in "abc":
            relay.event(step(text))
        assert job.first_written.waits == waits


def test_the_server_says_when_a_streams_first_text_is_written(par: api.Speculator,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Served (ASGI, the batch engine's relay) with the engine's wait for the first chunk made a minute long, a
    stream and a whole answer still end at once: the server sets `first_written` once the stream's first text is
    written, and an answer read whole has nothing to wait for."""
    from specdec_cli.server import worker

    monkeypatch.setattr(worker, "FIRST_CHUNK_WAIT_SECONDS", 60.0)
    server = Server(par, ServerSettings("fake-pair", GenerateOptions(max_tokens=16)))

    async def go(http: httpx.AsyncClient) -> list[tuple[int, float]]:
        out = []
        for stream in (True, False):
            body = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 16, "stream": stream}
            t0 = time.perf_counter()
            r = await asyncio.wait_for(http.post("/v1/chat/completions", json=body), 20)
            out.append((r.status_code, time.perf_counter() - t0))
        return out

    results = in_process(server, go)
    assert [status for status, _ in results] == [200, 200]
    assert all(seconds < 20 for _, seconds in results), results

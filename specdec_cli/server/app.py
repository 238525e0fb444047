"""The OpenAI-compatible HTTP layer: Starlette routes, SSE streaming, errors in OpenAI's shape.

Starlette (FastAPI's core) with pydantic models rather than FastAPI itself: every
error must be OpenAI's `{"error": {...}}` with the right status, and FastAPI's
own validation answers 422 in its own shape; parsing the body ourselves keeps
one path for invalid JSON, wrong types and bad values. uvicorn serves it and
sse-starlette streams (as llama-cpp-python's server does): it notices a client
that went away, which cancels that generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from specdec_cli.api import GenerateOptions, Speculator
from specdec_cli.engine.settings import MODEL, InvalidSetting
from specdec_cli.errors import InternalError, SpecdecError
from specdec_cli.server.access import CLIENT_GONE, Record
from specdec_cli.server.http_errors import ApiError, BodyLimit, api_error
from specdec_cli.server.metrics import Metrics
from specdec_cli.server.schemas import MAX_STOPS, ChatRequest, CompletionRequest
from specdec_cli.server.shapes import Shape
from specdec_cli.server.sse import EventStream
from specdec_cli.server.worker import Delta, Done, Failed, Job, QueueFull, Worker

MAX_BODY_BYTES = 4 * 2**20
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"  # pages served from this machine
RETRY_AFTER_SECONDS = 5
DISCONNECT_CHECK_SECONDS = 0.5
QUIET_ROUTES = ("/health", "/metrics")  # polled by monitors: counted, not logged
PING_SECONDS = 15.0  # a comment line on a stream this often (sse-starlette's default): proxies keep it open
SHUTDOWN_GRACE_SECONDS = 5.0  # a stream in flight at SIGINT/SIGTERM ends within this, with finish_reason and [DONE]


@dataclass(frozen=True)
class ServerSettings:
    model_id: str
    defaults: GenerateOptions  # the CLI's sampling and speculation options: a request overrides them
    api_key: str | None = None
    max_queue: int = 8
    aliases: frozenset[str] = frozenset()  # other names a request may give the model ("default" for the default pair)
    # Origins whose web pages may call the server (CORS), beside this machine's own (localhost, 127.0.0.1 and
    # [::1] on any port, as Ollama allows by default); "*" allows every origin.
    cors_origins: tuple[str, ...] = ()
    fair: bool = True  # --parallel: bound what drafts and prompt chunks cost other streams (engine/batch/)


# ------------------------------------------------------------------ the app
class Server:
    def __init__(self, spec: Speculator, settings: ServerSettings, log: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.settings = settings
        self.log = log  # one line per request as it ends (the CLI writes them to stderr)
        self.worker = Worker(spec, settings.max_queue, on_step=None, on_tokens=self._count)
        engine = spec.batch_engine() if spec.parallel > 1 else None  # calibrates now, before any request
        # Once per model, now rather than in the first request's time to first token: the end-of-generation and
        # control tokens (each a scan of the vocabulary through llama.cpp: tens of milliseconds) and the chat
        # template compiled (a conversation rendered and tokenized).
        _ = spec.target.eog_ids, spec.target.control_texts()
        with contextlib.suppress(SpecdecError):  # no chat template: requests are told, not the start
            spec.tokenize([{"role": "user", "content": "Hello"}])
        self.metrics = Metrics(lambda: self.worker.waiting, lambda: self.worker.running,
                               engine.busy if engine is not None else None)  # fmt: skip
        self.worker.on_step = self.metrics.step
        if engine is not None:
            engine.on_step = self.metrics.batch
            engine.set_fair(settings.fair)
            if engine.prompt_cache is not None:  # the server alone uses the models: a slot is kept while idle
                engine.prompt_cache.idle_keep = True
        self.started = int(time.time())
        self._streams: set[EventStream] = set()  # streams being sent (stop_streams)
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, once a request came

    # ----------------------------------------------------------- helpers
    def _authorise(self, request: Request) -> None:
        key = self.settings.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")

    async def _body(self, request: Request, model: type[ChatRequest] | type[CompletionRequest]) -> Any:
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        try:
            body = model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ApiError(400, f"{where}: {first['msg']}", param=where or None, code="invalid_value") from None
        if body.model is not None and body.model not in {self.settings.model_id, *self.settings.aliases}:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves "
                                f"{self.settings.model_id!r} (GET /v1/models)", param="model",
                           code="model_not_found")  # fmt: skip
        refusal = body.refusal()
        if refusal is not None:
            raise ApiError(400, refusal[1], param=refusal[0], code="unsupported_parameter")
        if body.n != 1:
            raise ApiError(400, f"n must be 1 (one loaded pair generates one choice), got {body.n}", param="n")
        if len(body.stops()) > MAX_STOPS:
            raise ApiError(400, f"at most {MAX_STOPS} stop sequences", param="stop")
        return body

    def _options(self, body: ChatRequest | CompletionRequest) -> GenerateOptions:
        """The request's parameters over the server's defaults, checked by `GenerateOptions.validate`."""
        spec = body.speculative
        newer = getattr(body, "max_completion_tokens", None)  # chat's newer name for max_tokens
        options = self.settings.defaults.given(
            max_tokens=newer if newer is not None else body.max_tokens,
            temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, min_p=body.min_p, seed=body.seed,
            draft_max=spec.draft_max if spec is not None else None, drafter=spec.drafter if spec is not None else None,
            interactive=bool(body.stream),  # a whole answer is read at its end: it yields to streams' prompts
        )  # fmt: skip
        try:
            options.validate()
            if options.drafter == MODEL and self.spec.draft is None:
                raise InvalidSetting("drafter", None, "auto, ngram or none: this server has no draft model")
        except InvalidSetting as exc:
            where = _FIELDS.get(exc.param, exc.param)
            raise ApiError(400, exc.named(where), param=where, code="invalid_value") from None
        return options

    # ------------------------------------------------------------ routes
    def _model(self) -> dict[str, Any]:
        return {"id": self.settings.model_id, "object": "model", "created": self.started, "owned_by": "specdec"}

    async def models(self, request: Request) -> Response:
        self._authorise(request)
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        """`GET /v1/models/{id}` (openai's `models.retrieve`): the served model, or a 404 naming it."""
        self._authorise(request)
        if request.path_params["model_id"] != self.settings.model_id:
            raise ApiError(404, f"no model {request.path_params['model_id']!r}: this server serves "
                           f"{self.settings.model_id!r}", param="model", code="model_not_found")  # fmt: skip
        return JSONResponse(self._model())

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "waiting": self.worker.waiting, "running": self.worker.running})

    async def metrics_text(self, request: Request) -> Response:
        self._authorise(request)
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def chat(self, request: Request) -> Response:
        self._authorise(request)
        body: ChatRequest = await self._body(request, ChatRequest)
        return await self._generate(request, body, body.conversation(), chat=True)

    async def completions(self, request: Request) -> Response:
        self._authorise(request)
        body: CompletionRequest = await self._body(request, CompletionRequest)
        if isinstance(body.prompt, list) and len(body.prompt) != 1:
            raise ApiError(400, "one prompt per request (a list of one string is accepted)", param="prompt")
        return await self._generate(request, body, body.text(), chat=False)

    # -------------------------------------------------------- generation
    async def _generate(self, request: Request, body: ChatRequest | CompletionRequest, prompt: Any,
                        *, chat: bool) -> Response:  # fmt: skip
        record: Record = request.state.record
        t0 = record.t0
        options = self._options(body)
        loop = self._loop = asyncio.get_running_loop()
        events: asyncio.Queue[Delta | Done | Failed] = asyncio.Queue()

        def emit(ev: Delta | Done | Failed) -> None:  # from a worker thread or the batch engine's
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:  # the loop has closed (shutdown): nobody is listening any more
                pass

        job = Job(prompt, options, body.stops(), emit, chat=chat, stream=bool(body.stream))
        try:
            self.worker.submit(job)
        except QueueFull:
            raise ApiError(503, f"the server is busy: {self.settings.max_queue} requests are already waiting",
                           type="server_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None  # fmt: skip
        echo = body.text() if isinstance(body, CompletionRequest) and body.echo else ""
        shape = Shape(self.settings.model_id, chat, echo)
        try:
            first = await self._next(request, job, events)
        except BaseException:
            job.cancel.set()
            raise
        record.prompt_tokens = job.n_prompt
        if isinstance(first, Failed):
            raise api_error(first.error)
        record.first = time.perf_counter() - t0
        self.metrics.ttft.observe(record.first)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            record.stream = True

            def closed() -> None:  # however the stream ended: the client left, it finished, it failed
                job.cancel.set()  # a no-op after Done; stops the generation when the client went away
                self._finish(record, record.status or CLIENT_GONE)

            return EventStream(self._stream(events, first, shape, include_usage, record, job.first_written.set), closed,
                               ping=PING_SECONDS,
                               finish=job.cancel.set, open_streams=self._streams)  # fmt: skip
        ev = first
        try:
            while not isinstance(ev, Done):
                if isinstance(ev, Failed):
                    raise api_error(ev.error)
                ev = await self._next(request, job, events)
        finally:
            job.cancel.set()  # a no-op after Done; stops the generation when this task is cancelled
        self.metrics.latency.observe(time.perf_counter() - t0)
        record.done(ev)
        return JSONResponse(shape.whole(ev))

    async def _next(self, request: Request, job: Job, events: asyncio.Queue[Delta | Done | Failed]) -> Any:
        """The job's next event; a client that disconnects cancels the job (checked every half second, while
        events keep coming too: a long answer that nobody waits for would hold its slot to the end)."""
        record: Record = request.state.record
        while True:
            now = time.perf_counter()
            if now - record.checked >= DISCONNECT_CHECK_SECONDS:
                record.checked = now
                if await request.is_disconnected():
                    job.cancel.set()
                    raise ApiError(CLIENT_GONE, "client closed the request")
            try:
                return await asyncio.wait_for(events.get(), timeout=DISCONNECT_CHECK_SECONDS)
            except TimeoutError:
                pass

    async def _stream(self, events: asyncio.Queue[Delta | Done | Failed], first: Any, shape: Shape, include_usage: bool,
                      record: Record, written: Callable[[], None] | None) -> AsyncIterator[list[str]]:  # fmt: skip
        """The stream's events, as lists of payloads: what is ready together goes out in one write. `written()` once
        the first text is written (the engine waits for it: worker.py's FIRST_CHUNK_WAIT_SECONDS)."""
        opening = shape.opening()
        out = [] if opening is None else [opening]
        ev = first
        while True:
            if isinstance(ev, Failed):  # after the first byte: end the stream with an error object
                record.status, record.error = ev.error.http_status, str(ev.error)
                out.append(json.dumps({"error": {"message": str(ev.error), "type": "server_error", "param": None,
                                                 "code": None}}))  # fmt: skip
                yield out
                return
            if isinstance(ev, Done):
                break
            out += (shape.chunk(text, None) for text in ev.texts)
            record.tokens = ev.tokens
            if events.empty():
                if out:
                    yield out  # resumed once it is written
                    out = []
                    if written is not None:
                        written()
                        written = None
                ev = await events.get()
            else:
                ev = events.get_nowait()
        record.done(ev)
        out.append(shape.closing(ev))
        if include_usage:
            out.append(shape.usage_chunk(ev))
        record.status = 200
        out.append("[DONE]")
        self.metrics.latency.observe(time.perf_counter() - record.t0)
        yield out

    def _count(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Every generation that ran, from the worker: a client that went away mid-stream is counted too."""
        self.metrics.generated.inc(completion_tokens)
        self.metrics.prompt.inc(prompt_tokens)

    def _finish(self, record: Record, status: int) -> None:
        if record.closed:
            return
        record.closed = True
        self.metrics.requests.labels(record.route, str(status)).inc()
        if self.log is not None and record.route not in QUIET_ROUTES:
            self.log(record.line(status))

    def stop_streams(self) -> None:
        """SIGINT/SIGTERM (from the signal handler): every open stream's generation finishes at its next step,
        so the stream ends with its finish_reason and [DONE]; one still open after SHUTDOWN_GRACE_SECONDS is
        cut. Answers that are not streamed run on, within uvicorn's graceful shutdown."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop_streams)

    def _stop_streams(self) -> None:
        for stream in list(self._streams):
            stream.stop(SHUTDOWN_GRACE_SECONDS)

    def shutdown(self) -> None:
        self.worker.stop()

    # --------------------------------------------------------------- app
    def app(self) -> ASGIApp:
        def route(path: str, endpoint: Callable[[Request], Awaitable[Response]], methods: list[str]) -> Route:
            async def handler(request: Request) -> Response:
                client = f"{request.client.host}:{request.client.port}" if request.client else "-"
                record = request.state.record = Record(request.method, request.url.path, client, route=path)
                try:
                    response = await endpoint(request)
                except ApiError as exc:
                    response, record.error = exc.response(), exc.message
                except Exception as exc:  # never a 500 with a traceback
                    error = api_error(InternalError.of(exc))
                    response, record.error = error.response(), error.message
                if not record.stream:  # a stream is finished when it ends (EventStream)
                    self._finish(record, response.status_code)
                return response

            return Route(path, handler, methods=methods)

        routes = [
            route("/v1/models", self.models, ["GET"]),
            route("/v1/models/{model_id:path}", self.model, ["GET"]),
            route("/v1/chat/completions", self.chat, ["POST"]),
            route("/v1/completions", self.completions, ["POST"]),
            route("/health", self.health, ["GET"]),
            route("/metrics", self.metrics_text, ["GET"]),
        ]

        async def not_found(request: Request, exc: Exception) -> Response:
            status = getattr(exc, "status_code", 404)
            return ApiError(status, f"{request.method} {request.url.path}: not found" if status == 404
                            else f"{request.method} is not allowed on {request.url.path}").response()  # fmt: skip

        async def too_large(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, ApiError)
            return exc.response()

        app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found, ApiError: too_large},
                        middleware=[Middleware(CORSMiddleware, allow_origins=list(self.settings.cors_origins),
                                               allow_origin_regex=LOCAL_ORIGINS, allow_methods=["GET", "POST"],
                                               allow_headers=["*"], max_age=600)])  # fmt: skip
        return BodyLimit(app, MAX_BODY_BYTES)


# the request field of a parameter, where it is not the parameter's own name
_FIELDS = {"draft_max": "speculative.draft_max", "drafter": "speculative.drafter"}

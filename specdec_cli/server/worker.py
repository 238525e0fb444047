"""One loaded pair, `spec.parallel` generations at a time: worker threads serve jobs in arrival order.

Requests submit a `Job`; past `max_queue` waiting jobs a submission is refused
(`QueueFull`, a 503 with Retry-After). A worker thread tokenizes the request (so a
prompt too long for the context is an error before any byte is streamed),
generates through `Speculator.start` and hands events to the request's asyncio
side through `emit`, which must be thread-safe. With `--parallel N` there are N
worker threads and the Speculator's batch engine steps their generations together
(engine/batch/); with 1, one generation runs at a time. A job's `cancel` event
(the client went away, a stop string matched, shutdown) stops its generation at
the next step, with both caches consistent for the next job.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec_cli.api import GenerateOptions, Generation, Prompt, Speculator
from specdec_cli.engine.events import Step
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import InternalError, RpcError, SpecdecError
from specdec_cli.server.stops import StopMatcher


class QueueFull(Exception):
    pass


@dataclass(frozen=True)
class Delta:
    text: str
    tokens: int  # completion tokens behind the text sent so far, this delta included


@dataclass(frozen=True)
class Done:
    """The last update of a request: its `Generation`, and what the client is told of it (the text up to a
    stop sequence, OpenAI's finish reason, the tokens it was charged)."""

    generation: Generation
    stats: Stats
    text: str
    finish_reason: str  # "stop" or "length"
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Failed:
    error: SpecdecError


Update = Delta | Done | Failed  # what the worker sends a request, in order


@dataclass(eq=False)
class Job:
    prompt: Prompt
    options: GenerateOptions
    stops: list[str]
    emit: Callable[[Update], None]
    chat: bool = True
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    n_prompt: int | None = None  # set once the prompt is tokenized


class Worker:
    def __init__(self, spec: Speculator, max_queue: int, on_step: Callable[[Step], None] | None = None,
                 on_tokens: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
        self.spec = spec
        self.max_queue = max_queue
        self.on_step = on_step
        # (prompt, completion) tokens of every generation that ran, whether or not its client still listened
        self.on_tokens = on_tokens
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.waiting = 0
        self.running = 0
        self._active: set[Job] = set()
        self._threads = [threading.Thread(target=self._loop, name=f"specdec-worker-{i}", daemon=True)
                         for i in range(spec.parallel)]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.waiting >= self.max_queue:
                raise QueueFull
            self.waiting += 1
            self._active.add(job)
        self._jobs.put(job)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is running and waiting, and end the thread (shutdown)."""
        with self._lock:
            for job in self._active:
                job.cancel.set()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self.waiting -= 1
                self.running += 1
            try:
                if not job.cancel.is_set():  # a client that left while waiting costs nothing
                    self._serve(job)
            except SpecdecError as exc:
                job.emit(Failed(exc))
            except Exception as exc:  # never let one request take the worker down
                job.emit(Failed(InternalError(f"internal error: {type(exc).__name__}: {exc}")))
            finally:
                with self._lock:
                    self.running -= 1
                    self._active.discard(job)

    def _serve(self, job: Job) -> None:
        spec = self.spec
        tokens = spec.tokenize(job.prompt, system=None, chat=None if job.chat else False)
        job.n_prompt = len(tokens.ids)
        run = spec.start(tokens, job.options, cancel=job.cancel)
        stops = StopMatcher(job.stops)
        n_tokens = 0  # completion tokens up to the one that completed a stop string
        for ev in run.events():
            if not isinstance(ev, Step):
                continue
            if self.on_step is not None:
                self.on_step(ev)
            for tok in ev.emitted:
                if stops.stopped:
                    break
                n_tokens += 1
                out = stops.feed(tok.text)
                if out:
                    job.emit(Delta(out, n_tokens))
            if stops.stopped:
                job.cancel.set()
        gen = run.generation
        rest = stops.flush()
        if rest:
            job.emit(Delta(rest, n_tokens))
        n_completion = n_tokens if stops.stopped else len(gen.token_ids)
        if self.on_tokens is not None:
            self.on_tokens(gen.n_prompt_tokens, n_completion)
        if gen.error:  # an RPC server stopped answering: what was streamed stands, then the reason
            job.emit(Failed(RpcError(gen.error)))
            return
        finish = "stop" if stops.stopped or gen.stop_reason == "eos" else "length"
        job.emit(Done(gen, run.stats, stops.released, finish, n_completion, run.n_cached))


"""One loaded pair, `spec.parallel` generations at a time: worker threads serve jobs in arrival order.

Requests submit a `Job`; past `max_queue` waiting jobs a submission is refused
(`QueueFull`, a 503 with Retry-After). A worker thread tokenizes the request (so a
prompt too long for the context is an error before any byte is streamed) and
starts it through `Speculator.start`; its events reach the request's asyncio side
through `emit`, which must be thread-safe. With `--parallel N` the Speculator's
batch engine steps the generations together (engine/batch/) and its thread relays
each one's events as it steps (`GenerationRun.listen`: no thread hop per token,
which on 2 cores is taken from llama.cpp's threads); the N worker threads only
tokenize and start. With 1, one generation runs at a time, relayed by the worker
thread that runs it. A job's `cancel` event (the client went away, a stop string
matched, shutdown) stops its generation at the next step, with both caches
consistent for the next job.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec_cli.api import GenerateOptions, Generation, Prompt, Speculator
from specdec_cli.engine.events import Event, Step
from specdec_cli.engine.stats import Stats
from specdec_cli.errors import InternalError, RpcError, SpecdecError
from specdec_cli.generation import GenerationRun
from specdec_cli.server.stops import StopMatcher


class QueueFull(Exception):
    pass


# A stream's first token goes out before the engine decodes on: the relaying thread waits this long at most for the
# event loop to write the first chunk (`Job.first_written`). On two cores that both decode, the event loop's thread
# (and then the client) otherwise wait for a core until the next decode ends: the first token came a decode late.
FIRST_CHUNK_WAIT_SECONDS = 0.003


@dataclass(frozen=True)
class Delta:
    """New text: a piece per token that completed some (a stream's chunk each), those of one step together
    (sent in one write)."""

    texts: tuple[str, ...]
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
    stream: bool = True  # text is sent as it comes (Deltas); else only the end
    cancel: threading.Event = field(default_factory=threading.Event)
    first_written: threading.Event = field(default_factory=threading.Event)  # set by the server (FIRST_CHUNK_WAIT)
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
        # a job is taken from the queue only once one of the `parallel` generations has ended: the rest wait
        # here, counted and bounded by max_queue (a batched job is handed over at once, and ends later)
        self._free = threading.Semaphore(spec.parallel)
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
            self._free.acquire()
            job = self._jobs.get()
            if job is None:
                self._free.release()
                return
            with self._lock:
                self.waiting -= 1
                self.running += 1
            handed_over = False
            try:
                if not job.cancel.is_set():  # a client that left while waiting costs nothing
                    handed_over = self._serve(job)
            except SpecdecError as exc:
                job.emit(Failed(exc))
            except Exception as exc:  # never let one request take the worker down
                job.emit(Failed(InternalError.of(exc)))
            finally:
                if not handed_over:
                    self._ended(job)

    def _ended(self, job: Job) -> None:
        with self._lock:
            self.running -= 1
            self._active.discard(job)
        self._free.release()

    def _serve(self, job: Job) -> bool:
        """Tokenize and start `job`. A batched generation is then relayed from the engine's thread as it steps
        (returns True: `_ended` is called when it ends); otherwise this thread relays it to its end."""
        spec = self.spec
        tokens = spec.tokenize(job.prompt, system=None, chat=None if job.chat else False)
        job.n_prompt = len(tokens.ids)
        run = spec.start(tokens, job.options, cancel=job.cancel)
        relay = _Relay(self, job, run)
        if run.batched:
            run.listen(relay.event, relay.end)
            return True
        for ev in run.events():
            relay.event(ev)
        relay.end(None)
        return False


class _Relay:
    """A generation's events to its request: text through the stop strings as `Delta`s (an answer read
    whole gets its first only, for the time to first token: a wakeup of the server's loop per token is
    needless there), then `Done` or `Failed`."""

    def __init__(self, worker: Worker, job: Job, run: GenerationRun) -> None:
        self.worker, self.job, self.run = worker, job, run
        self.stops = StopMatcher(job.stops)
        self.n_tokens = 0  # completion tokens up to the one that completed a stop string
        self.sent = False  # a Delta was sent

    def event(self, ev: Event) -> None:
        if not isinstance(ev, Step):
            return
        worker, job, stops = self.worker, self.job, self.stops
        if worker.on_step is not None:
            worker.on_step(ev)
        texts: list[str] = []
        behind = self.n_tokens  # completion tokens behind the last piece
        for tok in ev.emitted:
            if stops.stopped:
                break
            self.n_tokens += 1
            if out := stops.feed(tok.text):
                texts.append(out)
                behind = self.n_tokens
        if texts and (job.stream or not self.sent):
            job.emit(Delta(tuple(texts), behind))
            if not self.sent and job.stream:  # the stream's first token: out before the next decode
                job.first_written.wait(FIRST_CHUNK_WAIT_SECONDS)
            self.sent = True
        if stops.stopped:
            job.cancel.set()

    def end(self, error: BaseException | None) -> None:
        """The generation ended (`error`: what ended it, where it failed). Called once, on the relaying thread."""
        job, n_tokens = self.job, self.n_tokens
        try:
            if error is not None:
                job.emit(Failed(error if isinstance(error, SpecdecError) else InternalError.of(error)))
                return
            gen = self.run.generation
            rest = self.stops.flush()
            if rest and (job.stream or not self.sent):
                job.emit(Delta((rest,), n_tokens))
            n_completion = n_tokens if self.stops.stopped else len(gen.token_ids)
            if self.worker.on_tokens is not None:
                self.worker.on_tokens(gen.n_prompt_tokens, n_completion)
            if gen.error:  # an RPC server stopped answering: what was streamed stands, then the reason
                job.emit(Failed(RpcError(gen.error)))
                return
            finish = "stop" if self.stops.stopped or gen.stop_reason == "eos" else "length"
            job.emit(Done(gen, self.run.stats, self.stops.released, finish, n_completion, self.run.n_cached))
        except Exception as exc:  # noqa: BLE001 - the request gets an error; the relaying thread goes on
            job.emit(Failed(InternalError.of(exc)))
        finally:
            if self.run.batched:
                self.worker._ended(job)

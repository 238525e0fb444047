"""One generation: in progress (`GenerationRun`, what `Speculator.start` returns), streamed (`Chunk`) and
finished (`Generation`, whose `to_json` is `specdec run --json`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdec_cli.engine import rpc_faults
from specdec_cli.engine.batch.slots import END, BatchJob
from specdec_cli.engine.events import DrafterDropped, Event, Step
from specdec_cli.engine.speculative import SpeculativeGenerator
from specdec_cli.engine.stats import RunStats, Stats
from specdec_cli.errors import RpcError, UsageError

LOST = "rpc"  # the stop reason of a generation whose RPC server stopped answering
Message = Mapping[str, str]
Prompt = str | Sequence[Message]


@dataclass(frozen=True)
class Generation:
    """One finished generation: `stats` has exactly the fields of `specdec run --json`'s."""

    text: str
    token_ids: list[int]
    stop_reason: str  # "eos", "length", "context", "interrupted", "rpc" (an RPC server stopped answering)
    n_prompt_tokens: int
    stats: RunStats
    models: dict[str, str | None]
    settings: dict[str, Any]
    steps: tuple[Step, ...] = ()
    error: str | None = None  # why it ended early, when it was a fault (stop_reason "rpc")

    def to_json(self) -> dict[str, Any]:
        """The object `specdec run --json` prints."""
        extra = {"error": self.error} if self.error else {}
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "n_tokens": len(self.token_ids),
            "stop_reason": self.stop_reason,
            "n_prompt_tokens": self.n_prompt_tokens,
            "models": self.models,
            "settings": self.settings,
            "stats": self.stats.as_dict(),
            **extra,
        }


@dataclass(frozen=True)
class Chunk:
    """Streamed text; `from_draft[i]` says whether token i was a draft token the target accepted."""

    text: str
    token_ids: tuple[int, ...] = ()
    from_draft: tuple[bool, ...] = ()
    generation: Generation | None = None  # set on the last chunk only


@dataclass(frozen=True)
class PromptTokens:
    ids: list[int]
    used_chat: bool


class GenerationRun:
    """One generation in progress: iterate `events()` (plain engine events), then read `generation`.

    `cancel()` (from any thread), or the `cancel` callable/event given to `start`,
    stops it at the next step with both caches consistent.
    """

    def __init__(self, gen: SpeculativeGenerator | BatchJob, settings: dict[str, Any], cancel: Any, *,
                 models: dict[str, str | None], lock: threading.Lock | None = None, n_cached: int = 0,
                 on_draft_dropped: Callable[[str], None] | None = None,
                 on_finished: Callable[[Sequence[int], Sequence[int]], None] | None = None,
                 endpoints: Sequence[str] = ()) -> None:  # fmt: skip
        """`lock`: held while events are read (one generation at a time per loaded pair), none for a batch
        job; `n_cached`: prompt tokens the target's cache held (a batch job knows once it has a slot);
        `on_finished(prompt, output)`: called once the events are read to the end (the token pool);
        `endpoints`: the RPC servers the models are on (the engine then steps in a thread of its own, so
        that a server that stops answering ends the generation instead of blocking the caller for good)."""
        self._gen = gen
        self._settings = settings
        self._external = cancel
        self._models = models
        self._lock = lock
        self._n_cached = n_cached
        self._on_draft_dropped = on_draft_dropped
        self._on_finished = on_finished
        self._endpoints = tuple(endpoints)
        self._cancelled = threading.Event()
        self.error: str | None = None
        self.stats = Stats()

    @property
    def n_cached(self) -> int:
        """Prompt tokens the target did not evaluate again (the cache held them: prefix reuse)."""
        return self._gen.n_cached if isinstance(self._gen, BatchJob) else min(self._n_cached, len(self._gen.prompt) - 1)

    def _should_stop(self) -> bool:
        ext = self._external
        if self._cancelled.is_set():
            return True
        if isinstance(ext, threading.Event):
            return ext.is_set()
        return bool(ext()) if callable(ext) else False

    def cancel(self) -> None:
        """Stop at the next step (callable from any thread); the caches stay consistent."""
        self._cancelled.set()

    def events(self) -> Iterator[Event]:
        """The engine's events as they happen: `Prefill`, then a `Step` per target pass."""
        lock = self._lock or threading.Lock()  # a batch job: any number at once
        if not lock.acquire(blocking=False):
            raise UsageError(
                "this Speculator is already generating: one generation at a time per loaded pair "
                "(load it with parallel=N for several at once)"
            )
        try:
            source = self._gen.events()
            if self._endpoints and not isinstance(self._gen, BatchJob):  # a batch job has its engine's thread
                source = self._isolated(source)
            try:
                for ev in source:
                    self.stats.observe(ev)
                    if isinstance(ev, DrafterDropped) and self._on_draft_dropped is not None:  # only a draft model is
                        self._on_draft_dropped(ev.reason)
                    yield ev
            except RpcError as exc:  # a server stopped answering: the generation ends with what it produced
                self.error = str(exc)
                self._gen.result.stop_reason = LOST
                return
            if self._on_finished is not None:
                self._on_finished(self._gen.prompt, self._gen.result.token_ids)
        finally:
            lock.release()

    @property
    def batched(self) -> bool:
        """Stepped by the batch engine's thread (`parallel` > 1): `listen` instead of `events()` is possible."""
        return isinstance(self._gen, BatchJob)

    def listen(self, on_event: Callable[[Event], None], on_end: Callable[[BaseException | None], None]) -> None:
        """Have a batched generation's events pushed to you instead of reading `events()` (a server's relay).

        `on_event(ev)` for each of `events()`'s, then `on_end(error)` once: None when it ended (`generation`
        is then whole, an RPC fault included, as after `events()`), else the exception `events()` would
        raise. Both run on the engine's thread, between its steps: keep them short. An exception raised by
        `on_event` cancels the generation and is what `on_end` gets."""
        job = self._gen
        assert isinstance(job, BatchJob), "listen() is for a batched generation (parallel > 1)"
        failed: list[BaseException] = []

        def deliver(item: object) -> None:
            if failed and item is not END:
                return
            if item is END:
                error = failed[0] if failed and not isinstance(failed[0], RpcError) else None
                if not failed and self._on_finished is not None:
                    try:
                        self._on_finished(job.prompt, job.result.token_ids)
                    except Exception as exc:  # noqa: BLE001 - on the engine's thread: this generation's error
                        error = exc
                on_end(error)
                return
            if isinstance(item, RpcError):  # a server stopped answering: the generation ends with what it produced
                self.error = str(item)
                job.result.stop_reason = LOST
                failed.append(item)
                return
            if isinstance(item, BaseException):
                failed.append(item)
                return
            ev: Event = item  # type: ignore[assignment]
            try:
                self.stats.observe(ev)
                if isinstance(ev, DrafterDropped) and self._on_draft_dropped is not None:
                    self._on_draft_dropped(ev.reason)
                on_event(ev)
            except Exception as exc:  # noqa: BLE001 - the listener's bug ends this generation, not the engine's step
                failed.append(exc)
                self.cancel()

        job.listen(deliver)

    def _isolated(self, source: Iterator[Event]) -> Iterator[Event]:
        """`source` stepped by a thread of its own. When an RPC server it uses stops answering, that thread
        stays blocked inside llama.cpp for good (engine/rpc.py); this one raises RpcError instead."""
        items: queue.Queue[Any] = queue.Queue()
        done = object()
        endpoints = set(self._endpoints)

        def pump() -> None:
            try:
                for ev in source:
                    items.put(ev)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
                items.put(exc)
            items.put(done)

        def on_loss(loss: rpc_faults.Loss) -> None:
            if endpoints & set(loss.endpoints) or not loss.endpoints:
                items.put(RpcError(loss.reason()))

        unsubscribe = rpc_faults.listen(on_loss)
        thread = threading.Thread(target=pump, name="specdec-generation", daemon=True)
        thread.start()
        lost = False
        try:
            while True:
                item = items.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    lost = isinstance(item, RpcError)
                    raise item
                yield item
        finally:
            unsubscribe()
            if not lost and thread.is_alive():  # the caller stopped reading: stop the engine at its next step
                self._cancelled.set()
                while thread.is_alive():
                    thread.join(0.1)
                    if not items.empty() and any(isinstance(i, RpcError) for i in list(items.queue)):
                        break  # lost while stopping: that thread will not come back

    @property
    def generation(self) -> Generation:
        """What was generated so far (all of it once `events()` is exhausted)."""
        res = self._gen.result
        return Generation(
            text=res.text,
            token_ids=list(res.token_ids),
            stop_reason=res.stop_reason or "interrupted",
            n_prompt_tokens=res.n_prompt,
            stats=self.stats.summary(res.wall_seconds),
            models=self._models,
            settings=self._settings,
            steps=tuple(res.steps),
            error=self.error,
        )

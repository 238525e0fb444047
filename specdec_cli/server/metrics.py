"""`/metrics` in Prometheus text format (prometheus-client, one registry per server)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdec_cli.engine.events import Step

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self, waiting: Callable[[], int], running: Callable[[], int],
                 slots: Callable[[], list[bool]] | None = None) -> None:  # fmt: skip
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdec_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)  # fmt: skip
        self.generated = Counter("specdec_tokens_generated", "Completion tokens generated", registry=r)
        self.prompt = Counter("specdec_prompt_tokens", "Prompt tokens received", registry=r)
        self.drafted = Counter("specdec_tokens_drafted", "Draft tokens proposed to the target", registry=r)
        self.accepted = Counter("specdec_tokens_accepted", "Draft tokens the target accepted", registry=r)
        self.steps = Counter("specdec_steps", "Target verification passes", registry=r)
        self.drafted_at = Counter("specdec_position_drafted", "Steps that drafted position i", ["position"],
                                  registry=r)  # fmt: skip
        self.accepted_at = Counter("specdec_position_accepted", "Steps whose draft position i was accepted",
                                   ["position"], registry=r)  # fmt: skip
        self.acceptance_at = Gauge("specdec_acceptance_by_position", "Accepted / drafted at draft position i",
                                   ["position"], registry=r)  # fmt: skip
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "Request arrival to first generated text",
                              buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.latency = Histogram("specdec_request_duration_seconds", "Request arrival to its last byte",
                                 buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        queue = Gauge("specdec_queue_length", "Requests waiting for the loaded pair", registry=r)
        queue.set_function(lambda: float(waiting()))
        busy = Gauge("specdec_requests_running", "Generations running (at most --parallel)", registry=r)
        busy.set_function(lambda: float(running()))
        self.batch_tokens = Histogram("specdec_batch_tokens", "Tokens in each target batch (all slots)",
                                      buckets=BATCH_BUCKETS, registry=r)  # fmt: skip
        self.batch_slots = Histogram("specdec_batch_sequences", "Slots in each target batch",
                                     buckets=BATCH_BUCKETS, registry=r)  # fmt: skip
        self.batch_drafted = Histogram("specdec_batch_draft_tokens", "Draft tokens in each target batch",
                                       buckets=(0, *BATCH_BUCKETS), registry=r)  # fmt: skip
        if slots is not None:
            def busy_slot(i: int) -> Callable[[], float]:
                return lambda: float(slots()[i])

            for i in range(len(slots())):
                g = Gauge(f"specdec_slot_{i}_busy", f"1 while slot {i} holds a request", registry=r)
                g.set_function(busy_slot(i))
        self._counts: dict[int, list[int]] = {}
        self._lock = threading.Lock()

    def batch(self, n_slots: int, n_tokens: int, n_drafted: int) -> None:
        """Called by the batch engine for every target batch (--parallel > 1)."""
        self.batch_slots.observe(n_slots)
        self.batch_tokens.observe(n_tokens)
        self.batch_drafted.observe(n_drafted)

    def step(self, ev: Step) -> None:
        """Called by the worker for every verification pass."""
        self.steps.inc()
        self.drafted.inc(len(ev.drafted))
        self.accepted.inc(ev.n_accepted)
        with self._lock:  # steps arrive from every worker thread
            for i in range(len(ev.drafted)):
                pos = str(i + 1)
                self.drafted_at.labels(pos).inc()
                row = self._counts.setdefault(i + 1, [0, 0])
                row[0] += 1
                if i < ev.n_accepted:
                    self.accepted_at.labels(pos).inc()
                    row[1] += 1
                self.acceptance_at.labels(pos).set(row[1] / row[0])

    def render(self) -> bytes:
        return generate_latest(self.registry)

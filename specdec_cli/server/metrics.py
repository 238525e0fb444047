"""`/metrics` in Prometheus text format (prometheus-client, one registry per server).

What the batch engine reports at every step (the batch's size, the drafts and what was accepted) is counted in
plain Python and turned into metric families only when `/metrics` is read (`_StepCollector`): prometheus-client's
own counters and histograms take a lock and search their buckets on every call, on the engine's thread, between
two decodes. Requests, latencies and the queue keep prometheus-client's metrics.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from specdec_cli.engine.events import Step

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DRAFT_BUCKETS = (0, *BATCH_BUCKETS)


class _Buckets:
    """A histogram's counts, for a collector to render (`le` buckets as Prometheus's, cumulative when read)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        cumulative, total = [], 0
        for bound, n in zip((*map(floatToGoString, self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            cumulative.append((bound, total))
        return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=self.sum)


class _StepCollector:
    """The engine's per-step figures (`Metrics.batch`, `Metrics.step`), rendered when scraped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # steps arrive from the engine's thread, or every worker thread (--parallel 1)
        self.steps = self.drafted = self.accepted = 0
        self.at: dict[int, list[int]] = {}  # draft position: [steps that drafted it, steps that had it accepted]
        self.slots, self.tokens, self.drafts = _Buckets(BATCH_BUCKETS), _Buckets(BATCH_BUCKETS), _Buckets(DRAFT_BUCKETS)

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            yield CounterMetricFamily("specdec_tokens_drafted", "Draft tokens proposed to the target", value=self.drafted)
            yield CounterMetricFamily("specdec_tokens_accepted", "Draft tokens the target accepted", value=self.accepted)
            yield CounterMetricFamily("specdec_steps", "Target verification passes", value=self.steps)
            drafted_at = CounterMetricFamily("specdec_position_drafted", "Steps that drafted position i", labels=["position"])
            accepted_at = CounterMetricFamily("specdec_position_accepted", "Steps whose draft position i was accepted",
                                              labels=["position"])  # fmt: skip
            rate = GaugeMetricFamily("specdec_acceptance_by_position", "Accepted / drafted at draft position i",
                                     labels=["position"])  # fmt: skip
            for pos, (n, ok) in sorted(self.at.items()):
                drafted_at.add_metric([str(pos)], n)
                accepted_at.add_metric([str(pos)], ok)
                rate.add_metric([str(pos)], ok / n)
            yield from (drafted_at, accepted_at, rate)
            yield self.tokens.family("specdec_batch_tokens", "Tokens in each target batch (all slots)")
            yield self.slots.family("specdec_batch_sequences", "Slots in each target batch")
            yield self.drafts.family("specdec_batch_draft_tokens", "Draft tokens in each target batch")


class Metrics:
    def __init__(self, waiting: Callable[[], int], running: Callable[[], int],
                 slots: Callable[[], list[bool]] | None = None) -> None:  # fmt: skip
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdec_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)  # fmt: skip
        self.generated = Counter("specdec_tokens_generated", "Completion tokens generated", registry=r)
        self.prompt = Counter("specdec_prompt_tokens", "Prompt tokens received", registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "Request arrival to first generated text",
                              buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.latency = Histogram("specdec_request_duration_seconds", "Request arrival to its last byte",
                                 buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        queue = Gauge("specdec_queue_length", "Requests waiting for the loaded pair", registry=r)
        queue.set_function(lambda: float(waiting()))
        busy = Gauge("specdec_requests_running", "Generations running (at most --parallel)", registry=r)
        busy.set_function(lambda: float(running()))
        self._steps = _StepCollector()
        r.register(self._steps)
        if slots is not None:
            def busy_slot(i: int) -> Callable[[], float]:
                return lambda: float(slots()[i])

            for i in range(len(slots())):
                g = Gauge(f"specdec_slot_{i}_busy", f"1 while slot {i} holds a request", registry=r)
                g.set_function(busy_slot(i))

    def batch(self, n_slots: int, n_tokens: int, n_drafted: int) -> None:
        """Called by the batch engine for every target batch (--parallel > 1)."""
        c = self._steps
        with c.lock:
            c.slots.observe(n_slots)
            c.tokens.observe(n_tokens)
            c.drafts.observe(n_drafted)

    def step(self, ev: Step) -> None:
        """Called for every verification pass (on the engine's thread, or a worker's with --parallel 1)."""
        c, n = self._steps, len(ev.drafted)
        with c.lock:
            c.steps += 1
            c.drafted += n
            c.accepted += ev.n_accepted
            for i in range(1, n + 1):
                row = c.at.get(i)
                if row is None:
                    row = c.at[i] = [0, 0]
                row[0] += 1
                row[1] += i <= ev.n_accepted

    def render(self) -> bytes:
        return generate_latest(self.registry)

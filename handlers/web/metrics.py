"""`/metrics`: a worker's Prometheus metrics, on its one web server.

The composition root (`handlers/app.py`) counts into a `WorkerCounts`, and passes
`routes(...)` the things to read at scrape time: the intake's `IntakeStats`, the ingress's
`IngressStats`, the health watch's lag, the jobs table, the reloader. Values are read when
Prometheus scrapes, so the hot path pays for no metric-library calls; each worker has its
own registry, so that two workers in one process (the tests) never mix their numbers.

The metrics, their labels and what they count are listed in docs/operations.md.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from handlers.intake import IntakeStats
from handlers.web.health import PartitionLag

LAUNCH_LATENCY_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    21600.0,
)
"""Upper bounds (seconds) of the launch-latency histogram: from an immediate launch (well
under a second) to a debounced or deferred one (minutes to hours)."""


@dataclass(slots=True)
class LaunchLatency:
    """A histogram of seconds from a launch's deciding event time to its job's creation."""

    bounds: Sequence[float] = LAUNCH_LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LAUNCH_LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """(upper bound, observations at or under it), ending with `+Inf`."""
        running = 0
        buckets = []
        labels = (*(_bound_label(bound) for bound in self.bounds), "+Inf")
        for bound, count in zip(labels, self.counts, strict=True):
            running += count
            buckets.append((bound, float(running)))
        return buckets


def _bound_label(bound: float) -> str:
    """A bucket's `le` label as Prometheus' own clients write it (`900.0`, `0.25`)."""
    return repr(float(bound))


@dataclass(slots=True)
class WorkerCounts:
    """What the keyed side of a worker did, counted by `handlers/app.py`."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Decision records by (rule, outcome)."""
    signals_sent: int = 0
    """Job observations and timer ticks sent onto the keyed topic."""
    rules_version: str = ""
    launch_latency: LaunchLatency = field(default_factory=LaunchLatency)


@dataclass(slots=True)
class IngressStats:
    """What `POST /events` answered (`handlers/web/ingress.py`)."""

    responses: Counter[int] = field(default_factory=Counter)
    """Requests by HTTP status."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Refused requests (400) by the dead-letter code the Kafka intake would have used."""
    events: int = 0
    """Events written to the input topic and acknowledged."""


@dataclass(frozen=True, slots=True)
class Sources:
    """Where a scrape reads from; each a callable or a live object of the worker."""

    intake: IntakeStats
    worker: WorkerCounts
    ingress: IngressStats
    retries: Callable[[], int]
    lag: Callable[[], Sequence[PartitionLag]]
    jobs_by_phase: Callable[[], Mapping[str, int]]
    reloads: Callable[[], Mapping[str, int]]
    """Rule reloads by result (`applied`, `rejected`)."""
    loop_lag: Callable[[], float] = lambda: 0.0
    """Seconds the event loop's last heartbeat came late (`handlers/web/health.py`)."""


class WorkerCollector(Collector):
    """Exposes one worker's numbers to a Prometheus registry."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Any]:
        sources = self._sources
        intake = sources.intake
        for name, value, text in (
            ("received", intake.received, "Records read from the input topics."),
            ("forwarded", intake.forwarded, "Events re-keyed onto the keyed topic, per key."),
            ("unrouted", intake.unrouted, "Valid events no rule listens to."),
            ("handled", intake.handled, "Events (and signals) handed to the rule engine."),
            ("duplicates", intake.duplicates, "Events skipped as already seen (source, id)."),
            # The name predates the service owning retries; dashboards and alerts use it.
            ("retries", sources.retries(), "Backend calls retried while the backend refused."),
        ):
            family = CounterMetricFamily(f"tuneloop_intake_{name}", text)
            family.add_metric([], value)
            yield family
        yield _labelled(
            CounterMetricFamily(
                "tuneloop_dead_letters",
                "Records the intake sent to the dead-letter topic, by code.",
                labels=["code"],
            ),
            {(code,): count for code, count in intake.dead_lettered.items()},
        )
        yield _labelled(
            CounterMetricFamily(
                "tuneloop_decisions",
                "Decision records by rule and outcome.",
                labels=["rule", "outcome"],
            ),
            {labels: float(count) for labels, count in sources.worker.decisions.items()},
        )
        latency = sources.worker.launch_latency
        yield HistogramMetricFamily(
            "tuneloop_launch_latency_seconds",
            "Seconds from a launch's deciding event time (or due timer) to its job's creation.",
            buckets=latency.cumulative(),
            sum_value=latency.total,
        )
        lag = GaugeMetricFamily(
            "tuneloop_consumer_lag",
            "Records on an assigned partition not yet committed as processed.",
            labels=["topic", "partition"],
        )
        for partition in sources.lag():
            lag.add_metric([partition.topic, str(partition.partition)], partition.lag)
        yield lag
        yield _labelled(
            GaugeMetricFamily(
                "tuneloop_jobs", "Jobs of this worker's partitions by phase.", labels=["phase"]
            ),
            {(phase,): count for phase, count in sources.jobs_by_phase().items()},
        )
        yield _labelled(
            CounterMetricFamily(
                "tuneloop_rule_reloads",
                "Changed rule files: applied, or rejected (the old rules stay).",
                labels=["result"],
            ),
            {(result,): count for result, count in sources.reloads().items()},
        )
        ingress = sources.ingress
        yield _labelled(
            CounterMetricFamily(
                "tuneloop_ingress_requests", "POST /events answers by status.", labels=["status"]
            ),
            {(str(status),): count for status, count in ingress.responses.items()},
        )
        yield _labelled(
            CounterMetricFamily(
                "tuneloop_ingress_rejections",
                "POST /events requests refused (400), by dead-letter code.",
                labels=["code"],
            ),
            {(code,): count for code, count in ingress.rejected.items()},
        )
        accepted = CounterMetricFamily(
            "tuneloop_ingress_events", "Events POST /events wrote to the input topic."
        )
        accepted.add_metric([], ingress.events)
        yield accepted
        loop = GaugeMetricFamily(
            "tuneloop_event_loop_lag_seconds",
            "How late the event loop's last heartbeat woke: time the loop was held by one step.",
        )
        loop.add_metric([], sources.loop_lag())
        yield loop
        signals = CounterMetricFamily(
            "tuneloop_signals_sent", "Job observations and ticks sent to the keyed topic."
        )
        signals.add_metric([], sources.worker.signals_sent)
        yield signals
        rules = GaugeMetricFamily(
            "tuneloop_rules_info", "The rule set in force.", labels=["version"]
        )
        rules.add_metric([sources.worker.rules_version], 1)
        yield rules


def _labelled(family: Any, values: Mapping[tuple[str, ...], float]) -> Any:
    for labels, value in sorted(values.items()):
        family.add_metric(list(labels), value)
    return family


def routes(sources: Sources) -> web.RouteTableDef:
    """`GET /metrics`: the Prometheus text exposition of *sources*."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(sources))
    table = web.RouteTableDef()

    @table.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return table

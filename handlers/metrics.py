"""Prometheus metrics of a worker, served on `TUNELOOP_METRICS_PORT` (the Helm chart scrapes
and probes `/metrics` there).

Counters are read from what the worker already counts (`IntakeStats`, `WorkerCounts`, the
service's `Orchestrator.retries`) when Prometheus scrapes, so the hot path pays for no metric
library calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from handlers.intake import IntakeStats


@dataclass(slots=True)
class WorkerCounts:
    """What the keyed side of a worker did, counted by `handlers/app.py`."""

    decisions: Counter[str] = field(default_factory=Counter)
    """Decision records by outcome."""
    signals_sent: int = 0
    """Job observations and timer ticks sent onto the keyed topic."""
    rules_version: str = ""


class WorkerCollector(Collector):
    """Exposes one worker's counters to a Prometheus registry."""

    def __init__(
        self, intake: IntakeStats, worker: WorkerCounts, *, retries: Callable[[], int]
    ) -> None:
        self._intake = intake
        self._worker = worker
        self._retries = retries

    def collect(self) -> Iterator[Any]:
        intake = self._intake
        for name, value, text in (
            ("received", intake.received, "Records read from the input topics."),
            ("forwarded", intake.forwarded, "Events re-keyed onto the keyed topic, per key."),
            ("unrouted", intake.unrouted, "Valid events no rule listens to."),
            ("handled", intake.handled, "Events (and signals) handed to the rule engine."),
            ("duplicates", intake.duplicates, "Events skipped as already seen (source, id)."),
            # The name predates the service owning retries; dashboards and alerts use it.
            ("retries", self._retries(), "Backend calls retried while the backend refused."),
        ):
            family = CounterMetricFamily(f"tuneloop_intake_{name}", text)
            family.add_metric([], value)
            yield family
        dead = CounterMetricFamily(
            "tuneloop_dead_letters", "Records sent to the dead-letter topic.", labels=["code"]
        )
        for code, count in sorted(intake.dead_lettered.items()):
            dead.add_metric([code], count)
        yield dead
        decisions = CounterMetricFamily(
            "tuneloop_decisions", "Decision records by outcome.", labels=["outcome"]
        )
        for outcome, count in sorted(self._worker.decisions.items()):
            decisions.add_metric([outcome], count)
        yield decisions
        signals = CounterMetricFamily(
            "tuneloop_signals_sent", "Job observations and ticks sent to the keyed topic."
        )
        signals.add_metric([], self._worker.signals_sent)
        yield signals
        rules = GaugeMetricFamily(
            "tuneloop_rules_info", "The rule set in force.", labels=["version"]
        )
        rules.add_metric([self._worker.rules_version], 1)
        yield rules


def serve(
    port: int, intake: IntakeStats, worker: WorkerCounts, *, retries: Callable[[], int]
) -> None:
    """Register the worker's collector and serve `/metrics` on *port* (all interfaces)."""
    REGISTRY.register(WorkerCollector(intake, worker, retries=retries))
    start_http_server(port)

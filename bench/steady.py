"""The steady part of a throughput run: from 10 % to 90 % of its events done.

A run processes a backlog that was produced before its process started, so its first
seconds are imports, the group join and table recovery, and its last are the tail of the
last batch. The benchmark samples, many times a second, how many events are done (records on
the output topic) and how much CPU the process has used; `span` cuts the samples where the
count crossed 10 % and 90 % of the total, interpolating between samples, and gives the events,
seconds and CPU seconds in between. The same cut is made for tuneloop's worker and for the
raw pipeline it is compared with, so neither pays its start-up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LOW = 0.1
HIGH = 0.9


@dataclass(frozen=True, slots=True)
class Sample:
    """At `at` (seconds), `done` events were done and the process had used `cpu` seconds."""

    at: float
    done: int
    cpu: float


@dataclass(frozen=True, slots=True)
class Span:
    """Events done, wall seconds and CPU seconds between two points of a run."""

    events: float
    seconds: float
    cpu: float

    @property
    def rate(self) -> float:
        """Events per second; NaN for an empty span."""
        return self.events / self.seconds if self.seconds > 0 else math.nan

    @property
    def cpu_per_event(self) -> float:
        """CPU seconds per event; NaN for an empty span."""
        return self.cpu / self.events if self.events > 0 else math.nan


class IncompleteRunError(ValueError):
    """The samples never reached the share of the total that the span needs."""


def _crossing(samples: Sequence[Sample], target: float) -> tuple[float, float]:
    """(time, cpu) at which `done` reached *target*, linear between the samples around it."""
    previous = samples[0]
    if previous.done >= target:
        return previous.at, previous.cpu
    for sample in samples[1:]:
        if sample.done >= target:
            share = (target - previous.done) / (sample.done - previous.done)
            return (
                previous.at + share * (sample.at - previous.at),
                previous.cpu + share * (sample.cpu - previous.cpu),
            )
        previous = sample
    raise IncompleteRunError(f"the run reached {previous.done} events, never {target:g}")


def span(samples: Sequence[Sample], total: int, *, low: float = LOW, high: float = HIGH) -> Span:
    """The part of the run between `low * total` and `high * total` events done.

    Raises:
        IncompleteRunError: no samples, or they never reached `high * total`.
    """
    if not samples:
        raise IncompleteRunError("no samples")
    ordered = sorted(samples, key=lambda s: s.at)
    start_at, start_cpu = _crossing(ordered, low * total)
    end_at, end_cpu = _crossing(ordered, high * total)
    return Span(events=(high - low) * total, seconds=end_at - start_at, cpu=end_cpu - start_cpu)

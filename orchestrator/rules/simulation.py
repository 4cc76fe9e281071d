"""Replaying events through the real engine on a simulated clock.

`tuneloop simulate`, `tuneloop explain --events` and `tuneloop test` call `simulate`. It drives
exactly the functions the service drives (`route`, `why_not`, `evaluate`, `tick`,
`observe`): the clock follows event time, every key's timers fire as the clock passes them,
and each launched job is assumed to finish `assume_duration` after it started. Every why-not
record is kept (the service limits them per rule and minute; a simulation has no flood to
fear and should answer for every event).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from orchestrator.events import CloudEvent
from orchestrator.ledger import DecisionRecord, Outcome
from orchestrator.rules import engine
from orchestrator.rules.model import RuleSet
from orchestrator.rules.state import KeyState

MAX_TIMER_STEPS = 1_000_000
"""A guard against a timer that never settles; far above what any real replay needs."""


@dataclass(frozen=True, slots=True)
class _RunningJob:
    finishes_at: datetime
    rule: str
    key: str
    name: str


class Simulation:
    """A replay in progress: feed events with `feed`, then `finish` to run out the clock."""

    def __init__(self, rules: RuleSet, *, assume_duration: timedelta) -> None:
        self.rules = rules
        self.assume_duration = assume_duration
        self.states: dict[str, KeyState] = {}
        self.jobs: dict[str, _RunningJob] = {}
        self.now: datetime | None = None
        self.records: list[DecisionRecord] = []

    def feed(self, event: CloudEvent) -> tuple[DecisionRecord, ...]:
        """Advance the clock to *event*'s time (if later) and evaluate it.

        Raises:
            ValueError: the event has no `time` and no earlier event has set the clock.
        """
        if event.time is None and self.now is None:
            raise ValueError(f"event {event.id!r} has no time and no earlier event set the clock")
        at = event.time if event.time is not None else self.now
        assert at is not None
        start = len(self.records)
        self.now = at if self.now is None else max(self.now, at)
        self._run_timers(until=self.now)
        self._take(engine.why_not(self.rules, event, now=self.now))
        keys = dict.fromkeys(route.key for route in engine.route(self.rules, event))
        for key in keys:
            state, records = engine.evaluate(
                self.rules, self.states.get(key), event, key=key, now=self.now, arrived_at=self.now
            )
            self.states[key] = state
            self._take(records)
        return tuple(self.records[start:])

    def finish(self) -> tuple[DecisionRecord, ...]:
        """Run every remaining timer and job to its end."""
        start = len(self.records)
        self._run_timers(until=None)
        return tuple(self.records[start:])

    def _take(self, records: Iterable[DecisionRecord]) -> None:
        for record in records:
            self.records.append(record)
            if record.outcome is Outcome.LAUNCH and record.job_name and self.now is not None:
                started = max(self.now, record.time)
                self.jobs[record.job_name] = _RunningJob(
                    started + self.assume_duration, record.rule, record.key, record.job_name
                )
            elif record.outcome is Outcome.CANCEL and record.job_name:
                self.jobs.pop(record.job_name, None)

    def _run_timers(self, *, until: datetime | None) -> None:
        for _ in range(MAX_TIMER_STEPS):
            candidates: list[tuple[datetime, int, str]] = []
            for name, job in self.jobs.items():
                candidates.append((job.finishes_at, 0, name))
            for key, state in self.states.items():
                wakeup = engine.next_wakeup(state)
                if wakeup is not None:
                    candidates.append((wakeup, 1, key))
            due = [c for c in candidates if until is None or c[0] <= until]
            if not due:
                return
            at, kind, name = min(due)
            self.now = at if self.now is None else max(self.now, at)
            if kind == 0:
                job = self.jobs.pop(name)
                finished = engine.JobFinished(job.rule, job.key, job.name, True, at)
                state, records = engine.observe(
                    self.rules, self.states.get(job.key), finished, key=job.key, now=self.now
                )
                self.states[job.key] = state
            else:
                state, records = engine.tick(self.rules, self.states[name], key=name, now=self.now)
                self.states[name] = state
                if engine.next_wakeup(state) == at:  # pragma: no cover - defensive
                    raise RuntimeError(f"timer for key {name!r} at {at} does not advance")
            self._take(records)
        raise RuntimeError("simulation did not settle")  # pragma: no cover - guard


def simulate(
    rules: RuleSet, events: Iterable[CloudEvent], *, assume_duration: timedelta
) -> tuple[DecisionRecord, ...]:
    """Every decision record of replaying *events* in order, then running out the clock."""
    run = Simulation(rules, assume_duration=assume_duration)
    for event in events:
        run.feed(event)
    run.finish()
    return tuple(run.records)

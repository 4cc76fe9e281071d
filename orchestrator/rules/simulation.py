"""Replaying events through the real engine on a simulated clock.

`tuneloop simulate`, `tuneloop explain --events` and `tuneloop test` call `simulate`. It drives
exactly the functions the service drives (`route`, `why_not`, `evaluate`, `tick`,
`observe`): the clock follows event time, every key's timers fire as the clock passes them,
and each launched job is assumed to finish `assume_duration` after it started. Every why-not
record is kept (the service limits them per rule and minute; a simulation has no flood to
fear and should answer for every event).

A launch of a rule with `sweep:` starts a sweep, driven by the service's own functions
(`orchestrator/sweeps/driving.py`): its trials report what the `assume_metrics` script says
(`orchestrator/sweeps/scripting.py`), spread over their duration, so the median rule, the
goal, the budget and the end play out as in the service, records included. The promotion
gate is not played (it needs a champion's real scores).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation
from orchestrator.ledger import DecisionRecord, Outcome, Reason
from orchestrator.rules import engine
from orchestrator.rules.model import RuleSet
from orchestrator.rules.state import KeyState
from orchestrator.sweeps import driving
from orchestrator.sweeps.scripting import TrialScript
from orchestrator.sweeps.state import SweepStatus
from orchestrator.sweeps.suggesting import PURE, Suggesters

MAX_TIMER_STEPS = 1_000_000
"""A guard against a timer that never settles; far above what any real replay needs."""


@dataclass(frozen=True, slots=True)
class _RunningJob:
    finishes_at: datetime
    rule: str
    key: str
    name: str


@dataclass(frozen=True, slots=True)
class _TrialReport:
    """What a trial reports at `at`: progress or its end (an observation of its job)."""

    at: datetime
    order: int
    key: str
    observation: Observation


class Simulation:
    """A replay in progress: feed events with `feed`, then `finish` to run out the clock."""

    def __init__(
        self,
        rules: RuleSet,
        *,
        assume_duration: timedelta,
        assume_metrics: TrialScript | None = None,
        suggesters: Suggesters = PURE,
    ) -> None:
        self.rules = rules
        self.assume_duration = assume_duration
        self.assume_metrics = assume_metrics or TrialScript()
        self.suggesters = suggesters
        self.states: dict[str, KeyState] = {}
        self.jobs: dict[str, _RunningJob] = {}
        self.trial_reports: list[tuple[datetime, int, _TrialReport]] = []
        """A heap of what trials report next, by time (then in the order scheduled)."""
        self._order = itertools.count()
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
            spec = engine.sweep_of(self.rules, record)
            if spec is not None and record.job is not None and self.now is not None:
                state = self.states.get(record.key) or KeyState()
                step = driving.start(
                    state.sweeps, spec, record.job, now=self.now, suggesters=self.suggesters
                )
                self._sweep(record.key, step)
            elif record.outcome is Outcome.LAUNCH and record.reason is Reason.TRIAL:
                self._schedule_trial(record)
            elif record.outcome is Outcome.LAUNCH and record.job_name and self.now is not None:
                started = max(self.now, record.time)
                self.jobs[record.job_name] = _RunningJob(
                    started + self.assume_duration, record.rule, record.key, record.job_name
                )
            elif record.outcome is Outcome.CANCEL and record.job_name:
                self.jobs.pop(record.job_name, None)
                self.trial_reports = [
                    item
                    for item in self.trial_reports
                    if item[2].observation.job.name != record.job_name
                ]
                heapq.heapify(self.trial_reports)

    def _sweep(self, key: str, step: driving.Step) -> None:
        """Keep what *step* made of the key's sweeps; take its records; release the rule of
        each sweep that ended, as the service does."""
        assert self.now is not None
        state = self.states.get(key) or KeyState()
        self.states[key] = engine.with_sweeps(self.rules, state, step.sweeps, now=self.now)
        self._take(step.records)
        for done in step.finished:
            end = done.sweep.end
            assert end is not None
            finished = engine.JobFinished(
                rule=done.sweep.base.rule,
                key=key,
                job_name=done.sweep.name,
                succeeded=end.status is SweepStatus.SUCCEEDED,
                at=end.at,
            )
            state, records = engine.observe(
                self.rules, self.states.get(key), finished, key=key, now=self.now
            )
            self.states[key] = state
            self._take(records)

    def _schedule_trial(self, record: DecisionRecord) -> None:
        """Queue what the trial of *record* reports, from the script."""
        assert record.job_name is not None
        assert self.now is not None
        state = self.states.get(record.key) or KeyState()
        sweep = driving.sweep_with(state.sweeps, record.job_name)
        trial = sweep.trial_of(record.job_name) if sweep is not None else None
        if trial is None:  # pragma: no cover - a trial's record follows its sweep's state
            return
        scripted = self.assume_metrics.outcome_of(trial)
        duration = scripted.duration or self.assume_duration
        start = max(self.now, record.time)
        job = JobRef(name=record.job_name, backend="simulated")
        reports = [
            Observation(
                job=job,
                phase=JobPhase.RUNNING,
                at=start + duration * (n + 1) / (len(scripted.losses) + 1),
                reason="Progress",
                progress={"step": step, "loss": loss},
            )
            for n, (step, loss) in enumerate(scripted.losses)
        ]
        end = start + duration
        if scripted.failed is not None:
            reports.append(
                Observation(job=job, phase=JobPhase.FAILED, at=end, reason=scripted.failed)
            )
        else:
            result = JobResult(adapter_uri=f"simulated://{job.name}", metrics=scripted.metrics)
            reports.append(Observation(job=job, phase=JobPhase.SUCCEEDED, at=end, result=result))
        for observation in reports:
            order = next(self._order)
            report = _TrialReport(observation.at, order, record.key, observation)
            heapq.heappush(self.trial_reports, (observation.at, order, report))

    def _run_timers(self, *, until: datetime | None) -> None:
        for _ in range(MAX_TIMER_STEPS):
            candidates: list[tuple[datetime, int, str]] = []
            for name, job in self.jobs.items():
                candidates.append((job.finishes_at, 0, name))
            if self.trial_reports:
                candidates.append((self.trial_reports[0][0], 2, ""))
            for key, state in self.states.items():
                wakeup = engine.next_wakeup(state)
                if wakeup is not None:
                    candidates.append((wakeup, 1, key))
            due = [c for c in candidates if until is None or c[0] <= until]
            if not due:
                return
            at, kind, name = min(due)
            self.now = at if self.now is None else max(self.now, at)
            if kind == 2:
                _, _, report = heapq.heappop(self.trial_reports)
                state = self.states.get(report.key) or KeyState()
                observed = driving.observe(
                    state.sweeps, report.observation, suggesters=self.suggesters
                )
                self._sweep(report.key, observed)
                continue
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
                self._take(records)
                if self.states[name].sweeps:
                    step = driving.tick(
                        self.states[name].sweeps, now=self.now, suggesters=self.suggesters
                    )
                    self._sweep(name, step)
                if engine.next_wakeup(self.states[name]) == at:  # pragma: no cover - defensive
                    raise RuntimeError(f"timer for key {name!r} at {at} does not advance")
                continue
            self._take(records)
        raise RuntimeError("simulation did not settle")  # pragma: no cover - guard


def simulate(
    rules: RuleSet,
    events: Iterable[CloudEvent],
    *,
    assume_duration: timedelta,
    assume_metrics: TrialScript | None = None,
    suggesters: Suggesters = PURE,
) -> tuple[DecisionRecord, ...]:
    """Every decision record of replaying *events* in order, then running out the clock;
    sweeps' trials report what *assume_metrics* scripts."""
    run = Simulation(
        rules,
        assume_duration=assume_duration,
        assume_metrics=assume_metrics,
        suggesters=suggesters,
    )
    for event in events:
        run.feed(event)
    run.finish()
    return tuple(run.records)

"""What a sweep remembers, as frozen values with one JSON form.

`machine.py` is the only writer. The service keeps each sweep in its key's `KeyState`
(`orchestrator/rules/state.py`, field `sweeps`), so a sweep's trials are stored in the same
changelog, by the same commit, as the rule state: a worker killed mid-sweep resumes from the
last input it committed and, deciding the same things again, launches nothing twice.

Bounded: a trial keeps its training loss only where its best so far improved (what the median
rule reads), thinned to `MAX_POINTS`; an ended sweep is dropped `RETENTION` after it ended.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from orchestrator.jobs.model import TrainingRequest
from orchestrator.ledger import format_time, job_from_json, job_to_json, parse_time
from orchestrator.sweeps.spec import SweepSpec

MAX_POINTS = 256
"""Loss points kept per trial; past it, every other one is dropped (first and last kept)."""
RETENTION = timedelta(days=1)
"""How long an ended sweep is kept: a trial's late observation (a cancelled trial's end) is
still recognised as a trial's, and says nothing on the output topic."""


class TrialState(enum.StrEnum):
    RUNNING = "running"
    """Launched and not finished (as far as the sweep knows)."""
    COMPLETED = "completed"
    """Succeeded; `metric` is its final score of the objective (None: it reported none)."""
    PRUNED = "pruned"
    """Cancelled by the median rule: it was behind the completed trials."""
    FAILED = "failed"
    """The job failed; counts towards `max_failed`."""
    CANCELLED = "cancelled"
    """Still running when the sweep ended (goal, budget, max_failed): cancelled."""

    @property
    def is_final(self) -> bool:
        return self is not TrialState.RUNNING


def _no_items() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Trial:
    """One trial: its job, its parameters and what it reported."""

    index: int
    job: str
    parameters: Mapping[str, Any]
    launched_at: datetime
    state: TrialState = TrialState.RUNNING
    losses: tuple[tuple[int, float], ...] = ()
    """(step, best training loss up to that step), where the best improved, by step."""
    step: int | None = None
    """The last step it reported."""
    metric: float | None = None
    """Its final score of the objective metric (completed trials)."""
    metrics: Mapping[str, Any] = field(default_factory=_no_items)
    """Every final metric the trainer reported (completed trials)."""
    adapter_uri: str | None = None
    backend: str = ""
    """The backend that ran it (from its final observation), for the completion event."""
    finished_at: datetime | None = None
    reason: str | None = None
    """Why it was pruned, failed or cancelled."""

    def best_loss(self, *, until: int) -> float | None:
        """Its best training loss reported at a step up to *until* (None: none by then)."""
        best = None
        for step, loss in self.losses:
            if step > until:
                break
            best = loss
        return best


class SweepStatus(enum.StrEnum):
    SUCCEEDED = "succeeded"
    """A trial completed with a score: `best` names it."""
    FAILED = "failed"
    """No trial completed with a score, or `max_failed` trials failed."""


class EndReason(enum.StrEnum):
    GOAL_REACHED = "goal-reached"
    MAX_TRIALS = "max-trials"
    """Every trial it could launch (`max_trials`, or every grid point) has finished."""
    BUDGET = "budget"
    """Its wall-clock budget ran out; running trials were cancelled."""
    MAX_FAILED = "max-failed"


@dataclass(frozen=True, slots=True)
class SweepEnd:
    status: SweepStatus
    reason: EndReason
    message: str
    at: datetime
    best: int | None = None
    """Index of the best completed trial (None: none completed with a score)."""


@dataclass(frozen=True, slots=True)
class SweepState:
    """One sweep: started by one launch decision of a rule with `sweep:`."""

    name: str
    """The launch decision's job name: the rule's running job while the sweep runs."""
    spec: SweepSpec
    base: TrainingRequest
    """The job the launch decision rendered; each trial is it with its parameters set."""
    started_at: datetime
    trials: tuple[Trial, ...] = ()
    exhausted: bool = False
    """The suggester has nothing left to try (every grid point was launched)."""
    end: SweepEnd | None = None

    @property
    def deadline(self) -> datetime | None:
        """When its budget runs out (None: no budget, or it already ended)."""
        if self.end is not None or self.spec.budget is None:
            return None
        return self.started_at + self.spec.budget

    @property
    def running(self) -> tuple[Trial, ...]:
        return tuple(t for t in self.trials if t.state is TrialState.RUNNING)

    def trial_of(self, job: str) -> Trial | None:
        """The trial whose job is *job* (None: not one of this sweep's)."""
        return next((t for t in self.trials if t.job == job), None)

    def to_json(self) -> dict[str, Any]:
        end = self.end
        return {
            "name": self.name,
            "spec": self.spec.to_json(),
            "base": job_to_json(self.base),
            "started_at": format_time(self.started_at),
            "trials": [_trial_to_json(t) for t in self.trials],
            "exhausted": self.exhausted,
            "end": None
            if end is None
            else {
                "status": end.status.value,
                "reason": end.reason.value,
                "message": end.message,
                "at": format_time(end.at),
                "best": end.best,
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepState:
        """The inverse of `to_json`.

        Raises:
            ValueError: a field is missing or invalid.
        """
        try:
            end = data.get("end")
            return cls(
                name=str(data["name"]),
                spec=SweepSpec.from_json(data["spec"]),
                base=job_from_json(data["base"]),
                started_at=parse_time(data["started_at"]),
                trials=tuple(_trial_from_json(t) for t in data.get("trials", ())),
                exhausted=bool(data.get("exhausted", False)),
                end=None
                if end is None
                else SweepEnd(
                    status=SweepStatus(end["status"]),
                    reason=EndReason(end["reason"]),
                    message=str(end["message"]),
                    at=parse_time(end["at"]),
                    best=None if end.get("best") is None else int(end["best"]),
                ),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a sweep state: {exc!r}") from exc


def with_loss(trial: Trial, *, step: int, loss: float) -> Trial:
    """*trial* having reported *loss* at *step*: kept only where it improves the best so far
    (a step reported again, or earlier than the last, changes nothing)."""
    if trial.step is not None and step <= trial.step:
        return trial
    losses = trial.losses
    if not losses or loss < losses[-1][1]:
        losses = _thinned((*losses, (step, loss)))
    return replace(trial, losses=losses, step=step)


def _thinned(points: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    if len(points) <= MAX_POINTS:
        return points
    # Dropping a point makes the best "up to" a step read an earlier, higher loss: a trial
    # looks no better than it was, and a reference no better either; never the reverse.
    return (*points[:-1:2], points[-1])


def _trial_to_json(trial: Trial) -> dict[str, Any]:
    return {
        "index": trial.index,
        "job": trial.job,
        "parameters": {
            k: list(v) if isinstance(v, tuple) else v for k, v in trial.parameters.items()
        },
        "launched_at": format_time(trial.launched_at),
        "state": trial.state.value,
        "losses": [[step, loss] for step, loss in trial.losses],
        "step": trial.step,
        "metric": trial.metric,
        "metrics": dict(trial.metrics),
        "adapter_uri": trial.adapter_uri,
        "backend": trial.backend,
        "finished_at": format_time(trial.finished_at) if trial.finished_at else None,
        "reason": trial.reason,
    }


def _trial_from_json(data: Mapping[str, Any]) -> Trial:
    finished = data.get("finished_at")
    metric = data.get("metric")
    return Trial(
        index=int(data["index"]),
        job=str(data["job"]),
        parameters={
            k: tuple(v) if isinstance(v, list) else v for k, v in data["parameters"].items()
        },
        launched_at=parse_time(data["launched_at"]),
        state=TrialState(data["state"]),
        losses=tuple((int(step), float(loss)) for step, loss in data.get("losses", ())),
        step=None if data.get("step") is None else int(data["step"]),
        metric=None if metric is None else float(metric),
        metrics=dict(data.get("metrics") or {}),
        adapter_uri=data.get("adapter_uri"),
        backend=str(data.get("backend") or ""),
        finished_at=parse_time(finished) if finished else None,
        reason=data.get("reason"),
    )


def next_wakeup(sweeps: Mapping[str, SweepState]) -> datetime | None:
    """When the key of *sweeps* next needs a tick for them: the earliest budget deadline of
    one still running, or when an ended one is due to be forgotten (None: neither)."""
    times = [
        sweep.deadline if sweep.end is None else sweep.end.at + RETENTION
        for sweep in sweeps.values()
    ]
    due = [t for t in times if t is not None]
    return min(due) if due else None

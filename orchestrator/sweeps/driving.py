"""What the service calls to drive the sweeps of one key: inputs in, what to do out. Pure.

A key's sweeps live in its `KeyState.sweeps` (name → `SweepState`). `orchestrator/service.py`
hands this module the key's sweeps and one input, and carries out the `Step` it gets back
before it stores the key's state:

- `start`: a launch decision of a rule with `sweep:` (a replayed decision finds its sweep
  already there and starts nothing);
- `observe`: an observation of a trial's job (progress with a training loss, or its end);
- `tick`: time passed (budgets);
- `rejected`: the backend refused a trial's job for good (it counts as failed).

The time each input carries is what the machine decides with: the observation's `at`, the
tick's time, the launch's time, never a clock read here. A replayed input therefore decides
what it decided before the crash, and the trials it launches are the same jobs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation, TrainingRequest
from orchestrator.ledger import DecisionRecord, Outcome, Reason
from orchestrator.sweeps import machine
from orchestrator.sweeps.machine import Cancel, Ended, Launch
from orchestrator.sweeps.spec import SweepSpec
from orchestrator.sweeps.state import (
    RETENTION,
    EndReason,
    SweepState,
    SweepStatus,
    Trial,
    TrialState,
    next_wakeup,
)
from orchestrator.sweeps.suggesting import Suggesters

Sweeps = Mapping[str, SweepState]


@dataclass(frozen=True, slots=True)
class Finished:
    """A sweep that ended with this input: announce it, judge its best trial, release its rule."""

    sweep: SweepState
    best: Observation | None
    """The best trial's success, to put through the promotion gate and announce as
    `finetune.completed`; None when the sweep failed."""


@dataclass(frozen=True, slots=True)
class Step:
    """The key's sweeps after one input, and what the service must do about it."""

    sweeps: Sweeps
    records: tuple[DecisionRecord, ...] = ()
    """What the sweeps decided, for the audit topic (and `tuneloop explain`): a `launch`
    (`trial`) per trial, a `cancel` (`pruned`, `sweep-ended`) per trial stopped, a
    `conclude` per sweep ended; each about the events that caused the sweep."""
    launches: tuple[TrainingRequest, ...] = ()
    cancels: tuple[str, ...] = ()
    finished: tuple[Finished, ...] = ()
    changed: bool = False
    """Whether `sweeps` differs from what the service had (it stores the key's state then)."""
    wakeup: datetime | None = None
    """When the key next needs a tick for its sweeps (`state.next_wakeup`)."""


def owns(sweeps: Sweeps, job: str) -> bool:
    """Whether *job* is a trial of one of *sweeps* (its observations are the sweep's)."""
    return sweep_with(sweeps, job) is not None


def sweep_with(sweeps: Sweeps, job: str) -> SweepState | None:
    """The sweep one of whose trials is *job* (None: no sweep's)."""
    return next((s for s in sweeps.values() if s.trial_of(job) is not None), None)


def start(
    sweeps: Sweeps,
    spec: SweepSpec,
    request: TrainingRequest,
    *,
    now: datetime,
    suggesters: Suggesters,
) -> Step:
    """Start the sweep of the launch decision that rendered *request* (its name names the
    sweep); nothing when that sweep already exists (a replayed decision)."""
    if request.name in sweeps:
        return Step(sweeps=sweeps, wakeup=next_wakeup(sweeps))
    state, actions = machine.start(
        spec, name=request.name, base=request, now=now, suggesters=suggesters
    )
    return _step(sweeps, state, actions, at=now)


def observe(sweeps: Sweeps, observation: Observation, *, suggesters: Suggesters) -> Step:
    """A trial's job made progress or ended (the caller checked `owns`)."""
    job = observation.job.name
    sweep = sweep_with(sweeps, job)
    if sweep is None:
        return Step(sweeps=sweeps)
    at = observation.at
    if observation.phase.is_final:
        result = observation.result or JobResult()
        reason = observation.reason or "Failed"
        state, actions = machine.finished(
            sweep,
            job,
            succeeded=observation.phase is JobPhase.SUCCEEDED,
            metrics=result.metrics,
            adapter_uri=result.adapter_uri,
            backend=observation.job.backend,
            reason=f"{reason}: {observation.message}" if observation.message else reason,
            now=at,
            suggesters=suggesters,
        )
    else:
        step = _whole(observation.progress.get("step"))
        if step is None:
            return Step(sweeps=sweeps)
        state, actions = machine.progress(
            sweep,
            job,
            step=step,
            loss=training_loss(observation.progress),
            now=at,
            suggesters=suggesters,
        )
    return _step(sweeps, state, actions, at=at)


def rejected(
    sweeps: Sweeps, request: TrainingRequest, *, reason: str, at: datetime, suggesters: Suggesters
) -> Step:
    """The backend refused the job of a trial for good: the trial failed."""
    refused = Observation(
        job=JobRef(name=request.name, backend=""),
        phase=JobPhase.FAILED,
        at=at,
        reason=reason,
    )
    return observe(sweeps, refused, suggesters=suggesters)


def tick(sweeps: Sweeps, *, now: datetime, suggesters: Suggesters) -> Step:
    """Time passed: end the sweeps whose budget ran out; forget those ended long ago."""
    kept = {
        name: sweep
        for name, sweep in sweeps.items()
        if sweep.end is None or now - sweep.end.at < RETENTION
    }
    step = Step(sweeps=kept, changed=len(kept) != len(sweeps), wakeup=next_wakeup(kept))
    for sweep in kept.values():
        if sweep.end is not None:
            continue
        state, actions = machine.tick(sweep, now=now, suggesters=suggesters)
        if actions:
            step = merge(step, _step(step.sweeps, state, actions, at=now))
    return step


def training_loss(progress: Mapping[str, Any]) -> float | None:
    """The training loss in a progress report: `train_loss` (Kubernetes, read back from
    `trainerStatus`) or `loss` (the local backend's progress lines)."""
    value = progress.get("train_loss", progress.get("loss"))
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _whole(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value)


def _step(
    sweeps: Sweeps, state: SweepState, actions: tuple[machine.Action, ...], *, at: datetime
) -> Step:
    updated = {**sweeps, state.name: state}
    changed = sweeps.get(state.name) != state
    finished = tuple(
        Finished(sweep=state, best=_best(state)) for action in actions if isinstance(action, Ended)
    )
    return Step(
        sweeps=updated,
        records=tuple(_record(state, action, at=at) for action in actions),
        launches=tuple(a.request for a in actions if isinstance(a, Launch)),
        cancels=tuple(a.job for a in actions if isinstance(a, Cancel)),
        finished=finished,
        changed=changed,
        wakeup=next_wakeup(updated),
    )


def merge(first: Step, then: Step) -> Step:
    """*first*, then *then*: the sweeps after both, and everything either says to do."""
    return Step(
        sweeps=then.sweeps,
        records=(*first.records, *then.records),
        launches=(*first.launches, *then.launches),
        cancels=(*first.cancels, *then.cancels),
        finished=(*first.finished, *then.finished),
        changed=first.changed or then.changed,
        wakeup=then.wakeup,
    )


def _best(state: SweepState) -> Observation | None:
    """The success of the sweep's best trial, as its backend observed it."""
    end = state.end
    if end is None or end.status is not SweepStatus.SUCCEEDED or end.best is None:
        return None
    return success_of(state.trials[end.best])


def success_of(trial: Trial) -> Observation:
    """The observation of a completed *trial*'s success, as its backend made it."""
    return Observation(
        job=JobRef(name=trial.job, backend=trial.backend),
        phase=JobPhase.SUCCEEDED,
        at=trial.finished_at or trial.launched_at,
        reason="Completed",
        result=JobResult(adapter_uri=trial.adapter_uri, metrics=dict(trial.metrics)),
    )


_CONCLUDED = {
    EndReason.GOAL_REACHED: Reason.GOAL_REACHED,
    EndReason.MAX_TRIALS: Reason.MAX_TRIALS,
    EndReason.BUDGET: Reason.BUDGET,
    EndReason.MAX_FAILED: Reason.MAX_FAILED,
}


def _record(sweep: SweepState, action: machine.Action, *, at: datetime) -> DecisionRecord:
    """The audit record of one action. Its id is derived from the sweep's decision, the job
    and the outcome (trials launched at once would otherwise share one)."""
    base = sweep.base
    job: str | None
    if isinstance(action, Launch):
        trial = action.trial
        outcome, reason, job = Outcome.LAUNCH, Reason.TRIAL, trial.job
        settings = ", ".join(f"{path}={_show(v)}" for path, v in trial.parameters.items())
        message = f"trial {trial.index} of sweep {sweep.name}: {settings}"
    elif isinstance(action, Cancel):
        pruned = action.state is TrialState.PRUNED
        outcome, job = Outcome.CANCEL, action.job
        reason = Reason.PRUNED if pruned else Reason.SWEEP_ENDED
        message = f"{'pruned' if pruned else 'cancelled'} trial {job}: {action.reason}"
    else:
        end = action.end
        outcome, reason = Outcome.CONCLUDE, _CONCLUDED[end.reason]
        job = sweep.trials[end.best].job if end.best is not None else None
        message = f"sweep {sweep.name} {end.status.value}: {end.message}"
    identity = "\x1f".join((base.decision_id, sweep.name, job or "", outcome.value))
    return DecisionRecord(
        outcome=outcome,
        reason=reason,
        rule=base.rule,
        rule_version=base.rule_version,
        key=base.key,
        time=at,
        event_ids=base.causing_event_ids,
        message=message,
        job=action.request if isinstance(action, Launch) else None,
        job_name=job,
        trace=base.trace,
        decision_id="d-" + hashlib.blake2b(identity.encode(), digest_size=12).hexdigest(),
    )


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)

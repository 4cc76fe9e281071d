"""The sweep state machine: `(state, input, now) -> (state', actions)`, pure.

Four inputs, each followed by the same step (`_advance`):

- `start`: a launch decision of a rule with `sweep:`; the sweep begins with no trials;
- `progress`: a running trial reported its training loss at a step; the median rule
  (`stopping.py`) may prune it;
- `finished`: a trial's job succeeded (with its final metrics) or failed;
- `tick`: time passed (the budget may have run out).

`_advance` then, in this order: ends the sweep when the goal was reached, `max_failed` trials
failed or the budget ran out (cancelling the trials still running); otherwise starts trials
while fewer than `parallel` run and fewer than `max_trials` were started (each trial's
parameters from the `Suggester` of the sweep's algorithm, its job named by
`orchestrator/jobs/naming.trial_name`); and ends the sweep once nothing runs and nothing is
left to start.

The actions say what the caller (`driving.py`, for the service) must do: `Launch` a trial's
job, `Cancel` one, and, once, `Ended`. They are derived from the state alone, so carrying
them out again after a crash (the same input replayed against the same state) launches the
same jobs by the same names and cancels the same ones: nothing twice, nothing lost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from orchestrator.jobs.model import TrainingRequest
from orchestrator.jobs.naming import trial_name
from orchestrator.sweeps import parameters, stopping
from orchestrator.sweeps.spec import SweepSpec
from orchestrator.sweeps.state import (
    EndReason,
    SweepEnd,
    SweepState,
    SweepStatus,
    Trial,
    TrialState,
    with_loss,
)
from orchestrator.sweeps.suggesting import Suggesters


@dataclass(frozen=True, slots=True)
class Launch:
    """Start the job of *trial*."""

    trial: Trial
    request: TrainingRequest


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the job of a trial that was pruned, or still ran when the sweep ended."""

    job: str
    state: TrialState
    reason: str


@dataclass(frozen=True, slots=True)
class Ended:
    """The sweep ended: announce it, and put its best trial through the promotion gate."""

    end: SweepEnd


Action = Launch | Cancel | Ended
Step = tuple[SweepState, tuple[Action, ...]]


def start(
    spec: SweepSpec,
    *,
    name: str,
    base: TrainingRequest,
    now: datetime,
    suggesters: Suggesters,
) -> Step:
    """A new sweep named *name* (the launch decision's job name) and its first trials."""
    state = SweepState(name=name, spec=spec, base=base, started_at=now)
    return _advance(state, now=now, suggesters=suggesters)


def progress(
    state: SweepState,
    job: str,
    *,
    step: int,
    loss: float | None,
    now: datetime,
    suggesters: Suggesters,
) -> Step:
    """Trial *job* reported training loss *loss* at *step*; it may be pruned."""
    trial = state.trial_of(job)
    if state.end is not None or trial is None or trial.state is not TrialState.RUNNING:
        return state, ()
    if loss is not None and math.isfinite(loss):
        trial = with_loss(trial, step=step, loss=loss)
    elif trial.step is None or step > trial.step:
        trial = replace(trial, step=step)
    actions: list[Action] = []
    median = state.spec.median
    why = stopping.behind(median, trial, state.trials) if median is not None else None
    if why is not None:
        trial = replace(trial, state=TrialState.PRUNED, finished_at=now, reason=why)
        actions.append(Cancel(job=trial.job, state=TrialState.PRUNED, reason=why))
    state = _with_trial(state, trial)
    state, more = _advance(state, now=now, suggesters=suggesters)
    return state, (*actions, *more)


def finished(
    state: SweepState,
    job: str,
    *,
    succeeded: bool,
    now: datetime,
    suggesters: Suggesters,
    metrics: Mapping[str, Any] | None = None,
    adapter_uri: str | None = None,
    backend: str = "",
    reason: str | None = None,
) -> Step:
    """Trial *job* ended: succeeded with *metrics* (its final scores) and *adapter_uri*, or
    failed for *reason*. A trial the sweep already pruned or cancelled stays so."""
    trial = state.trial_of(job)
    if trial is None or trial.state is not TrialState.RUNNING:
        return state, ()
    if succeeded:
        final = dict(metrics or {})
        metric = _score(final.get(state.spec.objective.metric))
        trial = replace(
            trial,
            state=TrialState.COMPLETED,
            metric=metric,
            metrics=final,
            adapter_uri=adapter_uri,
            backend=backend,
            finished_at=now,
            reason=None
            if metric is not None
            else f"it reported no {state.spec.objective.metric}: it cannot be ranked",
        )
    else:
        trial = replace(
            trial,
            state=TrialState.FAILED,
            backend=backend,
            finished_at=now,
            reason=reason or "the job failed",
        )
    state = _with_trial(state, trial)
    if state.end is not None:
        return state, ()
    return _advance(state, now=now, suggesters=suggesters)


def tick(state: SweepState, *, now: datetime, suggesters: Suggesters) -> Step:
    """Time passed: the budget may have run out."""
    return _advance(state, now=now, suggesters=suggesters)


def best(state: SweepState) -> Trial | None:
    """The completed trial with the best score (the earliest of equals), None if none."""
    objective = state.spec.objective
    found: Trial | None = None
    for trial in state.trials:
        if trial.state is not TrialState.COMPLETED or trial.metric is None:
            continue
        if found is None or objective.better(trial.metric, found.metric):  # type: ignore[arg-type]
            found = trial
    return found


# --- the step after every input -------------------------------------------------------------


def _advance(state: SweepState, *, now: datetime, suggesters: Suggesters) -> Step:
    if state.end is not None:
        return state, ()
    spec = state.spec
    reached = _goal_reached(state)
    if reached is not None:
        return _end(state, EndReason.GOAL_REACHED, _goal_message(state, reached), now=now)
    failed = sum(1 for t in state.trials if t.state is TrialState.FAILED)
    if spec.max_failed is not None and failed >= spec.max_failed:
        message = f"{failed} trials failed (max_failed {spec.max_failed})"
        return _end(state, EndReason.MAX_FAILED, message, now=now)
    deadline = state.deadline
    if deadline is not None and now >= deadline:
        return _end(state, EndReason.BUDGET, "its budget ran out", now=now)
    actions: list[Action] = []
    while (
        not state.exhausted
        and len(state.running) < spec.parallel
        and len(state.trials) < spec.max_trials
    ):
        index = len(state.trials)
        suggester = suggesters.get(spec.algorithm)
        if suggester is None:
            raise LookupError(f"no suggester for sweep algorithm {spec.algorithm.value!r}")
        chosen = suggester.suggest(spec, state.trials, index)
        if chosen is None:
            state = replace(state, exhausted=True)
            break
        job = trial_name(sweep=state.name, index=index)
        trial = Trial(index=index, job=job, parameters=dict(chosen), launched_at=now)
        request = parameters.apply(state.base, trial.parameters, name=job)
        state = replace(state, trials=(*state.trials, trial))
        actions.append(Launch(trial=trial, request=request))
    if not state.running and (state.exhausted or len(state.trials) >= spec.max_trials):
        finished_all = f"all {len(state.trials)} trials finished"
        return _end(state, EndReason.MAX_TRIALS, finished_all, now=now)
    return state, tuple(actions)


def _goal_reached(state: SweepState) -> Trial | None:
    objective = state.spec.objective
    for trial in state.trials:
        if (
            trial.state is TrialState.COMPLETED
            and trial.metric is not None
            and objective.reached(trial.metric)
        ):
            return trial
    return None


def _goal_message(state: SweepState, trial: Trial) -> str:
    objective = state.spec.objective
    return (
        f"trial {trial.index} reached the goal: {objective.metric} {trial.metric:.6g} "
        f"(goal {objective.goal:g}, {objective.mode.value})"
    )


def _end(state: SweepState, reason: EndReason, message: str, *, now: datetime) -> Step:
    """End the sweep: cancel what still runs, name the best trial and the outcome."""
    actions: list[Action] = []
    trials = []
    why = f"the sweep ended ({reason.value})"
    for trial in state.trials:
        if trial.state is not TrialState.RUNNING:
            trials.append(trial)
            continue
        trials.append(replace(trial, state=TrialState.CANCELLED, finished_at=now, reason=why))
        actions.append(Cancel(job=trial.job, state=TrialState.CANCELLED, reason=why))
    state = replace(state, trials=tuple(trials))
    top = best(state)
    metric = state.spec.objective.metric
    if top is None:
        status = SweepStatus.FAILED
        message = f"{message}; no trial completed with a {metric}"
    else:
        status = SweepStatus.FAILED if reason is EndReason.MAX_FAILED else SweepStatus.SUCCEEDED
        message = f"{message}; best: trial {top.index} ({metric} {top.metric:.6g})"
    end = SweepEnd(
        status=status,
        reason=reason,
        message=message,
        at=now,
        best=top.index if top is not None else None,
    )
    state = replace(state, end=end)
    return state, (*actions, Ended(end))


def _with_trial(state: SweepState, trial: Trial) -> SweepState:
    return replace(
        state, trials=tuple(trial if t.index == trial.index else t for t in state.trials)
    )


def _score(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None

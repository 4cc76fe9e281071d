"""`MlflowSweepTracker`: a sweep is one MLflow run, the parent of its trials' runs.

Wired by `handlers/app.py` when tracking is configured; it implements
`orchestrator.ports.SweepTracker`:

    started(sweep)   the parent run, in the rule's experiment (`tuneloop/<rule>`), named after
                     the sweep and tagged `tuneloop.sweep_decision_id` with the decision id of
                     the launch that started it; found again by that tag, so a replay creates
                     no second one. Its params are the sweep's spec (`sweep_params`)
    ended(sweep)     the best trial and its objective as metrics (`sweep_metrics`), the end as
                     tags, and the run FINISHED (FAILED for a sweep that ended as failed)

The trials' runs are the trainer's own (`runs.py`): every trial carries its sweep's decision
id, and a trainer whose decision id names a parent run tags its run `mlflow.parentRunId`. The
service calls `started` before it launches a sweep's trials, so the parent is there first.

Best effort, unlike the champion store: a server that is away or refuses is logged as a
warning and the sweep goes on (its trials are then tracked as runs of their own); nothing
raises. Blocking HTTP, run in a thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from orchestrator.sweeps.state import SweepState, SweepStatus, TrialState
from runtimes.tracking import naming
from runtimes.tracking.client import Metric, MlflowClient, RunInfo
from runtimes.tracking.context import RunContext
from runtimes.tracking.runs import context_tags
from runtimes.tracking.settings import TrackingSettings

log = structlog.get_logger(__name__)


def sweep_params(sweep: SweepState) -> dict[str, str]:
    """The sweep's spec as flat params: `objective.metric`, `algorithm.name`, one
    `parameters.<path>` per swept field (its domain as JSON), `parallel`, `max_trials`, ...;
    unset settings are left out. Pure."""
    flat: dict[str, str] = {}

    def put(prefix: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, Mapping) and not prefix.startswith("parameters."):
            for name, inner in value.items():
                put(f"{prefix}.{name}" if prefix else str(name), inner)
        elif isinstance(value, str):
            flat[prefix] = value
        else:
            flat[prefix] = json.dumps(value, separators=(",", ":"))

    put("", sweep.spec.to_json())
    return flat


def sweep_metrics(sweep: SweepState) -> dict[str, float]:
    """What an ended sweep's run holds as metrics: the count of trials in each final state,
    and, when a trial completed best, its index (`best_trial`) and its objective (under the
    objective's own name, e.g. `eval_loss`). Pure."""
    trials = sweep.trials
    metrics: dict[str, float] = {
        "trials": float(len(trials)),
        **{
            f"trials_{state.value}": float(sum(1 for t in trials if t.state is state))
            for state in (TrialState.COMPLETED, TrialState.PRUNED, TrialState.FAILED)
        },
    }
    end = sweep.end
    if end is not None and end.best is not None:
        best = trials[end.best]
        metrics["best_trial"] = float(best.index)
        if best.metric is not None:
            metrics[sweep.spec.objective.metric] = float(best.metric)
    return metrics


class MlflowSweepTracker:
    """`SweepTracker` on MLflow: one parent run per sweep; see the module docstring."""

    def __init__(self, settings: TrackingSettings) -> None:
        self._client = MlflowClient(settings)

    async def started(self, sweep: SweepState) -> None:
        await self._in_thread("sweep_run_not_started", sweep, functools.partial(self._run, sweep))

    async def ended(self, sweep: SweepState) -> None:
        await self._in_thread("sweep_run_not_ended", sweep, functools.partial(self._end, sweep))

    # -- blocking ---------------------------------------------------------------------------------

    def _run(self, sweep: SweepState) -> RunInfo:
        """The sweep's parent run, created with its params and tags when there is none."""
        base = sweep.base
        experiment_id = self._client.experiment_id(naming.experiment_name(base.rule))
        found = self._client.find_run(
            experiment_id, tag=naming.TAG_SWEEP_DECISION_ID, value=base.decision_id
        )
        if found is not None:
            return found
        context = RunContext.from_request(base)
        tags = {
            **context_tags(context),
            naming.TAG_SWEEP: sweep.name,
            naming.TAG_SWEEP_DECISION_ID: base.decision_id,
            naming.TAG_BASE_MODEL: base.base_model,
            naming.TAG_DATASET: base.dataset,
        }
        run = self._client.create_run(experiment_id, name=sweep.name, tags=tags)
        self._client.log_batch(run.run_id, params=sweep_params(sweep))
        log.info("sweep_run_started", sweep=sweep.name, run_id=run.run_id)
        return run

    def _end(self, sweep: SweepState) -> None:
        end = sweep.end
        if end is None:
            return
        run = self._run(sweep)
        step = len(sweep.trials)
        stamp = int(end.at.timestamp() * 1000)
        tags = {
            "tuneloop.sweep_status": end.status.value,
            "tuneloop.sweep_reason": end.reason.value,
            "tuneloop.sweep_message": end.message,
        }
        if end.best is not None:
            tags["tuneloop.best_job"] = sweep.trials[end.best].job
        self._client.log_batch(
            run.run_id,
            metrics=[
                Metric(name, value, step, stamp) for name, value in sweep_metrics(sweep).items()
            ],
            tags=tags,
        )
        status = "FINISHED" if end.status is SweepStatus.SUCCEEDED else "FAILED"
        self._client.end_run(run.run_id, status)

    async def _in_thread(self, failure: str, sweep: SweepState, call: Callable[[], Any]) -> None:
        try:
            await asyncio.to_thread(call)
        except Exception as exc:  # tracking never holds a sweep up, whatever fails
            log.warning(failure, sweep=sweep.name, error=f"{type(exc).__name__}: {exc}")

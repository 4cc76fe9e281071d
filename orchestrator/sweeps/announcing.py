"""`io.tuneloop.finetune.sweep.completed.v1`: the one result of a sweep.

Built by the service once a sweep ended and its best trial went through the promotion gate
(`orchestrator/service.py`). Like the `finetune.*` events (`orchestrator/vocabulary/output.py`)
its identity is derived: the id is `<sweep>.sweep-completed`, so announcing the same end again
after a crash is the *same* event, which consumers dedupe on (source, id); `correlationid` is
the launch decision's id, `causationid` the last event that caused it and `partitionkey` the
rule key. The data lists every trial (parameters, final metric, state) and the best one;
its schema is `orchestrator/vocabulary/schemas/io.tuneloop.finetune.sweep.completed.v1.json`
and docs/events.md describes it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from orchestrator.events import CloudEvent, ExtensionValue
from orchestrator.jobs.promotion import PromotionDecision
from orchestrator.ledger import format_time
from orchestrator.sweeps.state import SweepState, Trial
from orchestrator.vocabulary.output import DEFAULT_SOURCE, EventType


def sweep_completed(
    sweep: SweepState,
    *,
    promotion: PromotionDecision | None = None,
    source: str = DEFAULT_SOURCE,
) -> CloudEvent:
    """The event saying how *sweep* (which has ended) went; *promotion* is the gate's
    decision about its best trial, when its rule has `promote:` and a trial was best.

    Raises:
        ValueError: the sweep has not ended.
    """
    end = sweep.end
    if end is None:
        raise ValueError(f"sweep {sweep.name} has not ended")
    base, spec = sweep.base, sweep.spec
    best = sweep.trials[end.best] if end.best is not None else None
    data: dict[str, Any] = {
        "sweep": sweep.name,
        "rule": base.rule,
        "rule_version": base.rule_version,
        "key": base.key,
        "decision_id": base.decision_id,
        "causing_event_ids": list(base.causing_event_ids),
        "model": base.model_id if base.model_id is not None else base.key,
        "status": end.status.value,
        "reason": end.reason.value,
        "message": end.message,
        "objective": {
            "metric": spec.objective.metric,
            "mode": spec.objective.mode.value,
            "goal": spec.objective.goal,
        },
        "algorithm": {"name": spec.algorithm.value, "seed": spec.seed},
        "started_at": format_time(sweep.started_at),
        "ended_at": format_time(end.at),
        "trials": [_trial(trial) for trial in sweep.trials],
        "best": None if best is None else {**_trial(best), "adapter_uri": best.adapter_uri},
    }
    if promotion is not None:
        data["promoted"] = promotion.promoted
        data["promotion"] = promotion.to_json()
    extensions: dict[str, ExtensionValue] = {
        "correlationid": base.decision_id,
        "partitionkey": base.key,
    }
    if base.causing_event_ids:
        extensions["causationid"] = base.causing_event_ids[-1]
    if base.trace is not None:
        extensions.update(base.trace.as_extensions())
    return CloudEvent(
        id=f"{sweep.name}.sweep-completed",
        source=source,
        type=EventType.FINETUNE_SWEEP_COMPLETED.value,
        subject=sweep.name,
        time=end.at,
        datacontenttype="application/json",
        data=data,
        extensions=MappingProxyType(extensions),
    )


def _trial(trial: Trial) -> dict[str, Any]:
    return {
        "index": trial.index,
        "job": trial.job,
        "parameters": {
            path: list(value) if isinstance(value, tuple) else value
            for path, value in trial.parameters.items()
        },
        "state": trial.state.value,
        "metric": trial.metric,
        "train_loss": trial.losses[-1][1] if trial.losses else None,
        "step": trial.step,
        "reason": trial.reason,
    }

"""Constructors of the CloudEvents tuneloop itself publishes: `io.tuneloop.finetune.*.v1`.

Called by whatever announces a job's outcome (the completion path in `orchestrator/jobs/`,
the CLI's `simulate`), and by tests that need a well-formed output event. Every event built
here validates against its schema in `schemas/`.

Identity is derived, never random: the id is `<job name>.<outcome>` (the job name is itself
derived from the decision), so publishing the same outcome again after a restart produces the
*same* event, which every CloudEvents consumer dedupes on (source, id). The data shape is the
one `orchestrator/jobs/completion.py` writes, so consumers see one format whichever path
announced the job.

Links: `correlationid` is the decision id (shared by every event of that decision),
`causationid` is the id of the event that made the rule fire (the last causing event);
`partitionkey` is the rule key, so all events about one model land in one partition in order.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from orchestrator.events import CloudEvent, ExtensionValue
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, TrainingRequest
from orchestrator.jobs.promotion import PromotionDecision

DEFAULT_SOURCE = "/tuneloop/orchestrator"
"""`source` of tuneloop's own events unless the deployment names itself otherwise."""


class EventType(enum.StrEnum):
    """The `type` values of tuneloop's built-in vocabulary (each has a schema)."""

    DRIFT_DETECTED = "io.tuneloop.drift.detected.v1"
    DATA_ARRIVED = "io.tuneloop.data.arrived.v1"
    FINETUNE_STARTED = "io.tuneloop.finetune.started.v1"
    FINETUNE_COMPLETED = "io.tuneloop.finetune.completed.v1"
    FINETUNE_FAILED = "io.tuneloop.finetune.failed.v1"
    DECISION = "io.tuneloop.decision.v1"
    ADAPTER_SERVED = "io.tuneloop.adapter.served.v1"
    """Published by `tuneloop handoff` (`orchestrator/handoff/announcing.py`)."""
    ADAPTER_HANDOFF_FAILED = "io.tuneloop.adapter.handoff_failed.v1"
    FINETUNE_SWEEP_COMPLETED = "io.tuneloop.finetune.sweep.completed.v1"
    """Published once per sweep by the service (`orchestrator/sweeps/announcing.py`)."""


def finetune_started(
    request: TrainingRequest,
    *,
    job: JobRef,
    at: datetime,
    source: str = DEFAULT_SOURCE,
) -> CloudEvent:
    """The job of *request* is running (first seen running at *at*)."""
    data = _common(request, job, JobPhase.RUNNING)
    data["started_at"] = at.isoformat()
    return _event(EventType.FINETUNE_STARTED, "started", request, at=at, source=source, data=data)


def finetune_completed(
    request: TrainingRequest,
    *,
    job: JobRef,
    at: datetime,
    result: JobResult,
    launched_at: datetime | None = None,
    started_at: datetime | None = None,
    source: str = DEFAULT_SOURCE,
    promotion: PromotionDecision | None = None,
) -> CloudEvent:
    """The job of *request* succeeded at *at*; *result* says where the adapter is. With the
    gate's *promotion* decision (a rule with `promote:`), `promoted` and `promotion` say
    whether the adapter became the champion, both scores and why; without, both are absent."""
    data = _common(request, job, JobPhase.SUCCEEDED)
    data.update(_finished(request, at, result, launched_at=launched_at, started_at=started_at))
    if promotion is not None:
        data["promoted"] = promotion.promoted
        data["promotion"] = promotion.to_json()
    return _event(
        EventType.FINETUNE_COMPLETED, "completed", request, at=at, source=source, data=data
    )


def finetune_failed(
    request: TrainingRequest,
    *,
    job: JobRef,
    at: datetime,
    reason: str,
    message: str = "",
    result: JobResult | None = None,
    launched_at: datetime | None = None,
    started_at: datetime | None = None,
    source: str = DEFAULT_SOURCE,
) -> CloudEvent:
    """The job of *request* failed (or was rejected) at *at*, for *reason*."""
    data = _common(request, job, JobPhase.FAILED)
    data.update(_finished(request, at, result, launched_at=launched_at, started_at=started_at))
    data["reason"] = reason or "Unknown"
    data["message"] = message
    return _event(EventType.FINETUNE_FAILED, "failed", request, at=at, source=source, data=data)


def _event(
    event_type: EventType,
    outcome: str,
    request: TrainingRequest,
    *,
    at: datetime,
    source: str,
    data: Mapping[str, Any],
) -> CloudEvent:
    extensions: dict[str, ExtensionValue] = {
        "correlationid": request.decision_id,
        "partitionkey": request.key,
    }
    if request.causing_event_ids:
        extensions["causationid"] = request.causing_event_ids[-1]
    return CloudEvent(
        id=f"{request.name}.{outcome}",
        source=source,
        type=event_type.value,
        subject=request.name,
        time=at,
        datacontenttype="application/json",
        data=dict(data),
        extensions=MappingProxyType(extensions),
    )


def _common(request: TrainingRequest, job: JobRef, phase: JobPhase) -> dict[str, Any]:
    return {
        "job": request.name,
        "backend": job.backend,
        "namespace": job.namespace,
        "phase": phase.value,
        "rule": request.rule,
        "rule_version": request.rule_version,
        "key": request.key,
        "decision_id": request.decision_id,
        "causing_event_ids": list(request.causing_event_ids),
        "model": request.model_id if request.model_id is not None else request.key,
        "base_model": request.base_model,
        "dataset": request.dataset,
        "runtime": request.runtime,
    }


def _finished(
    request: TrainingRequest,
    at: datetime,
    result: JobResult | None,
    *,
    launched_at: datetime | None,
    started_at: datetime | None,
) -> dict[str, Any]:
    durations: dict[str, float] = {}
    if launched_at is not None:
        durations["total_seconds"] = (at - launched_at).total_seconds()
    if started_at is not None:
        durations["running_seconds"] = (at - started_at).total_seconds()
    if launched_at is not None and started_at is not None:
        durations["queued_seconds"] = (started_at - launched_at).total_seconds()
    adapter_uri = result.adapter_uri if result is not None and result.adapter_uri else None
    return {
        "adapter_uri": adapter_uri if adapter_uri is not None else request.output_uri,
        "metrics": dict(result.metrics) if result is not None else {},
        "finished_at": at.isoformat(),
        "durations": durations,
    }

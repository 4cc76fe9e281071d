"""Internal signals: job observations and timer ticks, carried as CloudEvents on the keyed topic.

Everything that changes the state of one key — an event, a job finishing, a debounce falling
due — must be handled by the worker that owns the key, in order. Events already travel on the
keyed (internal) topic; these signals ride the same topic so that they are ordered with the
events and handled by the same owner. Their types start with `io.tuneloop.internal.`, which the
intake refuses from producers (`is_internal`), so nobody outside can forge them.

Pure: called by `handlers/app.py` (to send) and `orchestrator/service.py` (to read).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation
from orchestrator.ledger import format_time, parse_time

INTERNAL_PREFIX = "io.tuneloop.internal."
OBSERVATION_TYPE = INTERNAL_PREFIX + "observation.v1"
TICK_TYPE = INTERNAL_PREFIX + "tick.v1"
SOURCE = "/tuneloop/worker"


@dataclass(frozen=True, slots=True)
class Tick:
    """Timers of one key may be due at `at` (debounce, held events, deferred launches)."""

    key: str
    at: datetime


def is_internal(event_type: str) -> bool:
    """Whether *event_type* is reserved for tuneloop's own signals."""
    return event_type.startswith(INTERNAL_PREFIX)


def observation_event(observation: Observation, *, key: str) -> CloudEvent:
    """The signal for *observation* of a job that belongs to *key*.

    Its id names the job and phase, so a backend repeating itself sends the same signal. A
    progress report also names its step (`<job>.running.step-<n>`) and carries the report:
    the keyed topic dedupes by id, and a sweep's median rule needs every new step's loss.
    """
    data: dict[str, Any] = {
        "key": key,
        "job": {
            "name": observation.job.name,
            "backend": observation.job.backend,
            "namespace": observation.job.namespace,
        },
        "phase": observation.phase.value,
        "at": format_time(observation.at),
        "reason": observation.reason,
        "message": observation.message,
    }
    if observation.result is not None:
        data["result"] = {
            "adapter_uri": observation.result.adapter_uri,
            "metrics": dict(observation.result.metrics),
        }
    event_id = f"{observation.job.name}.{observation.phase.value.lower()}"
    step = observation.progress.get("step") if observation.progress else None
    if isinstance(step, int) and not isinstance(step, bool):
        data["progress"] = dict(observation.progress)
        event_id = f"{event_id}.step-{step}"
    return CloudEvent(
        id=event_id,
        source=SOURCE,
        type=OBSERVATION_TYPE,
        subject=key,
        time=observation.at,
        datacontenttype="application/json",
        data=data,
    )


def tick_event(tick: Tick) -> CloudEvent:
    """The signal that timers of `tick.key` may be due."""
    stamp = format_time(tick.at)
    return CloudEvent(
        id=f"tick.{tick.key}.{stamp}",
        source=SOURCE,
        type=TICK_TYPE,
        subject=tick.key,
        time=tick.at,
        datacontenttype="application/json",
        data={"key": tick.key, "at": stamp},
    )


def read_signal(event: CloudEvent) -> Observation | Tick | None:
    """The signal *event* carries, None if it is an ordinary event.

    Raises:
        ValueError: an internal event whose data is not what this module writes.
    """
    if event.type == TICK_TYPE:
        data = _data(event)
        return Tick(key=str(data["key"]), at=parse_time(data["at"]))
    if event.type == OBSERVATION_TYPE:
        data = _data(event)
        job = data["job"]
        result = data.get("result")
        return Observation(
            job=JobRef(name=job["name"], backend=job["backend"], namespace=job.get("namespace")),
            phase=JobPhase(data["phase"]),
            at=parse_time(data["at"]),
            reason=data.get("reason"),
            message=data.get("message"),
            result=(
                JobResult(adapter_uri=result.get("adapter_uri"), metrics=result.get("metrics", {}))
                if isinstance(result, dict)
                else None
            ),
            progress=progress if isinstance(progress := data.get("progress"), dict) else {},
        )
    if is_internal(event.type):
        raise ValueError(f"unknown internal signal type {event.type!r}")
    return None


def _data(event: CloudEvent) -> dict[str, Any]:
    if not isinstance(event.data, dict):
        raise ValueError(f"{event.type} carries no JSON object")
    return event.data

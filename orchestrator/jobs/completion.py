"""Exactly one `finetune.started` / `.completed` / `.failed` CloudEvent per job.

Who calls it: the wiring in `handlers/` feeds every `Observation` a backend yields into
`CompletionPublisher.handle`, and calls `record_launch` just before it launches a job. The
publisher itself is a port (`EventPublisher`), and what was already announced lives in a
`CompletionStore` (the lead backs it with a compacted Kafka topic or a faust Table; tests use
`orchestrator.testing.InMemoryCompletionStore`).

Why this gives one event per job across restarts (the choice is argued in docs/kubernetes.md):

1. An observation is news only if `tracking.next_transition(stored phase, observed)` says so,
   and the milestone it reaches has not been announced yet.
2. The event id is derived from the job name and the milestone (`<job>.completed`), never
   random, so a repeat is the *same* event to every CloudEvents consumer, which dedupes on
   (source, id).
3. The event is published (and acknowledged) *before* the store records it. Killed between
   the status change and the publish: nothing was recorded, so the re-listed job is news again
   and the event goes out. Killed between the publish and the record: the event goes out again
   with the same id. So: at-least-once on the wire, exactly once per (source, id).

If publishing fails, `handle` raises and records nothing: hand it the same observation again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from orchestrator.clock import Clock
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobRef, Observation, TrainingRequest
from orchestrator.jobs.tracking import Milestone, next_transition
from orchestrator.ports import EventPublisher

EVENT_TYPES: Mapping[Milestone, str] = {
    Milestone.STARTED: "io.tuneloop.finetune.started.v1",
    Milestone.COMPLETED: "io.tuneloop.finetune.completed.v1",
    Milestone.FAILED: "io.tuneloop.finetune.failed.v1",
}
"""CloudEvent `type` of each announced milestone."""

DEFAULT_SOURCE = "/tuneloop/orchestrator"


@dataclass(frozen=True, slots=True)
class JobContext:
    """What the completion event says about a job besides its phase: where it came from."""

    job: str
    rule: str
    rule_version: str
    key: str
    decision_id: str
    causing_event_ids: tuple[str, ...]
    runtime: str
    base_model: str
    dataset: str
    model_id: str | None = None
    output_uri: str | None = None
    launched_at: datetime | None = None

    @classmethod
    def from_request(
        cls,
        request: TrainingRequest,
        *,
        launched_at: datetime | None = None,
        output_uri: str | None = None,
    ) -> JobContext:
        """The context of a job about to be launched for *request*."""
        return cls(
            job=request.name,
            rule=request.rule,
            rule_version=request.rule_version,
            key=request.key,
            decision_id=request.decision_id,
            causing_event_ids=request.causing_event_ids,
            runtime=request.runtime,
            base_model=request.base_model,
            dataset=request.dataset,
            model_id=request.model_id,
            output_uri=output_uri if output_uri is not None else request.output_uri,
            launched_at=launched_at,
        )

    @property
    def causation_id(self) -> str | None:
        """The event that made the rule fire: the last of the causing events."""
        return self.causing_event_ids[-1] if self.causing_event_ids else None


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """What was already announced about one job: the store's value, keyed by job name."""

    job: str
    context: JobContext | None = None
    phase: JobPhase | None = None
    announced: tuple[Milestone, ...] = ()
    started_at: datetime | None = None
    """When the job was first seen running."""


class CompletionStore(Protocol):
    """Durable record of announced milestones, keyed by job name."""

    async def load(self, job: str) -> CompletionRecord | None:
        """The record of *job*, None if nothing was recorded yet."""
        ...

    async def save(self, record: CompletionRecord) -> None:
        """Replace the record of `record.job`; durable once this returns."""
        ...


ContextRecovery = Callable[[JobRef], Awaitable[JobContext | None]]
"""Finds the context of a job that has no record (e.g. from the TrainJob's annotations)."""


class CompletionPublisher:
    """Turns observations into exactly one CloudEvent per job milestone."""

    def __init__(
        self,
        *,
        store: CompletionStore,
        publisher: EventPublisher,
        clock: Clock,
        source: str = DEFAULT_SOURCE,
        topic: str | None = None,
        recover_context: ContextRecovery | None = None,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._clock = clock
        self._source = source
        self._topic = topic
        self._recover_context = recover_context

    async def record_launch(
        self, request: TrainingRequest, *, output_uri: str | None = None
    ) -> None:
        """Remember where *request* came from, before the backend is asked to launch it.

        Does nothing if the job is already known (a replayed decision keeps its first record).
        """
        if await self._store.load(request.name) is not None:
            return
        context = JobContext.from_request(
            request, launched_at=self._clock.now(), output_uri=output_uri
        )
        await self._store.save(CompletionRecord(job=request.name, context=context))

    async def handle(self, observation: Observation) -> tuple[CloudEvent, ...]:
        """Publish what *observation* announces, if it is news; return what was published.

        Raises:
            Whatever the `EventPublisher` raises; nothing is recorded then, so handing the
            same observation in again is safe.
        """
        name = observation.job.name
        record = await self._store.load(name) or CompletionRecord(job=name)
        transition = next_transition(record.phase, observation.phase)
        if transition is None:
            return ()
        if record.context is None and self._recover_context is not None:
            record = replace(record, context=await self._recover_context(observation.job))
        started_at = record.started_at
        if observation.phase is JobPhase.RUNNING and started_at is None:
            started_at = observation.at
        record = replace(record, phase=observation.phase, started_at=started_at)
        milestone = transition.milestone
        published: tuple[CloudEvent, ...] = ()
        if milestone is not None and milestone not in record.announced:
            event = self.event_for(milestone, observation, record)
            await self._publisher.publish(event, topic=self._topic)
            published = (event,)
            record = replace(record, announced=(*record.announced, milestone))
        await self._store.save(record)
        return published

    def event_for(
        self, milestone: Milestone, observation: Observation, record: CompletionRecord
    ) -> CloudEvent:
        """The CloudEvent announcing *milestone* of the job in *record*."""
        context = record.context
        extensions: dict[str, str] = {}
        if context is not None:
            extensions["correlationid"] = context.decision_id
            if context.causation_id is not None:
                extensions["causationid"] = context.causation_id
        return CloudEvent(
            id=f"{record.job}.{milestone.value}",
            source=self._source,
            type=EVENT_TYPES[milestone],
            subject=record.job,
            time=observation.at,
            datacontenttype="application/json",
            data=_event_data(milestone, observation, record),
            extensions=extensions,
        )


def _event_data(
    milestone: Milestone, observation: Observation, record: CompletionRecord
) -> dict[str, Any]:
    context = record.context
    data: dict[str, Any] = {
        "job": record.job,
        "backend": observation.job.backend,
        "namespace": observation.job.namespace,
        "phase": observation.phase.value,
    }
    if context is not None:
        data.update(
            rule=context.rule,
            rule_version=context.rule_version,
            key=context.key,
            decision_id=context.decision_id,
            causing_event_ids=list(context.causing_event_ids),
            model=context.model_id if context.model_id is not None else context.key,
            base_model=context.base_model,
            dataset=context.dataset,
            runtime=context.runtime,
        )
    if milestone is Milestone.STARTED:
        data["started_at"] = observation.at.isoformat()
        return data
    result = observation.result
    output_uri = context.output_uri if context is not None else None
    data["adapter_uri"] = (
        result.adapter_uri if result is not None and result.adapter_uri else output_uri
    )
    data["metrics"] = dict(result.metrics) if result is not None else {}
    if milestone is Milestone.FAILED:
        data["reason"] = observation.reason or "Unknown"
        data["message"] = observation.message or ""
    data["finished_at"] = observation.at.isoformat()
    data["durations"] = _durations(observation.at, record, context)
    return data


def _durations(
    finished_at: datetime, record: CompletionRecord, context: JobContext | None
) -> dict[str, float]:
    """Seconds from launch and from start to the end, where those moments are known."""
    durations: dict[str, float] = {}
    launched_at = context.launched_at if context is not None else None
    if launched_at is not None:
        durations["total_seconds"] = (finished_at - launched_at).total_seconds()
    if record.started_at is not None:
        durations["running_seconds"] = (finished_at - record.started_at).total_seconds()
    if launched_at is not None and record.started_at is not None:
        durations["queued_seconds"] = (record.started_at - launched_at).total_seconds()
    return durations

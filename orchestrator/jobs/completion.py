"""Exactly one `finetune.started` / `.completed` / `.failed` CloudEvent per job.

Who calls it: the wiring in `handlers/` feeds every `Observation` a backend yields into
`CompletionPublisher.handle`, calls `record_launch` just before it launches a job, and
`announce_rejection` when the backend raised `JobRejectedError` for it. The
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

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Protocol

from orchestrator.clock import Clock
from orchestrator.errors import JobRejectedError
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import (
    JobContext,
    JobPhase,
    JobRef,
    JobResult,
    Observation,
    TrainingRequest,
)
from orchestrator.jobs.promotion import PromotionDecision
from orchestrator.jobs.tracking import Milestone, next_transition
from orchestrator.ports import EventPublisher
from orchestrator.vocabulary import output
from orchestrator.vocabulary.output import DEFAULT_SOURCE


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """What was already announced about one job: the store's value, keyed by job name."""

    job: str
    context: JobContext | None = None
    phase: JobPhase | None = None
    announced: tuple[Milestone, ...] = ()
    started_at: datetime | None = None
    """When the job was first seen running."""
    promotion: PromotionDecision | None = None
    """What the promotion gate decided about the job's adapter, recorded before the champion
    moves and before `finetune.completed` says it: a replay announces the same decision."""


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

    async def announced_final(self, job: str) -> bool:
        """Whether `finetune.completed` or `.failed` went out for *job* (safe to forget it)."""
        record = await self._store.load(job)
        return record is not None and (
            Milestone.COMPLETED in record.announced or Milestone.FAILED in record.announced
        )

    async def record_promotion(self, job: str, decision: PromotionDecision) -> None:
        """Remember the gate's *decision* about *job*; `finetune.completed` will carry it."""
        record = await self._store.load(job) or CompletionRecord(job=job)
        await self._store.save(replace(record, promotion=decision))

    async def announce_rejection(
        self,
        request: TrainingRequest,
        error: JobRejectedError,
        *,
        backend: str,
        namespace: str | None = None,
    ) -> tuple[CloudEvent, ...]:
        """Publish `finetune.failed` for a job the backend refused to launch (missing runtime,
        invalid spec), once: a replayed decision that is refused again announces nothing new.
        """
        await self.record_launch(request)
        refused = Observation(
            job=JobRef(name=request.name, backend=backend, namespace=namespace),
            phase=JobPhase.FAILED,
            at=self._clock.now(),
            reason=error.reason,
            message=str(error),
        )
        return await self.handle(refused)

    async def handle(
        self, observation: Observation, *, publish: bool = True
    ) -> tuple[CloudEvent, ...]:
        """Publish what *observation* announces, if it is news; return what was published.

        With *publish* False the milestone is recorded as dealt with but no event goes out:
        a sweep's trial, whose sweep announces it (`io.tuneloop.finetune.sweep.completed.v1`,
        and `finetune.completed` for its best trial only).

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
            if publish:
                event = self.event_for(milestone, observation, record)
                await self._publisher.publish(event, topic=self._topic)
                published = (event,)
            record = replace(record, announced=(*record.announced, milestone))
        await self._store.save(record)
        return published

    def event_for(
        self, milestone: Milestone, observation: Observation, record: CompletionRecord
    ) -> CloudEvent:
        """The CloudEvent announcing *milestone* of the job in *record*, built with the
        event vocabulary's constructors (`orchestrator/vocabulary/output.py`)."""
        context = record.context or JobContext.unknown(record.job)
        request = context.as_request()
        if milestone is Milestone.STARTED:
            event = output.finetune_started(
                request, job=observation.job, at=observation.at, source=self._source
            )
        elif milestone is Milestone.COMPLETED:
            event = output.finetune_completed(
                request,
                job=observation.job,
                at=observation.at,
                source=self._source,
                result=observation.result or JobResult(),
                launched_at=context.launched_at,
                started_at=record.started_at,
                promotion=record.promotion,
            )
        else:
            event = output.finetune_failed(
                request,
                job=observation.job,
                at=observation.at,
                source=self._source,
                reason=observation.reason or "Unknown",
                message=observation.message or "",
                result=observation.result,
                launched_at=context.launched_at,
                started_at=record.started_at,
            )
        if context.trace is not None:
            # The launch's trace goes on: one trace id from the producer's event to here.
            extensions = {**event.extensions, **context.trace.as_extensions()}
            event = replace(event, extensions=MappingProxyType(extensions))
        if record.context is None:
            # Nothing is known to correlate with: leave the links out rather than send "".
            extensions = {k: v for k, v in event.extensions.items() if v != ""}
            event = replace(event, extensions=MappingProxyType(extensions))
        return event

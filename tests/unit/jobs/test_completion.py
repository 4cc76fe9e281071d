"""Exactly one started/completed/failed CloudEvent per job, also across restarts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.clock import FixedClock
from orchestrator.errors import JobRejectedError
from orchestrator.jobs.completion import CompletionPublisher
from orchestrator.jobs.model import (
    JobContext,
    JobPhase,
    JobRef,
    JobResult,
    Observation,
    TrainingRequest,
)
from orchestrator.testing import InMemoryCompletionStore, RecordingPublisher
from orchestrator.vocabulary.registry import SchemaRegistry

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = JobRef(name="ft-abc", backend="kubernetes", namespace="ml")
REQUEST = TrainingRequest(
    name="ft-abc",
    rule="drift",
    rule_version="3",
    key="model-a",
    decision_id="d-1",
    causing_event_ids=("e-1", "e-2"),
    runtime="torch-distributed",
    base_model="tiny",
    dataset="file:///data/a.jsonl",
    output_uri="file:///out/ft-abc",
    model_id="model-a",
)


def seen(phase, minutes=0, **kwargs):
    return Observation(job=JOB, phase=phase, at=T0 + timedelta(minutes=minutes), **kwargs)


@pytest.fixture
def store():
    return InMemoryCompletionStore()


@pytest.fixture
def events():
    return RecordingPublisher()


def publisher_on(store, events):
    return CompletionPublisher(store=store, publisher=events, clock=FixedClock(T0), topic="out")


async def test_a_job_is_announced_started_then_completed(store, events):
    completion = publisher_on(store, events)
    await completion.record_launch(REQUEST)
    for observation in (
        seen(JobPhase.PENDING),
        seen(JobPhase.RUNNING, 1),
        seen(JobPhase.RUNNING, 2),
        seen(JobPhase.SUCCEEDED, 5, result=JobResult("file:///out/ft-abc", {"loss": 0.5})),
        seen(JobPhase.SUCCEEDED, 6),
    ):
        await completion.handle(observation)
    assert [e.type for e in events.events] == [
        "io.tuneloop.finetune.started.v1",
        "io.tuneloop.finetune.completed.v1",
    ]
    completed = events.events[1]
    assert completed.id == "ft-abc.completed"
    assert dict(completed.extensions) == {
        "correlationid": "d-1",
        "causationid": "e-2",
        "partitionkey": "model-a",
    }
    assert completed.data["adapter_uri"] == "file:///out/ft-abc"
    assert completed.data["metrics"] == {"loss": 0.5}
    assert completed.data["model"] == "model-a"
    assert completed.data["base_model"] == "tiny"
    assert completed.data["runtime"] == "torch-distributed"
    assert completed.data["durations"] == {
        "total_seconds": 300.0,
        "running_seconds": 240.0,
        "queued_seconds": 60.0,
    }
    assert {p.topic for p in events.published} == {"out"}
    for event in events.events:
        SchemaRegistry.builtin().validate(event)


async def test_failure_carries_reason_and_message(store, events):
    completion = publisher_on(store, events)
    await completion.record_launch(REQUEST)
    await completion.handle(seen(JobPhase.FAILED, 3, reason="FailedJobs", message="oom"))
    (failed,) = events.events
    SchemaRegistry.builtin().validate(failed)
    assert failed.type == "io.tuneloop.finetune.failed.v1"
    assert (failed.data["reason"], failed.data["message"]) == ("FailedJobs", "oom")
    assert failed.data["adapter_uri"] == "file:///out/ft-abc"


async def test_restart_between_status_change_and_publish_publishes_once(store, events):
    before_crash = publisher_on(store, events)
    await before_crash.record_launch(REQUEST)
    events.fail_next(ConnectionError("broker down, then the process dies"))
    with pytest.raises(ConnectionError):
        await before_crash.handle(seen(JobPhase.SUCCEEDED, 5))
    after_restart = publisher_on(store, events)
    await after_restart.handle(seen(JobPhase.SUCCEEDED, 7))  # found again by the re-list
    await after_restart.handle(seen(JobPhase.SUCCEEDED, 8))
    assert [e.id for e in events.events] == ["ft-abc.completed"]


async def test_restart_after_publish_before_record_repeats_the_same_event_id(events):
    class ForgetfulStore(InMemoryCompletionStore):
        forget = True

        async def save(self, record):
            if record.announced and self.forget:
                self.forget = False
                raise RuntimeError("killed before the record was written")
            await InMemoryCompletionStore.save(self, record)

    store = ForgetfulStore()
    completion = publisher_on(store, events)
    with pytest.raises(RuntimeError):
        await completion.handle(seen(JobPhase.SUCCEEDED))
    await publisher_on(store, events).handle(seen(JobPhase.SUCCEEDED, 1))
    assert {e.id for e in events.events} == {"ft-abc.completed"}
    assert len(events.events) == 2  # at-least-once on the wire, one id for consumers


async def test_unknown_job_context_is_recovered_from_the_backend(store, events):
    async def recover(job):
        return JobContext.from_request(REQUEST)

    completion = CompletionPublisher(
        store=store, publisher=events, clock=FixedClock(T0), recover_context=recover
    )
    await completion.handle(seen(JobPhase.SUCCEEDED))
    assert events.events[0].extensions["correlationid"] == "d-1"


async def test_unknown_job_without_recovery_is_still_announced(store, events):
    await publisher_on(store, events).handle(seen(JobPhase.FAILED, reason="Deleted"))
    (failed,) = events.events
    SchemaRegistry.builtin().validate(failed)
    assert failed.subject == "ft-abc"
    assert "correlationid" not in failed.extensions


async def test_replayed_launch_keeps_the_first_record(store, events):
    completion = publisher_on(store, events)
    await completion.record_launch(REQUEST)
    later = CompletionPublisher(
        store=store, publisher=events, clock=FixedClock(T0 + timedelta(hours=1))
    )
    await later.record_launch(REQUEST)
    record = await store.load("ft-abc")
    assert record.context.launched_at == T0


async def test_a_rejected_launch_is_announced_failed_once(store, events):
    completion = publisher_on(store, events)
    error = JobRejectedError("runtime 'gpu-xl' does not exist", reason="RuntimeNotFound")
    await completion.announce_rejection(REQUEST, error, backend="kubernetes", namespace="ml")
    await completion.announce_rejection(REQUEST, error, backend="kubernetes", namespace="ml")
    (failed,) = events.events
    SchemaRegistry.builtin().validate(failed)
    assert failed.data["reason"] == "RuntimeNotFound"
    assert "gpu-xl" in failed.data["message"]
    assert failed.extensions["correlationid"] == "d-1"


async def test_a_job_is_announced_final_only_after_its_completion_went_out(store, events):
    completion = publisher_on(store, events)
    await completion.record_launch(REQUEST)
    await completion.handle(seen(JobPhase.RUNNING))
    assert not await completion.announced_final("ft-abc")
    await completion.handle(seen(JobPhase.SUCCEEDED, 1))
    assert await completion.announced_final("ft-abc")
    assert not await completion.announced_final("never-launched")

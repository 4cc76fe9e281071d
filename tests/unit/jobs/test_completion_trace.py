"""The completion events carry the launch's trace context as the CloudEvents distributed-tracing
extension, also when the record of the launch was stored and read back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.jobs.completion import CompletionRecord
from orchestrator.jobs.model import JobContext, JobPhase, TraceContext
from orchestrator.jobs.persistence import record_from_json, record_to_json
from orchestrator.testing import InMemoryCompletionStore, RecordingPublisher
from tests.unit.jobs.test_completion import REQUEST, T0, publisher_on, seen

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACED = replace(REQUEST, trace=TraceContext(TRACEPARENT, "vendor=7"))


@pytest.fixture
def store():
    return InMemoryCompletionStore()


@pytest.fixture
def events():
    return RecordingPublisher()


@pytest.mark.parametrize("phase", [JobPhase.RUNNING, JobPhase.SUCCEEDED, JobPhase.FAILED])
async def test_every_milestone_carries_the_launchs_trace(store, events, phase):
    completion = publisher_on(store, events)
    await completion.record_launch(TRACED)
    (announced,) = await completion.handle(seen(phase))
    assert announced.extensions["traceparent"] == TRACEPARENT
    assert announced.extensions["tracestate"] == "vendor=7"


async def test_an_untraced_launch_announces_without_the_tracing_extension(store, events):
    completion = publisher_on(store, events)
    await completion.record_launch(REQUEST)
    (announced,) = await completion.handle(seen(JobPhase.SUCCEEDED))
    assert "traceparent" not in announced.extensions


def test_the_stored_record_keeps_the_trace():
    context = JobContext.from_request(TRACED, launched_at=T0)
    record = CompletionRecord(job=TRACED.name, context=context)
    assert record_from_json(record_to_json(record)).context.trace == TraceContext(
        TRACEPARENT, "vendor=7"
    )

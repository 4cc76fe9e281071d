"""OpenTelemetry spans reach an OTLP/HTTP collector, as children of the producer's span.

The collector is a stand-in: an aiohttp handler on 127.0.0.1 that the test starts, which
collects the protobuf `ExportTraceServiceRequest`s POSTed to `/v1/traces` and answers as a
collector does. The requests are decoded with `opentelemetry-proto`, someone else's reading of
the wire format, so the test does not trust the exporter about what it sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from handlers.tracing import tracing_for, tracing_from_environment
from orchestrator.clock import SystemClock
from orchestrator.ledger import DecisionRecord, Outcome
from orchestrator.testing import InMemoryBackend
from tests.e2e.test_worker_loop import RULES, drift
from tests.fixtures.topics import read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PRODUCER_SPAN}-01"


class StandInCollector:
    """An OTLP/HTTP traces endpoint that only collects what it is sent."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []

    async def receive(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        self.requests.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def spans(self) -> list:
        return [
            span
            for sent in self.requests
            for resource in sent.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


@pytest.fixture
async def collector() -> AsyncIterator[tuple[StandInCollector, str]]:
    stand_in = StandInCollector()
    app = web.Application()
    app.router.add_post("/v1/traces", stand_in.receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield stand_in, f"http://127.0.0.1:{port}/v1/traces"
    await runner.cleanup()


async def test_a_decision_span_is_exported_as_a_child_of_the_producers_span(collector):
    stand_in, endpoint = collector
    tracing = tracing_for(endpoint)
    event = replace(drift(1), extensions={"traceparent": TRACEPARENT})
    launched = DecisionRecord(
        outcome=Outcome.LAUNCH,
        reason=None,
        rule="drift-retrain",
        rule_version="v1",
        key="m1",
        time=drift(1).time,
        event_ids=(event.id,),
        job_name="ft-m1-abc",
    )
    with tracing.decision(event, key="m1") as span:
        span.decided((launched,))
    # The exporter posts from the SDK's thread while this loop serves the stand-in.
    assert await asyncio.to_thread(tracing.flush)
    tracing.shutdown()

    (exported,) = stand_in.spans()
    assert stand_in.content_types == ["application/x-protobuf"]
    assert exported.name == "tuneloop.decide"
    assert exported.trace_id.hex() == TRACE_ID
    assert exported.parent_span_id.hex() == PRODUCER_SPAN
    attributes = {a.key: a.value for a in exported.attributes}
    assert attributes["cloudevents.event_id"].string_value == event.id
    assert attributes["tuneloop.key"].string_value == "m1"
    assert [v.string_value for v in attributes["tuneloop.outcomes"].array_value.values] == [
        "launch"
    ]
    (resource,) = stand_in.requests[0].resource_spans
    names = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert names["service.name"] == "tuneloop"


async def test_an_untraced_event_starts_a_trace_of_its_own(collector):
    stand_in, endpoint = collector
    tracing = tracing_for(endpoint)
    with tracing.decision(drift(2), key="m1"):
        pass
    assert await asyncio.to_thread(tracing.flush)
    tracing.shutdown()
    (exported,) = stand_in.spans()
    assert exported.parent_span_id == b""
    assert len(exported.trace_id) == 16


def test_without_an_endpoint_tracing_is_a_no_op():
    tracing = tracing_from_environment({})
    assert not tracing.enabled
    with tracing.decision(drift(1), key="m1") as span:
        span.decided(())
    assert tracing.flush()


def test_the_standard_base_endpoint_gets_the_traces_path():
    tracing = tracing_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1/"})
    assert tracing.enabled
    tracing.shutdown()


@pytest.mark.kafka
@pytest.mark.timeout(240)
async def test_a_worker_on_the_real_broker_exports_a_span_per_decision_in_the_producers_trace(
    collector, kafka_bootstrap, new_topic, tmp_path
):
    stand_in, endpoint = collector
    topics = worker_topics(new_topic, "otlp")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    tracing = tracing_for(endpoint)
    worker = build_test_worker(
        worker_settings(kafka_bootstrap, topics),
        rules=rules,
        backend=InMemoryBackend(SystemClock()),
        tracing=tracing,
    )
    traced = replace(drift(1), extensions={"traceparent": TRACEPARENT})

    async def audited() -> bool:
        return bool(await read_topic(kafka_bootstrap, topics["audit"]))

    async with running(worker):
        await send_events(kafka_bootstrap, topics["in"], [traced])
        await wait_for(audited, what="a decision on the audit topic", timeout=60, interval=0.5)
        assert await asyncio.to_thread(tracing.flush)
    tracing.shutdown()

    decided = [s for s in stand_in.spans() if s.name == "tuneloop.decide"]
    assert [s.trace_id.hex() for s in decided] == [TRACE_ID]
    assert decided[0].parent_span_id.hex() == PRODUCER_SPAN
    assert [
        a.value.string_value for a in decided[0].attributes if a.key == "cloudevents.event_id"
    ] == [traced.id]

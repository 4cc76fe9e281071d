"""The use case on fakes: a producer's trace id follows its trigger to the decision, the job
and the completion event; rules that turned an event away say so in the audit topic, within
their limit."""

from __future__ import annotations

from dataclasses import replace

from orchestrator import signals
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation, TraceContext
from orchestrator.ledger import DECISION_EVENT_TYPE, Outcome, Reason, from_cloudevent
from orchestrator.service import Orchestrator
from tests.unit.service.test_orchestrator import World, drift, feed

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"

ONE_SOURCE = """
runtimes: [torch-distributed]
rules:
  - name: monitors-only
    on:
      type: io.tuneloop.drift.detected.v1
      source: "/monitors/*"
    key: "event.data.model_id"
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""


def audited(world: World):
    return [from_cloudevent(e) for e in world.published(DECISION_EVENT_TYPE)]


async def test_the_producers_trace_id_reaches_the_launch_the_job_and_the_completion_event():
    world = World()
    orch = world.orchestrator()
    await feed(orch, drift(1))
    traced = replace(drift(2), extensions={"traceparent": TRACEPARENT, "tracestate": "v=1"})
    assert await feed(orch, traced) == [Outcome.LAUNCH]

    launch = audited(world)[-1]
    assert launch.trace == TraceContext(TRACEPARENT, "v=1")
    assert launch.job is not None
    assert launch.job.trace == launch.trace
    (job,) = world.backend.job_names
    ref = JobRef(name=job, backend="in-memory")
    done = Observation(
        job=ref, phase=JobPhase.SUCCEEDED, at=drift(3).time, result=JobResult("file:///a")
    )
    await orch.handle("m1", signals.observation_event(done, key="m1"))
    (completed,) = world.published("io.tuneloop.finetune.completed.v1")
    assert completed.extensions["traceparent"] == TRACEPARENT
    assert completed.extensions["tracestate"] == "v=1"


async def test_an_event_from_another_source_leaves_an_ignore_record_and_no_key():
    world = World(ONE_SOURCE)
    orch = world.orchestrator()
    stranger = replace(drift(1), source="/someone/else")
    assert await orch.keys_for(stranger) == ()
    (record,) = audited(world)
    assert (record.rule, record.outcome, record.reason) == (
        "monitors-only",
        Outcome.IGNORE,
        Reason.SOURCE_MISMATCH,
    )
    assert record.event_ids == ("d1",)


async def test_a_flood_of_ignored_events_writes_at_most_the_limit_per_rule_per_minute():
    world = World(ONE_SOURCE)
    orch = with_limit(world, per_minute=3)
    # Eight events in the same minute of event time (drift(n) is n minutes after T0).
    for n in range(8):
        event = replace(drift(1), id=f"s{n}", source="/someone/else")
        await orch.keys_for(event)
    assert [r.event_ids[0] for r in audited(world)] == ["s0", "s1", "s2"]
    # The next minute's first record says how many were left out.
    await orch.keys_for(replace(drift(2), id="next", source="/someone/else"))
    last = audited(world)[-1]
    assert (last.event_ids, last.suppressed) == (("next",), 5)


def with_limit(world: World, *, per_minute: int) -> Orchestrator:
    return Orchestrator(
        rules=world.rules,
        backend=world.backend,
        publisher=world.publisher,
        states=world.states,
        completions=world.completions,
        clock=world.clock,
        audit_topic="audit",
        output_topic="out",
        why_not_per_minute=per_minute,
    )

"""The wired worker on the real broker: events in, one launch, one completion event out.

The backend here is the in-memory one, moved by the test the way a cluster would move a job,
so this test is about the worker's wiring (rules, cooldown, forbid, the started and completed
events), not about training. The same loop with real training, on the local-process backend,
is tests/e2e/test_local_loop.py; the Kubernetes backend runs it in the fault suites
(tests/e2e/test_fault_*.py), and all three backends meet one contract in tests/contract.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faust.contrib.asgi import faust_app_running

from handlers.app import Worker, build_worker
from handlers.codec import KafkaRecord, decode_record, encode_event
from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobResult
from orchestrator.ledger import DECISION_EVENT_TYPE
from orchestrator.settings import KafkaSettings, Settings
from orchestrator.testing import InMemoryBackend

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

RULES = """
runtimes: [torch-distributed]
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
      where: "event.data.value > event.data.threshold"
    key: "event.data.model_id"
    window: 6h
    count: 2
    cooldown: 1h
    concurrency: forbid
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""


def drift(n: int, *, model: str = "m1", value: float = 0.3) -> CloudEvent:
    return CloudEvent(
        id=f"drift-{n}",
        source="/monitors/psi",
        type="io.tuneloop.drift.detected.v1",
        time=datetime.now(UTC) - timedelta(minutes=10) + timedelta(seconds=n),
        datacontenttype="application/json",
        data={"model_id": model, "metric": "psi", "value": value, "threshold": 0.2},
    )


async def send(bootstrap: str, topic: str, events: list[CloudEvent]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for event in events:
            record = encode_event(event)
            await producer.send_and_wait(
                topic, value=record.value, key=record.key, headers=list(record.headers)
            )
    finally:
        await producer.stop()


async def read_events(bootstrap: str, topic: str, *, settle: float = 2.0) -> list[CloudEvent]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    found: list[CloudEvent] = []
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=int(settle * 1000))
            if not batches:
                return found
            for records in batches.values():
                for r in records:
                    record = KafkaRecord(value=r.value, headers=tuple(r.headers), key=r.key)
                    found.extend(decode_record(record, max_event_bytes=10_000_000))
    finally:
        await consumer.stop()


async def until(condition: Callable[[], bool], *, what: str, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
def topics(new_topic: Any) -> dict[str, str]:
    return {name: new_topic(name) for name in ("in", "out", "audit", "dlq")}


def make_worker(
    bootstrap: str, topics: dict[str, str], rules: Path, backend: InMemoryBackend, group: str
) -> Worker:
    settings = Settings(
        kafka=KafkaSettings(
            bootstrap=bootstrap,
            topics_in=(topics["in"],),
            topic_out=topics["out"],
            topic_audit=topics["audit"],
            topic_dlq=topics["dlq"],
            group_id=group,
            internal_partitions=2,
        )
    )
    return build_worker(
        settings,
        rule_paths=[rules],
        backend=backend,
        tick_interval=0.2,
        broker_commit_interval=0.2,
        topic_replication_factor=1,
    )


async def test_qualifying_events_launch_one_job_and_its_completion_is_announced_once(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    backend = InMemoryBackend(SystemClock())
    worker = make_worker(kafka_bootstrap, topics, rules, backend, f"w-{uuid.uuid4().hex[:8]}")

    async with faust_app_running(worker.app, stop_timeout=30):
        await send(kafka_bootstrap, topics["in"], [drift(1), drift(2, value=0.1), drift(3)])
        await until(lambda: len(backend.job_names) == 1, what="the launch")
        await send(kafka_bootstrap, topics["in"], [drift(4), drift(5)])  # cooldown + forbid
        (job,) = backend.job_names
        backend.move(job, JobPhase.RUNNING)
        backend.move(job, JobPhase.SUCCEEDED, result=JobResult(adapter_uri="file:///adapter"))
        await until(lambda: worker.counts.signals_sent >= 3, what="the observations")
        out = []
        for _ in range(100):
            out = await read_events(kafka_bootstrap, topics["out"], settle=0.5)
            if any(e.type.endswith("completed.v1") for e in out):
                break

    audit = await read_events(kafka_bootstrap, topics["audit"])
    outcomes = [e.data["outcome"] for e in audit if e.type == DECISION_EVENT_TYPE]
    assert outcomes.count("launch") == 1
    assert "suppress" in outcomes
    assert backend.launch_calls == 1
    completed = [e for e in out if e.type == "io.tuneloop.finetune.completed.v1"]
    started = [e for e in out if e.type == "io.tuneloop.finetune.started.v1"]
    assert len(completed) == 1
    assert len(started) == 1
    assert completed[0].data["adapter_uri"] == "file:///adapter"
    assert completed[0].extensions["causationid"] in {"drift-1", "drift-3"}

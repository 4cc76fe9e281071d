"""Benchmark: tuneloop's intake rate as a ratio to a raw aiokafka consumer (context).

One broker, one topic, the same N binary-mode drift events (~300 bytes, unique ids, 50 rule
keys) in one run:

- baseline: a plain `AIOKafkaConsumer` reading the N records (no decoding), fresh group;
- tuneloop: the intake faust app with a no-op sink, fresh group, counting until the sink has
  been called N times. That is the whole front door: decode + attribute rules + schema
  validation + age check + routing, the repartition through the internal keyed topic, the
  seen-set lookup and write (with its changelog), and committing.

The raw rate is timed from the first fetch of an assigned partition; the faust rates from
the first record their agent sees to the N-th, so connecting and the group join are left out.
The broker is the one the tests use (`kafka_for_tests`: `TUNELOOP_KAFKA_BOOTSTRAP`, or the
local JVM broker).

Two more context rows say where the time goes: a faust agent that only counts records
(faust's own per-event cost, the ceiling of any per-event faust intake) and `admit()` alone
(our decode and validation, no Kafka).

All three rows are context. The old goal (>= 0.5x raw aiokafka) is retired: it is out of
reach for any intake that handles records one by one through faust agents, whose cost is
structural (faust's consumer hands each record to the stream through `Service.wait_first`,
four asyncio tasks and an `asyncio.wait` per record, and a queue; no App setting changes
that). Issue 17 sets worker-level goals in its place. The figures of the last run are in
docs/performance.md, and docs/delivery.md discusses the levers.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

EVENTS_AT = datetime(2026, 6, 1, 11, 0, tzinfo=UTC)
"""The events' `time`; the intake's clock is fixed an hour later so none is too old."""
KEYS = 50
DATA = b'{"model_id":"chat","metric":"jensen_shannon","value":0.17,"threshold":0.1,"rows":48210}'


def _headers(index: int) -> list[tuple[str, bytes]]:
    return [
        ("ce_specversion", b"1.0"),
        ("ce_id", f"bench-{index:08d}".encode()),
        ("ce_source", b"/monitors/evidently/prod"),
        ("ce_type", b"io.tuneloop.drift.detected.v1"),
        ("ce_time", b"2026-06-01T11:00:00Z"),
        ("ce_partitionkey", f"model-{index % KEYS}".encode()),
        ("content-type", b"application/json"),
    ]


async def _produce(bootstrap: str, topic: str, count: int) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for index in range(count):
            await producer.send(
                topic, value=DATA, headers=_headers(index), key=f"model-{index % KEYS}".encode()
            )
        await producer.flush()
    finally:
        await producer.stop()


async def _raw_rate(bootstrap: str, topic: str, count: int) -> float:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    # Assigned, not subscribed: no group join to time, just fetching the records.
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        started = time.perf_counter()
        seen = 0
        while seen < count:
            batches = await consumer.getmany(timeout_ms=1000)
            seen += sum(len(records) for records in batches.values())
        return count / (time.perf_counter() - started)
    finally:
        await consumer.stop()


async def _faust_noop_rate(bootstrap: str, topic: str, count: int) -> float:
    """A faust agent that only counts raw records: the floor any faust intake stands on."""
    import faust
    from faust.contrib.asgi import faust_app_running

    app = faust.App(
        f"bench-faust-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=Path(tempfile.mkdtemp(prefix="tuneloop-bench-faust-")),
        topic_partitions=1,
        topic_replication_factor=1,
        web_enabled=False,
    )
    source = app.topic(topic, key_serializer="raw", value_serializer="raw")
    seen = 0
    first = 0.0
    done = asyncio.Event()

    @app.agent(source)
    async def count_records(stream: object) -> None:
        nonlocal seen, first
        async for _ in stream.events():  # type: ignore[attr-defined]
            seen += 1
            if seen == 1:
                first = time.perf_counter()
            if seen == count:
                done.set()

    async with faust_app_running(app, stop_timeout=30):
        await asyncio.wait_for(done.wait(), timeout=600)
        return (count - 1) / (time.perf_counter() - first)


def _admit_rate(count: int) -> float:
    """The intake's own CPU work per record (decode, rules, schema, age), no Kafka at all."""
    from handlers.codec import KafkaRecord
    from handlers.intake import admit, refuse_unknown_types
    from orchestrator.vocabulary.registry import SchemaRegistry

    registry = SchemaRegistry.builtin()
    records = [KafkaRecord(value=DATA, headers=tuple(_headers(i))) for i in range(count)]
    now = EVENTS_AT + timedelta(hours=1)
    started = time.perf_counter()
    for record in records:
        admit(
            record,
            arrived_at=now,
            now=now,
            registry=registry,
            accepts_unknown_type=refuse_unknown_types,
            max_event_bytes=1 << 20,
            max_age=timedelta(days=1),
        )
    return count / (time.perf_counter() - started)


async def _intake_rate(bootstrap: str, topic: str, count: int) -> tuple[float, str]:
    from faust.contrib.asgi import faust_app_running

    from handlers.codec import RecordInfo
    from handlers.intake import build_intake
    from orchestrator.clock import FixedClock
    from orchestrator.events import CloudEvent
    from orchestrator.settings import KafkaSettings, Settings

    calls = 0
    first = 0.0
    done = asyncio.Event()

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        nonlocal calls, first
        calls += 1
        if calls == 1:
            first = time.perf_counter()
        if calls == count:
            done.set()

    group = f"bench-intake-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        kafka=KafkaSettings(
            bootstrap=bootstrap,
            topics_in=(topic,),
            topic_dlq=f"{topic}-dlq",
            group_id=group,
            internal_partitions=1,
        )
    )
    intake = build_intake(
        settings,
        sink=sink,
        clock=FixedClock(EVENTS_AT + timedelta(hours=1)),
        topic_replication_factor=1,
    )
    async with faust_app_running(intake.app, stop_timeout=30):
        await asyncio.wait_for(done.wait(), timeout=600)
        elapsed = time.perf_counter() - first
    stats = intake.stats
    notes = (
        f"{stats.received} received, {stats.handled} handled, {stats.duplicates} duplicates, "
        f"{sum(stats.dead_lettered.values())} dead-lettered"
    )
    return (count - 1) / elapsed, notes


async def _measure(bootstrap: str, count: int) -> list[dict[str, object]]:
    from kafka import KafkaAdminClient

    topic = f"bench-intake-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}})
    finally:
        admin.close()
    await _produce(bootstrap, topic, count)
    raw = await _raw_rate(bootstrap, topic, count)
    floor = await _faust_noop_rate(bootstrap, topic, count)
    rate, notes = await _intake_rate(bootstrap, topic, count)
    admitted = _admit_rate(count)
    return [
        {
            "benchmark": "intake",
            "measure": f"events/s through decode + validate + repartition + dedup (N={count})",
            "value": rate,
            "unit": "events/s",
            "baseline": raw,
            "ratio": rate / raw,
            "goal": "context: the whole front door",
            "notes": f"baseline: raw AIOKafkaConsumer, same topic; {notes}; the old goal "
            "(>= 0.5x raw aiokafka) is retired, see issue 17 for the worker-level goals",
        },
        {
            "benchmark": "intake",
            "measure": f"events/s of a no-op faust agent on the same topic (N={count})",
            "value": floor,
            "unit": "events/s",
            "baseline": raw,
            "ratio": floor / raw,
            "goal": "context: faust's own per-event cost",
            "notes": "the ceiling of any per-event faust intake on this machine",
        },
        {
            "benchmark": "intake",
            "measure": "records/s through admit() alone: decode + attribute rules + schema",
            "value": admitted,
            "unit": "records/s",
            "baseline": raw,
            "ratio": admitted / raw,
            "goal": "context: the CPU share of the intake",
            "notes": "no Kafka; where the intake's own time goes",
        },
    ]


def run(*, quick: bool) -> list[dict[str, object]]:
    """Measure on the test broker; N = 3,000 quick, 20,000 full."""
    from devservices.kafka import kafka_for_tests

    # One log line per event would measure the terminal, not the intake.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("faust").setLevel(logging.WARNING)
    count = 3_000 if quick else 20_000
    with (
        tempfile.TemporaryDirectory(prefix="tuneloop-bench-") as folder,
        kafka_for_tests(Path(folder)) as endpoint,
    ):
        return asyncio.run(_measure(endpoint.bootstrap, count))


if __name__ == "__main__":  # pragma: no cover - `python -m bench.intake`
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(row)

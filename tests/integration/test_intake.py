"""The intake against the real broker: dead letters, committed offsets, dedup across restarts,
publishing in both modes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faust.contrib.asgi import faust_app_running
from kafka import KafkaAdminClient

from handlers.codec import EncodingMode, KafkaRecord, RecordInfo, decode_record
from handlers.dead_letters import original_headers, read_reason
from handlers.input_batches import intake_group_id
from handlers.intake import Intake, build_intake
from handlers.publishing import KafkaEventPublisher
from orchestrator.clock import FixedClock
from orchestrator.events import CloudEvent
from orchestrator.settings import KafkaSettings, Settings
from tests.corpus.bad_records import NOW, bad_records, binary_headers, envelope, good_records

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

LIMIT = 200_000
"""Small enough that the corpus's oversized records fit through the broker to the DLQ."""


def settings_for(
    bootstrap: str, topic: str, dlq: str, group: str, *, internal_partitions: int = 1
) -> Settings:
    return Settings(
        kafka=KafkaSettings(
            bootstrap=bootstrap,
            topics_in=(topic,),
            topic_dlq=dlq,
            group_id=group,
            internal_partitions=internal_partitions,
            max_event_bytes=LIMIT,
        )
    )


@asynccontextmanager
async def running(
    settings: Settings,
    sink: Callable[[str, CloudEvent, RecordInfo], Awaitable[None]],
    *,
    before_start: Callable[[Intake], None] | None = None,
) -> AsyncIterator[Intake]:
    """The intake of *settings* running on the broker, with *before_start* (declaring a Table,
    say) called on it before its App starts."""
    intake = build_intake(
        settings,
        sink=sink,
        clock=FixedClock(NOW),
        broker_commit_interval=0.2,
        topic_replication_factor=1,
        producer_max_request_size=4 * LIMIT,
        # A worker whose stop did not leave the group in time holds its partitions until its
        # session expires; faust's 60 s default outlasted the test's wait on a loaded machine.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=10.0,
    )
    if before_start is not None:
        before_start(intake)
    async with faust_app_running(intake.app, stop_timeout=30):
        yield intake


async def produce(bootstrap: str, topic: str, records: list[tuple[Any, Any, Any]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * LIMIT)
    await producer.start()
    try:
        for value, headers, key in records:
            # aiokafka refuses a record with neither key nor value; an empty key stands in.
            safe_key = b"" if value is None and key is None else key
            await producer.send(topic, value=value, headers=list(headers), key=safe_key)
        await producer.flush()
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, count: int, *, timeout: float = 30) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_bytes=8 * LIMIT,
        max_partition_fetch_bytes=8 * LIMIT,
    )
    await consumer.start()
    found: list[Any] = []
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(found) < count and asyncio.get_running_loop().time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                found.extend(records)
    finally:
        await consumer.stop()
    return found


async def until(condition: Callable[[], bool], *, timeout: float = 60, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def committed(bootstrap: str, group: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset > 0)


async def wait_committed(bootstrap: str, group: str, topic: str, end: int) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while (offset := await asyncio.to_thread(committed, bootstrap, group, topic)) < end:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"committed offset {offset} never reached {end}")
        await asyncio.sleep(0.3)


async def test_every_bad_record_lands_in_the_dlq_untouched_with_its_code_and_the_worker_goes_on(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq, group = new_topic("in"), new_topic("dlq"), f"it-{uuid.uuid4().hex[:8]}"
    corpus = list(bad_records(max_event_bytes=LIMIT))
    good = list(good_records(10, prefix="ok"))
    # interleave: a good event after every 13 bad ones, so consuming must go on past each
    records: list[tuple[Any, Any, Any]] = []
    for index, bad in enumerate(corpus):
        records.append((bad.value, bad.headers, bad.key))
        if index % 13 == 0 and good:
            value, headers = good.pop()
            records.append((value, headers, None))
    records.extend((value, headers, None) for value, headers in good)
    expected_by_offset = {}
    for offset, (value, headers, _key) in enumerate(records):
        match = next((b for b in corpus if b.value == value and b.headers == tuple(headers)), None)
        if match is not None:
            expected_by_offset[offset] = match
    handled: list[CloudEvent] = []

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        handled.append(event)

    await produce(kafka_bootstrap, topic, records)
    settings = settings_for(kafka_bootstrap, topic, dlq, group)
    async with running(settings, sink) as intake:
        await until(
            lambda: intake.stats.received == len(records) and len(handled) == 10,
            what="every record to have an outcome",
        )
        await wait_committed(kafka_bootstrap, intake_group_id(settings.kafka), topic, len(records))
    letters = await read_all(kafka_bootstrap, dlq, len(corpus))

    assert len(letters) == len(corpus)
    assert sorted(event.id for event in handled) == sorted(f"ok-{n}" for n in range(10))
    for letter in letters:
        reason = read_reason(letter.headers)
        bad = expected_by_offset[reason.offset]
        assert (reason.code, reason.topic) == (bad.code, topic), bad.name
        assert letter.value == bad.value, bad.name
        assert original_headers(letter.headers) == bad.headers, bad.name


async def test_a_restarted_worker_in_the_same_group_hands_each_event_to_the_sink_once(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq, group = new_topic("in"), new_topic("dlq"), f"it-{uuid.uuid4().hex[:8]}"
    settings = settings_for(kafka_bootstrap, topic, dlq, group)
    unique = [f"e-{n}" for n in range(40)]
    # every fourth event is sent twice, the copy well after the original
    sent = unique + unique[::4]
    first_half, second_half = sent[:25], sent[25:]

    def record(event_id: str) -> tuple[Any, Any, Any]:
        return (
            b'{"model_id":"chat","metric":"psi","value":1,"threshold":0}',
            binary_headers(ce_id=event_id, ce_partitionkey="chat"),
            None,
        )

    calls: list[str] = []

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        calls.append(event.id)

    await produce(kafka_bootstrap, topic, [record(i) for i in first_half])
    async with running(settings, sink) as first:
        await until(lambda: len(calls) == 25, what="the first worker to handle its events")
    first_duplicates = first.stats.duplicates

    await produce(kafka_bootstrap, topic, [record(i) for i in second_half])
    async with running(settings, sink) as second:
        await until(
            lambda: (
                second.stats.received >= len(second_half)
                and second.stats.handled + second.stats.duplicates >= len(second_half)
                and set(calls) == set(unique)
            ),
            what="the second worker to handle the rest",
        )
    # Each event reached the sink exactly once. The transport may re-deliver a record around
    # a rebalance (at-least-once); such a copy is skipped as a duplicate too, so the duplicate
    # count is at least the number of copies the producer sent, not exactly that.
    assert sorted(calls) == sorted(unique)
    assert first_duplicates + second.stats.duplicates >= len(unique[::4])


async def test_an_event_that_never_reaches_a_rule_key_of_its_own_is_routed_by_subject(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq, group = new_topic("in"), new_topic("dlq"), f"it-{uuid.uuid4().hex[:8]}"
    keys: list[str] = []

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        keys.append(key)

    import json

    await produce(
        kafka_bootstrap,
        topic,
        [
            (
                json.dumps(envelope(subject="models/chat")).encode(),
                (("content-type", b"application/cloudevents+json"),),
                b"",
            )
        ],
    )
    async with running(settings_for(kafka_bootstrap, topic, dlq, group), sink):
        await until(lambda: bool(keys), what="the event to reach the sink")
    assert keys == ["models/chat"]


@pytest.mark.parametrize("mode", [EncodingMode.BINARY, EncodingMode.STRUCTURED])
async def test_published_events_read_back_identical_in_both_modes(
    kafka_bootstrap, new_topic, mode
) -> None:
    topic = new_topic("out")
    event = CloudEvent(
        id="ft-chat-1.completed",
        source="/tuneloop/orchestrator",
        type="io.tuneloop.finetune.completed.v1",
        subject="ft-chat-1",
        time=NOW,
        datacontenttype="application/json",
        data={"job": "ft-chat-1", "phase": "Succeeded", "adapter_uri": "file:///a", "metrics": {}},
        extensions={"correlationid": "dec-1", "causationid": "drift-9", "partitionkey": "chat"},
    )
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_out=topic)
    async with KafkaEventPublisher(kafka, mode=mode) as publisher:
        await publisher.publish(event)
    (record,) = await read_all(kafka_bootstrap, topic, 1)
    assert record.key == b"chat"
    (decoded,) = decode_record(
        KafkaRecord(value=record.value, headers=tuple(record.headers), key=record.key),
        max_event_bytes=LIMIT,
    )
    assert decoded == event


def test_emit_sends_a_record_the_codec_reads_back(kafka_bootstrap, new_topic) -> None:
    import typer
    from typer.testing import CliRunner

    from handlers.cli import event_commands

    cli = typer.Typer()
    cli.callback()(lambda: None)
    event_commands.register(cli)
    topic = new_topic("emit")
    result = CliRunner().invoke(
        cli,
        [
            "emit",
            "--type",
            "io.tuneloop.data.arrived.v1",
            "--source",
            "/pipelines/labels",
            "--id",
            "batch-7",
            "--data",
            '{"dataset_id": "tickets", "uri": "s3://b/7/", "rows": 500}',
            "--key",
            "chat",
            "--bootstrap",
            kafka_bootstrap,
            "--topic",
            topic,
        ],
    )
    assert result.exit_code == 0, result.output
    (record,) = asyncio.run(read_all(kafka_bootstrap, topic, 1))
    (event,) = decode_record(
        KafkaRecord(value=record.value, headers=tuple(record.headers), key=record.key),
        max_event_bytes=LIMIT,
    )
    assert (event.id, event.extensions["partitionkey"], event.data["rows"]) == (
        "batch-7",
        "chat",
        500,
    )

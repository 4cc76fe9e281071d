"""Stage 1 of the intake against the real broker: each bad record is dead-lettered once, for
readers of committed records, across rebalances of the intake group and a stage 1 that stops
in the middle of a batch; and a fresh intake group starts where the faust group stopped.

The scenario is issue 17's: 120 bad and 60 good records, read in batches of three. Stage 1 is
slowed down (a pause per record around the real `sort_raw`), so that the group changes while
records are still to be read.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faust.contrib.asgi import faust_app_running

from handlers.codec import KafkaRecord, RecordInfo
from handlers.dead_letters import read_reason
from handlers.input_batches import BatchOptions, InputBatches, RecordOutcome, intake_group_id
from handlers.intake import Intake, build_intake
from orchestrator.clock import FixedClock
from orchestrator.events import CloudEvent
from orchestrator.settings import KafkaSettings, Settings
from tests.corpus.bad_records import NOW, bad_records, binary_headers, good_records

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

LIMIT = 200_000
"""Small enough that the corpus's oversized records fit through the broker to the DLQ."""
BAD, GOOD = 120, 60
SMALL_BATCHES = BatchOptions(max_records=3, transaction_timeout_ms=5_000)
PAUSE_PER_RECORD = 0.03
"""Seconds stage 1 spends on each record here, so that a rebalance is likely to find a batch
in hand (its transaction must end before the partitions go)."""

Sink = Callable[[str, CloudEvent, RecordInfo], Awaitable[None]]
Placed = tuple[bytes | None, tuple[tuple[str, bytes], ...], int]
"""A record to produce: value, headers, partition."""


def settings_for(bootstrap: str, topic: str, dlq: str, group: str) -> Settings:
    return Settings(
        kafka=KafkaSettings(
            bootstrap=bootstrap,
            topics_in=(topic,),
            topic_dlq=dlq,
            group_id=group,
            internal_partitions=1,
            max_event_bytes=LIMIT,
        )
    )


def corpus(partitions: int) -> tuple[list[Placed], set[tuple[int, int]]]:
    """Issue 17's corpus, two bad records then a good one, spread over *partitions* in turn;
    and the (partition, offset) of every bad record, known from that placement."""
    bad = iter(list(bad_records(max_event_bytes=LIMIT))[:BAD])
    good = good_records(GOOD, prefix="ok")
    placed: list[Placed] = []
    bad_at: set[tuple[int, int]] = set()
    next_offset = [0] * partitions
    for index in range(BAD + GOOD):
        partition = index % partitions
        if index % 3 == 2:
            value, headers = next(good)
        else:
            record = next(bad)
            value, headers = record.value, record.headers
            bad_at.add((partition, next_offset[partition]))
        placed.append((value, tuple(headers), partition))
        next_offset[partition] += 1
    assert len(bad_at) == BAD
    return placed, bad_at


async def produce(bootstrap: str, topic: str, records: list[Placed]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * LIMIT)
    await producer.start()
    try:
        for value, headers, partition in records:
            # aiokafka refuses a record with neither key nor value; an empty key stands in.
            key = b"" if value is None else None
            await producer.send(
                topic, value=value, key=key, headers=list(headers), partition=partition
            )
        await producer.flush()
    finally:
        await producer.stop()


async def read_dead_letters(
    bootstrap: str, topic: str, *, isolation_level: str, at_least: int, timeout: float = 60
) -> list[Any]:
    """Every record of *topic* a reader with *isolation_level* sees: once *at_least* have
    come, a further 2 s of reading, so that a second copy would be seen too."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
        fetch_max_bytes=8 * LIMIT,
        max_partition_fetch_bytes=8 * LIMIT,
    )
    await consumer.start()
    found: list[Any] = []
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + timeout
        enough_at: float | None = None
        while loop.time() < deadline and (enough_at is None or loop.time() < enough_at + 2):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found.extend(records)
            if enough_at is None and len(found) >= at_least:
                enough_at = loop.time()
    finally:
        await consumer.stop()
    return found


def origins(letters: list[Any], topic: str) -> Counter[tuple[int, int]]:
    """How many dead letters name each (partition, offset) of *topic* as their origin."""
    reasons = [read_reason(letter.headers) for letter in letters]
    assert {reason.topic for reason in reasons} <= {topic}
    return Counter((reason.partition, reason.offset) for reason in reasons)


async def until(condition: Callable[[], bool], *, timeout: float = 90, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class _Slowed:
    """The real `sort_raw`, taking `PAUSE_PER_RECORD` longer per record."""

    def __init__(self, sort: Callable[[KafkaRecord, RecordInfo], RecordOutcome]) -> None:
        self.sort = sort

    def __call__(self, record: KafkaRecord, origin: RecordInfo) -> RecordOutcome:
        time.sleep(PAUSE_PER_RECORD)
        return self.sort(record, origin)


@asynccontextmanager
async def running(settings: Settings, sink: Sink, *, slow: bool = True) -> AsyncIterator[Intake]:
    intake = build_intake(
        settings,
        sink=sink,
        clock=FixedClock(NOW),
        batch_options=SMALL_BATCHES,
        broker_commit_interval=0.2,
        topic_replication_factor=1,
        producer_max_request_size=4 * LIMIT,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=10.0,
    )
    if slow:
        intake.input_batches.sort = _Slowed(intake.input_batches.sort)
    async with faust_app_running(intake.app, stop_timeout=30):
        yield intake


def recording() -> tuple[list[str], Sink]:
    handled: list[str] = []

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        handled.append(event.id)

    return handled, sink


async def test_each_bad_record_is_dead_lettered_once_while_members_join_and_leave_mid_stream(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq = new_topic("in", partitions=4), new_topic("dlq")
    settings = settings_for(kafka_bootstrap, topic, dlq, f"it-{uuid.uuid4().hex[:8]}")
    records, bad_at = corpus(partitions=4)
    # The corpus comes in thirds, each after a change of the group, so that partitions move
    # in the middle of it however slowly the group rebalances (a CI machine took longer to
    # let the second member in than the first took to read a corpus produced up front).
    third = len(records) // 3
    await produce(kafka_bootstrap, topic, records[:third])
    handled, sink = recording()

    async with running(settings, sink) as intake:
        first = intake.input_batches
        await until(lambda: intake.stats.received >= 15, what="the first member to begin")
        second = InputBatches(
            settings.kafka, sort=first.sort, count=first.count, options=SMALL_BATCHES
        )
        await second.start()
        try:
            await until(
                lambda: second.assignments >= 1 and first.assignments >= 2,
                what="the second member to take partitions",
            )
            await produce(kafka_bootstrap, topic, records[third : 2 * third])
            await until(
                lambda: second.batches_committed >= 2,
                what="the second member to commit batches",
            )
        finally:
            await second.stop()
        await produce(kafka_bootstrap, topic, records[2 * third :])
        await until(
            lambda: intake.stats.received == BAD + GOOD and len(set(handled)) == GOOD,
            what=f"every record to have an outcome ({intake.stats})",
        )

    letters = await read_dead_letters(
        kafka_bootstrap, dlq, isolation_level="read_committed", at_least=BAD
    )
    # The group changed three times (first joins, second joins, second leaves), each with
    # records still to come.
    assert first.assignments >= 3
    assert origins(letters, topic) == Counter(dict.fromkeys(bad_at, 1))
    assert sorted(handled) == sorted(f"ok-{n}" for n in range(GOOD))


async def test_a_stage_one_stopped_in_the_middle_of_a_batch_leaves_no_second_dead_letter(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq = new_topic("in", partitions=2), new_topic("dlq")
    settings = settings_for(kafka_bootstrap, topic, dlq, f"it-{uuid.uuid4().hex[:8]}")
    records, bad_at = corpus(partitions=2)
    await produce(kafka_bootstrap, topic, records)
    handled, sink = recording()

    async with running(settings, sink) as crashed:
        batches = crashed.input_batches
        await until(lambda: batches._producer is not None, what="stage 1's producer")
        # The crash point, made certain: once a third of the corpus is committed, the next
        # batch's commit never comes, as in a worker killed after its dead letters were sent
        # (polling for an open transaction instead missed its few milliseconds in most runs).
        producer = batches._producer
        commit = producer.commit_transaction
        held = asyncio.Event()

        async def commit_unless_killed() -> None:
            if crashed.stats.received >= 60:
                held.set()
                await asyncio.Event().wait()
            await commit()

        producer.commit_transaction = commit_unless_killed
        await until(held.is_set, what="a batch's commit in the middle of the corpus")
        assert batches.transaction_open
        await batches.abandon()  # as kill -9 would: no abort, no commit
    async with running(settings, sink, slow=False) as restarted:
        await until(
            lambda: (
                crashed.stats.received + restarted.stats.received >= BAD + GOOD
                and len(set(handled)) == GOOD
            ),
            what="the restarted intake to read the rest",
        )

    committed = await read_dead_letters(
        kafka_bootstrap, dlq, isolation_level="read_committed", at_least=BAD
    )
    everything = await read_dead_letters(
        kafka_bootstrap, dlq, isolation_level="read_uncommitted", at_least=BAD + 1
    )
    # The abandoned batch's dead letters were written, in a transaction the broker aborted:
    # a reader of uncommitted records sees them twice, a reader of committed ones once.
    assert len(everything) > BAD
    assert origins(committed, topic) == Counter(dict.fromkeys(bad_at, 1))
    assert sorted(handled) == sorted(f"ok-{n}" for n in range(GOOD))


async def commit_offset(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """Commit *offset* for partition 0 of *topic* in *group*, as a consumer of it would."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


def drift(event_id: str) -> Placed:
    return (
        b'{"model_id":"chat","metric":"psi","value":1,"threshold":0}',
        binary_headers(ce_id=event_id, ce_partitionkey="chat"),
        0,
    )


@pytest.mark.parametrize(
    ("faust_group_at", "intake_group_at", "first_read"),
    [(6, None, 6), (None, None, 0), (3, 8, 8)],
    ids=["upgrade-from-faust-group", "new-worker", "intake-group-wins"],
)
async def test_stage_one_starts_where_its_group_stopped_else_where_the_faust_group_stopped(
    kafka_bootstrap, new_topic, faust_group_at, intake_group_at, first_read
) -> None:
    topic, dlq, group = new_topic("in"), new_topic("dlq"), f"it-{uuid.uuid4().hex[:8]}"
    settings = settings_for(kafka_bootstrap, topic, dlq, group)
    await produce(kafka_bootstrap, topic, [drift(f"e-{n}") for n in range(10)])
    if faust_group_at is not None:
        await commit_offset(kafka_bootstrap, group, topic, faust_group_at)
    if intake_group_at is not None:
        await commit_offset(
            kafka_bootstrap, intake_group_id(settings.kafka), topic, intake_group_at
        )
    handled, sink = recording()

    async with running(settings, sink, slow=False) as intake:
        await until(lambda: intake.stats.received == 10 - first_read, what="the rest to be read")
        await until(lambda: len(handled) == 10 - first_read, what="the sink to be called")
        await asyncio.sleep(1)  # time for a record read from too early a position to show

    assert handled == [f"e-{n}" for n in range(first_read, 10)]
    assert intake.stats.received == 10 - first_read

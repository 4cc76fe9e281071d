"""The Kafka the tests get is a real one: groups, committed offsets, transactions, restarts, faust.

These run against whatever `kafka_bootstrap` provides (tests/fixtures/kafka.py); the restart
test needs the local broker and skips against an external cluster or a container.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import faust
import pytest
from faust.contrib.asgi import faust_app_running
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from devservices.kafka import BrokerKind, LocalKafka, kafka_for_tests
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for value in values:
            producer.send(topic, value=value)
        producer.flush(timeout=30)
    finally:
        producer.close()


def _consume(consumer: KafkaConsumer, *, count: int, timeout_s: float = 20.0) -> list[bytes]:
    """Poll until *count* values arrived (or the time is up: the caller's assert shows what did)."""
    values: list[bytes] = []
    polls = int(timeout_s / 0.5)
    for _ in range(polls):
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(record.value for record in records)
        if len(values) >= count:
            break
    return values


def _raw_topic(app: faust.App, name: str) -> faust.TopicT:
    """A faust topic of plain bytes: no codec between the test and the broker."""
    return app.topic(
        name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def _group_id() -> str:
    return f"tuneloop-test-{uuid.uuid4().hex[:12]}"


def test_records_produced_are_consumed_in_order(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = new_topic("order")
    _produce(kafka_bootstrap, topic, [f"r{index}".encode() for index in range(5)])

    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    try:
        assert _consume(consumer, count=5) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    finally:
        consumer.close()


def test_a_new_group_member_resumes_after_the_committed_offset(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = new_topic("group")
    _produce(kafka_bootstrap, topic, [f"r{index}".encode() for index in range(6)])
    group = _group_id()

    def member() -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_records=1,
        )

    first = member()
    try:
        assert _consume(first, count=3) == [b"r0", b"r1", b"r2"]
        first.commit()
    finally:
        first.close()

    second = member()
    try:
        assert _consume(second, count=3) == [b"r3", b"r4", b"r5"]
        assert second.committed(TopicPartition(topic, 0)) == 3
    finally:
        second.close()


def test_read_committed_sees_committed_transactions_and_never_aborted_ones(
    kafka_bootstrap: str, new_topic: TopicFactory
) -> None:
    topic = new_topic("txn")
    producer = KafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"tuneloop-test-{uuid.uuid4().hex}"
    )
    try:
        producer.init_transactions()
        for values, commit in (([b"c1", b"c2"], True), ([b"a1"], False), ([b"c3"], True)):
            producer.begin_transaction()
            for value in values:
                producer.send(topic, value=value)
            producer.flush(timeout=30)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close()

    def reader(isolation_level: str) -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            auto_offset_reset="earliest",
            isolation_level=isolation_level,
        )

    committed_reader = reader("read_committed")
    try:
        # c3 comes after the aborted batch, so seeing it means the abort was read past.
        assert _consume(committed_reader, count=3) == [b"c1", b"c2", b"c3"]
    finally:
        committed_reader.close()
    # The aborted record was written: a read_uncommitted reader sees it, so the filter is real.
    uncommitted_reader = reader("read_uncommitted")
    try:
        assert _consume(uncommitted_reader, count=4) == [b"c1", b"c2", b"a1", b"c3"]
    finally:
        uncommitted_reader.close()


@pytest.mark.parametrize("graceful", [True, False], ids=["stopped", "killed"])
def test_a_restarted_broker_keeps_its_records_and_its_address(
    kafka_broker: LocalKafka, new_topic: TopicFactory, graceful: bool
) -> None:
    topic = new_topic("restart")
    bootstrap = kafka_broker.bootstrap
    _produce(bootstrap, topic, [b"before"])

    kafka_broker.restart(graceful=graceful)

    assert kafka_broker.bootstrap == bootstrap
    _produce(bootstrap, topic, [b"after"])
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    try:
        assert _consume(consumer, count=2) == [b"before", b"after"]
    finally:
        consumer.close()


def test_an_external_bootstrap_is_used_as_given_and_nothing_is_started(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNELOOP_KAFKA_BOOTSTRAP", kafka_bootstrap)

    with kafka_for_tests(tmp_path) as endpoint:
        assert endpoint.kind is BrokerKind.EXTERNAL
        assert endpoint.bootstrap == kafka_bootstrap
        assert endpoint.broker is None
    assert not any(tmp_path.iterdir())


async def test_a_faust_agent_round_trip_goes_through_the_broker(
    kafka_bootstrap: str, new_topic: TopicFactory, tmp_path: Path
) -> None:
    app = faust.App(
        f"tuneloop-smoke-{uuid.uuid4().hex[:12]}",
        broker=f"kafka://{kafka_bootstrap}",
        store="memory://",
        datadir=tmp_path / "faust",
        web_enabled=False,
        topic_partitions=1,
        broker_commit_interval=0.5,
    )
    requests = _raw_topic(app, new_topic("faust-in"))
    replies = _raw_topic(app, new_topic("faust-out"))
    received: asyncio.Queue[bytes] = asyncio.Queue()

    @app.agent(requests)
    async def shout(stream):  # type: ignore[no-untyped-def]
        async for value in stream:
            await replies.send(value=value.upper())

    @app.agent(replies)
    async def collect(stream):  # type: ignore[no-untyped-def]
        async for value in stream:
            await received.put(value)

    async with faust_app_running(app, stop_timeout=30):
        await requests.send(value=b"hello broker")
        reply = await asyncio.wait_for(received.get(), timeout=60)

    assert reply == b"HELLO BROKER"


async def test_an_exactly_once_faust_agent_s_output_reaches_read_committed_readers(
    kafka_bootstrap: str, new_topic: TopicFactory, tmp_path: Path
) -> None:
    # One broker suffices because the transaction log has replication factor and min ISR 1.
    app = faust.App(
        f"tuneloop-eos-{uuid.uuid4().hex[:12]}",
        broker=f"kafka://{kafka_bootstrap}",
        store="memory://",
        datadir=tmp_path / "faust",
        web_enabled=False,
        topic_partitions=1,
        processing_guarantee="exactly_once",
        broker_commit_interval=0.5,
    )
    source, sink = new_topic("eos-in"), new_topic("eos-out")
    requests, replies = _raw_topic(app, source), _raw_topic(app, sink)

    @app.agent(requests)
    async def shout(stream):  # type: ignore[no-untyped-def]
        async for value in stream:
            await replies.send(value=value.upper())

    async with faust_app_running(app, stop_timeout=30):
        _produce(kafka_bootstrap, source, [b"one", b"two", b"three"])
        reader = KafkaConsumer(
            sink,
            bootstrap_servers=kafka_bootstrap,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        try:
            # Polling blocks; in a thread it leaves the loop to faust's agent and commits.
            seen = await asyncio.to_thread(_consume, reader, count=3, timeout_s=60)
        finally:
            reader.close()

    assert seen == [b"ONE", b"TWO", b"THREE"]

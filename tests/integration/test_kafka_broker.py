"""The local Kafka broker is a real one: groups, committed offsets, transactions, restarts, faust.

These run against whatever `kafka_bootstrap` provides (see tests/fixtures/kafka.py); the
restart test needs the local broker and skips against an external cluster.
"""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka


def _read_all(consumer: KafkaConsumer, *, expected: int, timeout_ms: int = 10_000) -> list[bytes]:
    values: list[bytes] = []
    for _ in range(20):
        for records in consumer.poll(timeout_ms=timeout_ms // 20).values():
            values.extend(record.value for record in records)
        if len(values) >= expected:
            break
    return values


def test_records_produced_are_consumed_in_order(kafka_bootstrap: str, new_topic: TopicFactory):
    topic = new_topic("order")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for index in range(5):
        producer.send(topic, value=f"r{index}".encode())
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    try:
        assert _read_all(consumer, expected=5) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    finally:
        consumer.close()

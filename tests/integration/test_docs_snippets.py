"""The docs' Python blocks that need Kafka, run on the real broker.

tests/unit/test_docs_code_blocks.py runs every other Python block of docs/ and skips the ones
marked `<!-- needs: kafka -->`; each of those runs here, with the names its comment says it
is given, and the test checks what it did.
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer

from handlers.codec import KafkaRecord, RecordInfo
from handlers.dead_letters import dead_letter_record
from handlers.publishing import KafkaEventPublisher
from orchestrator.settings import KafkaSettings
from tests.fixtures.kafka import TopicFactory
from tests.unit.test_docs_code_blocks import fenced

pytestmark = pytest.mark.kafka

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _block_needing_kafka(page: str) -> str:
    (body,) = [
        body
        for language, body, needs in fenced((DOCS / page).read_text(encoding="utf-8"))
        if language == "python" and "kafka" in needs
    ]
    return body


def _consume_one(bootstrap: str, topic: str) -> Any:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=20_000
    )
    try:
        return next(iter(consumer))
    finally:
        consumer.close()


async def test_the_dead_letter_replay_sends_the_original_record_back_where_it_came_from(
    kafka_bootstrap: str, new_topic: TopicFactory
):
    origin, dead_letters = new_topic("replay-origin"), new_topic("replay-dlq")
    original = KafkaRecord(
        value=b'{"model_id": "chat"}',
        headers=(("ce_id", b"drift-7"), ("ce_source", b"/monitors/chat"), ("traceparent", b"00-a")),
        key=b"chat",
    )
    dead = dead_letter_record(
        original,
        origin=RecordInfo(origin, 0, 41),
        code="attribute.missing",
        message="required 'type' is missing",
        at=datetime(2026, 6, 1, 12, 0, 3, tzinfo=UTC),
    )
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        producer.send(dead_letters, value=dead.value, key=dead.key, headers=list(dead.headers))
        producer.flush(timeout=30)
    finally:
        producer.close()
    record = _consume_one(kafka_bootstrap, dead_letters)

    code = compile(
        _block_needing_kafka("dead-letters.md"),
        "dead-letters.md",
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
    )
    async with KafkaEventPublisher(KafkaSettings(bootstrap=kafka_bootstrap)) as publisher:
        await eval(code, {"record": record, "publisher": publisher})

    replayed = _consume_one(kafka_bootstrap, origin)
    assert replayed.value == b'{"model_id": "chat"}'
    assert replayed.key == b"chat"
    assert list(replayed.headers) == [
        ("ce_id", b"drift-7"),
        ("ce_source", b"/monitors/chat"),
        ("traceparent", b"00-a"),
    ]

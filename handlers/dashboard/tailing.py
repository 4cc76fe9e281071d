"""The dashboard's feed from Kafka: the audit, output and dead-letter topics, tailed.

Run as a task of the worker's faust App (`install_dashboard` registers it). It reads with its
own consumer outside any group, so it commits nothing and moves no offset of the worker's
group: it only reads. On start it goes back `history` records on every partition, so a
dashboard opened after a restart shows the recent past, then follows new records as they
come.

The audit topic is the source of the decisions page, so the page shows every decision
record any worker of the group wrote (the why-not records included), not only this
worker's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord

from handlers.codec import KafkaRecord, decode_record
from handlers.dashboard.board import Board, DeadLetterRow
from handlers.dead_letters import original_headers, read_reason
from handlers.publishing import aiokafka_options
from orchestrator.errors import InvalidEventError
from orchestrator.ledger import DECISION_EVENT_TYPE
from orchestrator.settings import KafkaSettings

log = structlog.get_logger("tuneloop.dashboard")

MAX_EVENT_BYTES = 10_000_000
"""What the feed decodes at most: larger records are skipped (the intake refuses them)."""
TOPICS_RETRY_SECONDS = 0.5
"""How often the feed looks again for topics that do not exist yet."""


async def tail_topics(kafka: KafkaSettings, board: Board, *, history: int) -> None:
    """Feed *board* from the audit, output and DLQ topics of *kafka*, until cancelled."""
    readers: dict[str, Callable[[ConsumerRecord[Any, Any]], None]] = {
        kafka.topic_audit: lambda record: _read_decision(board, record),
        kafka.topic_out: lambda record: _read_output(board, record),
        kafka.topic_dlq: lambda record: _read_dead_letter(board, record),
    }
    # Committed records only: the intake writes dead letters in transactions, and an aborted
    # one's letters (a killed worker's batch, written again after the restart) are not letters.
    consumer = AIOKafkaConsumer(
        **aiokafka_options(kafka),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        await _assign_recent(consumer, tuple(readers), history=history)
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            for partition, records in batches.items():
                for record in records:
                    try:
                        readers[partition.topic](record)
                    except Exception:  # one odd record must not blind the dashboard
                        log.exception("dashboard_record_skipped", topic=partition.topic)
    finally:
        await consumer.stop()


async def _assign_recent(
    consumer: AIOKafkaConsumer, topics: tuple[str, ...], *, history: int
) -> None:
    """Subscribe to every partition of *topics* (waiting until they exist), *history* back.

    Without a group, aiokafka assigns every partition of a subscribed topic to this consumer
    (and a partition added later, read from its start)."""
    wanted = set(topics)
    consumer.subscribe(topics=sorted(wanted))
    while {partition.topic for partition in consumer.assignment()} != wanted:
        await asyncio.sleep(TOPICS_RETRY_SECONDS)
    partitions = sorted(consumer.assignment())
    ends = await consumer.end_offsets(partitions)
    starts = await consumer.beginning_offsets(partitions)
    for partition in partitions:
        consumer.seek(partition, max(starts[partition], ends[partition] - history))
    log.info("dashboard_feed_started", topics=sorted(wanted))


def _events(record: ConsumerRecord[Any, Any]) -> Any:
    kafka_record = KafkaRecord(value=record.value, headers=tuple(record.headers), key=record.key)
    try:
        return decode_record(kafka_record, max_event_bytes=MAX_EVENT_BYTES)
    except InvalidEventError:
        return ()


def _read_decision(board: Board, record: ConsumerRecord[Any, Any]) -> None:
    for event in _events(record):
        if event.type == DECISION_EVENT_TYPE and isinstance(event.data, dict):
            board.add_decision(event.data, event_id=event.id)


def _read_output(board: Board, record: ConsumerRecord[Any, Any]) -> None:
    for event in _events(record):
        if event.type.startswith("io.tuneloop.finetune."):
            board.add_job_event(event)


def _read_dead_letter(board: Board, record: ConsumerRecord[Any, Any]) -> None:
    headers = tuple((name, value or b"") for name, value in record.headers)
    try:
        reason = read_reason(headers)
    except (KeyError, ValueError):
        return  # not written by tuneloop: nothing to explain
    board.add_dead_letter(
        DeadLetterRow(
            code=reason.code,
            message=reason.message,
            origin=f"{reason.topic}/{reason.partition}@{reason.offset}",
            at=reason.at,
            position=f"{record.partition}-{record.offset}",
            key=record.key,
            value=record.value,
            headers=original_headers(headers),
        )
    )

"""`run_handoff`: the hand-off process, wired from settings (what `tuneloop handoff` runs).

One aiokafka consumer in its own group (`TUNELOOP_HANDOFF_GROUP_ID`) on the completion
topic, with manual commits: a record is committed once `HandoffService.accept` has made
what it asks durable in the ledger, so a hand-off killed at any point reads again at most
the record it was handling, and the ledger makes that a duplicate. Records that are no
CloudEvent, or events that fail their type's schema, are logged and committed: the topic is
tuneloop's own, and the workers' intake already dead-letters bad input upstream.

The hand-off needs no training backend, so it is wired here rather than in `handlers/app.py`
(which wires workers and is the only module that imports `runtimes/`). Run one replica: the
ledger has one writer (docs/inference.md, "Running it").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import structlog
from aiokafka import AIOKafkaConsumer

from handlers.codec import KafkaRecord, decode_record
from handlers.handoff.ledger_topic import KafkaLedger
from handlers.handoff.service import HandoffService
from handlers.publishing import KafkaEventPublisher, aiokafka_options
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import ConfigError, InvalidEventError, TransientBackendError
from orchestrator.events import CloudEvent
from orchestrator.handoff.steps import RetryPolicy
from orchestrator.settings import Settings
from orchestrator.vocabulary.registry import SchemaRegistry

log = structlog.get_logger("tuneloop.handoff")

KAFKA_RETRY = RetryPolicy(first_delay=1.0, max_delay=30.0, report_after=1)
"""How often an event whose ledger write Kafka did not acknowledge is taken again."""


async def run_handoff(
    settings: Settings,
    *,
    stopping: asyncio.Event,
    clock: Clock | None = None,
    on_ready: Callable[[HandoffService], Any] | None = None,
) -> None:
    """Hand promoted adapters to the configured servers until *stopping* is set.

    Args:
        settings: `settings.handoff` names the targets; `settings.kafka` the brokers.
        stopping: set it to stop (the CLI sets it on SIGTERM and SIGINT).
        clock: the time of published events; the system's by default.
        on_ready: called with the service once the ledger is read and the consumer joined.

    Raises:
        ConfigError: no target is configured.
        TransientBackendError: Kafka did not answer at start.
    """
    handoff = settings.handoff
    if not handoff.targets:
        raise ConfigError("TUNELOOP_HANDOFF_TARGETS names no server to hand adapters to")
    topic_in = handoff.topic_in or settings.kafka.topic_out
    topic_out = handoff.topic_out or settings.kafka.topic_out
    registry = SchemaRegistry.builtin()
    async with (
        KafkaEventPublisher(settings.kafka, default_topic=topic_out) as publisher,
        httpx.AsyncClient(timeout=handoff.request_timeout) as http,
    ):
        service = HandoffService(
            handoff,
            ledger_topic=KafkaLedger(
                settings.kafka, topic=handoff.topic_ledger, publisher=publisher
            ),
            publisher=publisher,
            http=http,
            clock=clock or SystemClock(),
            topic_out=topic_out,
        )
        await service.start()
        consumer = AIOKafkaConsumer(
            topic_in,
            group_id=handoff.group_id,
            enable_auto_commit=False,
            # A new group starts at the beginning: a completion published while the hand-off
            # was being deployed is not lost, and the ledger keeps older ones from repeating.
            auto_offset_reset="earliest",
            client_id="tuneloop-handoff",
            **aiokafka_options(settings.kafka),
        )
        await consumer.start()
        try:
            log.info(
                "handoff_consuming",
                topic=topic_in,
                group=handoff.group_id,
                targets={model: list(urls) for model, urls in handoff.targets.items()},
            )
            if on_ready is not None:
                on_ready(service)
            while not stopping.is_set():
                batches = await consumer.getmany(timeout_ms=500)
                for partition, records in batches.items():
                    for record in records:
                        if stopping.is_set():
                            return
                        for event in _events(record, registry, settings.kafka.max_event_bytes):
                            await _accept(service, event, stopping)
                        await consumer.commit({partition: record.offset + 1})
        finally:
            await consumer.stop()
            await service.stop()


def _events(record: Any, registry: SchemaRegistry, max_event_bytes: int) -> list[CloudEvent]:
    kafka_record = KafkaRecord(value=record.value, headers=tuple(record.headers), key=record.key)
    try:
        events = decode_record(kafka_record, max_event_bytes=max_event_bytes)
        for event in events:
            if registry.knows(event.type):
                registry.validate(event)
    except InvalidEventError as exc:
        log.warning(
            "handoff_record_skipped",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            code=exc.code,
            error=exc.message,
        )
        return []
    return list(events)


async def _accept(service: HandoffService, event: CloudEvent, stopping: asyncio.Event) -> None:
    failures = 0
    while True:
        try:
            await service.accept(event)
            return
        except TransientBackendError as exc:
            failures += 1
            log.warning(
                "handoff_accept_retrying", event_id=event.id, attempts=failures, error=str(exc)
            )
            if stopping.is_set():
                raise
            await asyncio.sleep(KAFKA_RETRY.delay(failures))

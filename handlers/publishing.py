"""`KafkaEventPublisher`: tuneloop's own CloudEvents onto Kafka (the `EventPublisher` port).

Wired by the composition root (`handlers/app.py`) into whatever announces job outcomes and
decisions, and used by `tuneloop emit` to send a producer's event. Binary mode by default
(`TUNELOOP_KAFKA_OUTPUT_MODE`), `partitionkey` as the record key, through the codec.

Durability: the producer is idempotent with `acks=all`, and `publish` returns only once the
broker has acknowledged the record, so a caller that records "published" afterwards never
records an event that is not on the topic. A retried publish writes the same event id again;
consumers dedupe on (source, id).

Uses aiokafka directly rather than a faust topic: the publisher is called from places that
are not faust agents (the job watcher, the CLI), where faust's send-on-commit buffering would
not apply and would only hide when the send happened.
"""

from __future__ import annotations

import ssl
from types import TracebackType
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from handlers.codec import EncodingMode, KafkaRecord, encode_event
from orchestrator.errors import TransientBackendError
from orchestrator.events import CloudEvent
from orchestrator.settings import KafkaSettings, OutputMode, SecurityProtocol

log = structlog.get_logger("tuneloop.publishing")

_MODES = {OutputMode.BINARY: EncodingMode.BINARY, OutputMode.STRUCTURED: EncodingMode.STRUCTURED}


def tls_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """A client TLS context: the configured CA (or the system's) and, for mTLS, our cert."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=kafka.tls_ca_file)
    if kafka.tls_cert_file is not None:
        context.load_cert_chain(kafka.tls_cert_file, kafka.tls_key_file)
    return context


RECORD_HEADROOM_BYTES = 64 * 1024
"""Room beyond `max_event_bytes` for the headers tuneloop adds to a record it writes (a
forward's origin, a dead letter's reason)."""


PRODUCE_BATCH_BYTES = 256 * 1024
"""How many bytes of records a worker's producers gather per partition into one batch.

aiokafka (and faust's producer, built on it) keeps one open batch per partition, of at most
`max_batch_size` bytes (16 KiB by default), and a `send` that finds it full waits until the
sender has taken it, which is after the partition's previous produce request was answered.
So at the default a busy partition moved 16 KiB per round trip to the broker. Measured in
`bench/endtoend.py` on the 2-core machine, 1,000 events/s (the audit topic has one
partition; stage 1 commits batches of up to 500 forwards): stage 1 took ~600 ms to send a
500-event batch and fell behind, p50 event -> TrainJob 5.4 s; with 256 KiB, ~200 ms and
1.2 s. It stays below the brokers' default `message.max.bytes` (1 MiB), and
`produce_batch_bytes` keeps it within the event size limit, which a broker must accept."""


def produce_batch_bytes(kafka: KafkaSettings) -> int:
    """`PRODUCE_BATCH_BYTES`, or less where the largest record the settings allow is smaller:
    a broker set up for smaller records may refuse a larger batch."""
    return min(PRODUCE_BATCH_BYTES, kafka.max_event_bytes + RECORD_HEADROOM_BYTES)


def aiokafka_options(kafka: KafkaSettings) -> dict[str, Any]:
    """Connection options for an aiokafka client from the settings (TLS, SASL)."""
    options: dict[str, Any] = {
        "bootstrap_servers": [host.strip() for host in kafka.bootstrap.split(",")],
        "security_protocol": str(kafka.security_protocol),
    }
    if kafka.uses_tls:
        options["ssl_context"] = tls_context(kafka)
    if kafka.security_protocol in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL):
        options["sasl_mechanism"] = str(kafka.sasl_mechanism)
        options["sasl_plain_username"] = kafka.sasl_username
        options["sasl_plain_password"] = kafka.sasl_password
    return options


class KafkaEventPublisher:
    """Publishes CloudEvents to Kafka; use as `async with KafkaEventPublisher(kafka) as p`."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        mode: EncodingMode | None = None,
        default_topic: str | None = None,
    ) -> None:
        self._kafka = kafka
        self._mode = mode if mode is not None else _MODES[kafka.output_mode]
        self._default_topic = default_topic or kafka.topic_out
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect to the brokers.

        Raises:
            TransientBackendError: no broker answered; try again later.
        """
        producer = AIOKafkaProducer(
            acks="all",
            enable_idempotence=True,
            # A record at the intake's size limit must fit, with its headers, on the way out.
            max_request_size=self._kafka.max_event_bytes + RECORD_HEADROOM_BYTES,
            client_id="tuneloop-publisher",
            **aiokafka_options(self._kafka),
        )
        try:
            await producer.start()
        except KafkaError as exc:
            await producer.stop()
            raise TransientBackendError(f"cannot reach Kafka at {self._kafka.bootstrap}") from exc
        self._producer = producer

    async def stop(self) -> None:
        """Flush what is pending and disconnect."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def __aenter__(self) -> KafkaEventPublisher:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def publish(self, event: CloudEvent, *, topic: str | None = None) -> None:
        """Send *event* and wait for the broker's acknowledgement.

        Raises:
            TransientBackendError: the broker did not acknowledge; publishing again is safe.
        """
        await self.publish_record(encode_event(event, mode=self._mode), topic=topic)
        log.info("event_published", event_id=event.id, type=event.type, topic=topic)

    async def publish_record(self, record: KafkaRecord, *, topic: str | None = None) -> None:
        """Send an already encoded record (a batch, a replayed dead letter) and wait for it."""
        if self._producer is None:
            raise RuntimeError("start the publisher (or use `async with`) before publishing")
        target = topic or self._default_topic
        try:
            await self._producer.send_and_wait(
                target, value=record.value, key=record.key, headers=list(record.headers)
            )
        except KafkaError as exc:
            raise TransientBackendError(f"Kafka did not acknowledge a record on {target}") from exc

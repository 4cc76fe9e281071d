"""Interop with the CloudEvents SDK on the real broker: someone else's binding is the oracle.

Records that the SDK's Kafka binding writes are produced to a topic, consumed, and decoded
by `handlers.codec.decode_record`; what `handlers.codec.encode_event` writes is produced,
consumed, and read by the SDK. Both directions, binary and structured mode. The expected
values are the attributes and data this file hands to the one side, written out here, never
what our codec makes of them.

The SDK (cloudevents 2.x) ships two Kafka bindings: `cloudevents.core.bindings.kafka`, the
current one, and `cloudevents.v1.kafka`, the 1.x API kept for compatibility. Both are tried.
Where our codec departs from the SDK (docs/events.md, "tuneloop and the CloudEvents SDK"),
a test below pins the departure down, so that it stays deliberate.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest
from cloudevents.core.bindings import kafka as sdk_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as SdkEvent
from cloudevents.v1 import kafka as legacy_kafka
from cloudevents.v1.http import CloudEvent as LegacyEvent
from kafka import KafkaConsumer, KafkaProducer

from handlers.codec import EncodingMode, KafkaRecord, decode_record, encode_event
from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.kafka

MAX_EVENT_BYTES = 1 << 20
TIME = datetime(2026, 6, 1, 11, 0, 0, 250_000, tzinfo=UTC)
TIME_TEXT = "2026-06-01T11:00:00.25Z"
KEY = "chat"
DATA = {"model_id": "chat", "value": 0.17, "labels": ["drift", "grün"], "window": {"rows": 48210}}
BYTES = b"\x00\x01\xfe\xff not UTF-8"
"""Data of a non-JSON content type: raw bytes, deliberately not valid UTF-8."""

ATTRIBUTES = {
    "specversion": "1.0",
    "id": "drift-0042",
    "source": "/monitors/chat",
    "type": "io.tuneloop.drift.detected.v1",
    "subject": "chat",
    "dataschema": "https://schemas.example.com/drift/v1.json",
    "datacontenttype": "application/json",
    "region": "eu-west-1",
    "partitionkey": KEY,
}
"""One event's attributes as the spec names them, with an extension and the partition key."""


def _ours(**changes: Any) -> CloudEvent:
    """The event of ATTRIBUTES and DATA as tuneloop's value, written out by hand."""
    fields: dict[str, Any] = {
        "id": "drift-0042",
        "source": "/monitors/chat",
        "type": "io.tuneloop.drift.detected.v1",
        "subject": "chat",
        "time": TIME,
        "datacontenttype": "application/json",
        "dataschema": "https://schemas.example.com/drift/v1.json",
        "data": DATA,
        "extensions": MappingProxyType({"region": "eu-west-1", "partitionkey": KEY}),
    }
    return CloudEvent(**(fields | changes))


def _through_the_broker(
    bootstrap: str, topic: str, *, headers: list[tuple[str, bytes]], key: Any, value: Any
) -> KafkaRecord:
    """Produce one record, consume it from the start of the topic, return it as consumed."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send(
            topic,
            value=value.encode() if isinstance(value, str) else value,
            key=key.encode() if isinstance(key, str) else key,
            headers=headers,
        )
        producer.flush(timeout=30)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=20_000
    )
    try:
        record = next(iter(consumer))
    finally:
        consumer.close()
    return KafkaRecord(value=record.value, headers=tuple(record.headers), key=record.key)


def _sdk_message(record: KafkaRecord) -> sdk_kafka.KafkaMessage:
    return sdk_kafka.KafkaMessage(
        headers=dict(record.headers), key=record.key, value=record.value or b""
    )


# --------------------------------------------------------------- the SDK writes, we read


@pytest.mark.parametrize(
    "write", [sdk_kafka.to_binary, sdk_kafka.to_structured], ids=["binary", "structured"]
)
def test_a_record_the_sdk_writes_decodes_to_the_same_event(
    write, kafka_bootstrap: str, new_topic: TopicFactory
):
    sdk_event = SdkEvent(attributes={**ATTRIBUTES, "time": TIME}, data=DATA)
    message = write(sdk_event, JSONFormat())

    record = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-sdk"),
        headers=list(message.headers.items()),
        key=message.key,
        value=message.value,
    )

    assert decode_record(record, max_event_bytes=MAX_EVENT_BYTES) == (_ours(),)


@pytest.mark.parametrize(
    "write", [sdk_kafka.to_binary, sdk_kafka.to_structured], ids=["binary", "structured"]
)
def test_bytes_the_sdk_writes_decode_to_the_same_bytes(
    write, kafka_bootstrap: str, new_topic: TopicFactory
):
    attributes = {**ATTRIBUTES, "time": TIME, "datacontenttype": "application/octet-stream"}
    message = write(SdkEvent(attributes=attributes, data=BYTES), JSONFormat())

    record = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-sdk-bytes"),
        headers=list(message.headers.items()),
        key=message.key,
        value=message.value,
    )

    expected = _ours(datacontenttype="application/octet-stream", data=BYTES)
    assert decode_record(record, max_event_bytes=MAX_EVENT_BYTES) == (expected,)


def test_a_binary_record_the_legacy_sdk_writes_decodes_to_the_same_event(
    kafka_bootstrap: str, new_topic: TopicFactory
):
    legacy_event = LegacyEvent({**ATTRIBUTES, "time": TIME_TEXT}, DATA)
    message = legacy_kafka.to_binary(legacy_event)
    # The 1.x binding moves partitionkey to the record key and leaves it out of the headers;
    # our decoder takes it back from the key, so the event is the same.
    assert "ce_partitionkey" not in message.headers

    record = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-legacy"),
        headers=list(message.headers.items()),
        key=message.key,
        value=message.value,
    )

    assert decode_record(record, max_event_bytes=MAX_EVENT_BYTES) == (_ours(),)


def test_a_structured_record_of_the_legacy_sdk_is_refused_as_not_a_cloudevent(
    kafka_bootstrap: str, new_topic: TopicFactory
):
    """A departure: the 1.x `to_structured` labels the record with the data's content type
    (application/json), so by the binding's rule it is a binary-mode record, and one with no
    ce_ headers is no CloudEvent. We follow the spec and dead-letter it."""
    message = legacy_kafka.to_structured(LegacyEvent({**ATTRIBUTES, "time": TIME_TEXT}, DATA))
    assert message.headers == {"content-type": b"application/json"}

    record = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-legacy-structured"),
        headers=list(message.headers.items()),
        key=message.key,
        value=message.value,
    )

    with pytest.raises(InvalidEventError) as refused:
        decode_record(record, max_event_bytes=MAX_EVENT_BYTES)
    assert refused.value.code == "record.not_cloudevent"


# --------------------------------------------------------------- we write, the SDK reads


@pytest.mark.parametrize(
    ("mode", "read"),
    [
        (EncodingMode.BINARY, sdk_kafka.from_binary),
        (EncodingMode.STRUCTURED, sdk_kafka.from_structured),
    ],
    ids=["binary", "structured"],
)
def test_what_tuneloop_publishes_the_sdk_reads_as_the_same_event(
    mode, read, kafka_bootstrap: str, new_topic: TopicFactory
):
    record = encode_event(_ours(), mode=mode)

    consumed = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-ours"),
        headers=list(record.headers),
        key=record.key,
        value=record.value,
    )
    sdk_event = read(_sdk_message(consumed), JSONFormat())

    assert sdk_event.get_attributes() == {**ATTRIBUTES, "time": TIME}
    assert sdk_event.get_data() == DATA


@pytest.mark.parametrize(
    ("mode", "read"),
    [
        (EncodingMode.BINARY, sdk_kafka.from_binary),
        (EncodingMode.STRUCTURED, sdk_kafka.from_structured),
    ],
    ids=["binary", "structured"],
)
def test_bytes_tuneloop_publishes_the_sdk_reads_as_the_same_bytes(
    mode, read, kafka_bootstrap: str, new_topic: TopicFactory
):
    record = encode_event(_ours(datacontenttype="application/octet-stream", data=BYTES), mode=mode)

    consumed = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-ours-bytes"),
        headers=list(record.headers),
        key=record.key,
        value=record.value,
    )
    sdk_event = read(_sdk_message(consumed), JSONFormat())

    assert sdk_event.get_datacontenttype() == "application/octet-stream"
    assert sdk_event.get_data() == BYTES


def test_what_tuneloop_publishes_in_binary_mode_the_legacy_sdk_reads(
    kafka_bootstrap: str, new_topic: TopicFactory
):
    record = encode_event(_ours(), mode=EncodingMode.BINARY)

    consumed = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-ours-legacy"),
        headers=list(record.headers),
        key=record.key,
        value=record.value,
    )
    message = legacy_kafka.KafkaMessage(
        headers=dict(consumed.headers), key=consumed.key, value=consumed.value or b""
    )
    legacy_event = legacy_kafka.from_binary(message)

    attributes = dict(legacy_event.get_attributes())
    assert datetime.fromisoformat(attributes.pop("time")) == TIME
    # The 1.x binding gives the record key back as it came: bytes.
    assert attributes == {**ATTRIBUTES, "partitionkey": KEY.encode()}
    assert legacy_event.get_data() == DATA


# ------------------------------------------------- where the codec is stricter than the SDK


def _binary_headers(**changes: bytes | None) -> list[tuple[str, bytes]]:
    """ATTRIBUTES as binary-mode headers, written out by hand; a None change drops a header."""
    headers = {f"ce_{name}": str(value).encode() for name, value in ATTRIBUTES.items()}
    headers["content-type"] = headers.pop("ce_datacontenttype")
    headers["ce_time"] = TIME_TEXT.encode()
    headers.update(changes)
    return [(name, value) for name, value in headers.items() if value is not None]


@pytest.mark.parametrize(
    ("headers", "value", "what_the_sdk_reads", "our_code"),
    [
        (_binary_headers(), b"{not json", {"data": "{not json"}, "data.invalid_json"),
        (
            _binary_headers(ce_region=None, ce_Region=b"eu-west-1"),
            b"{}",
            {"region": "eu-west-1"},
            "attribute.invalid_name",
        ),
    ],
    ids=["data-not-the-json-it-claims", "upper-case-header-name"],
)
def test_a_record_the_sdk_reads_leniently_is_refused_with_a_code(
    headers, value, what_the_sdk_reads, our_code, kafka_bootstrap: str, new_topic: TopicFactory
):
    consumed = _through_the_broker(
        kafka_bootstrap, new_topic("interop-strict"), headers=headers, key=KEY, value=value
    )

    sdk_event = sdk_kafka.from_binary(_sdk_message(consumed), JSONFormat())
    read = {"data": sdk_event.get_data(), **sdk_event.get_attributes()}
    assert {name: read[name] for name in what_the_sdk_reads} == what_the_sdk_reads
    with pytest.raises(InvalidEventError) as refused:
        decode_record(consumed, max_event_bytes=MAX_EVENT_BYTES)
    assert refused.value.code == our_code


def test_an_event_without_time_keeps_none_where_the_sdk_makes_one_up(
    kafka_bootstrap: str, new_topic: TopicFactory
):
    consumed = _through_the_broker(
        kafka_bootstrap,
        new_topic("interop-no-time"),
        headers=_binary_headers(ce_time=None),
        key=KEY,
        value=b"{}",
    )

    before = datetime.now(UTC)
    sdk_time = sdk_kafka.from_binary(_sdk_message(consumed), JSONFormat()).get_time()
    assert sdk_time is not None
    assert sdk_time >= before
    (event,) = decode_record(consumed, max_event_bytes=MAX_EVENT_BYTES)
    assert event.time is None

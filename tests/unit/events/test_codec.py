"""The Kafka binding: round trips in both modes, the mode rule, the attribute rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from types import MappingProxyType, SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.codec import (
    EncodingMode,
    KafkaRecord,
    consumed,
    decode_record,
    encode_batch,
    encode_event,
    mode_of,
    parse_rfc3339,
)
from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent, ExtensionValue

LIMIT = 1_048_576

uri_text = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~:/?#[]@!$&'()*+,;=",
    min_size=1,
    max_size=40,
)
any_text = st.text(min_size=1, max_size=40)  # full unicode, including astral planes
extension_names = st.from_regex(r"[a-z][a-z0-9]{0,19}", fullmatch=True).filter(
    lambda name: (
        name
        not in {
            "id",
            "source",
            "specversion",
            "type",
            "subject",
            "time",
            "datacontenttype",
            "dataschema",
            "data",
        }
    )
)
extension_values = st.one_of(any_text, st.integers(-(2**31), 2**31 - 1), st.booleans())
times = st.datetimes(
    min_value=datetime(1970, 1, 1),
    max_value=datetime(9999, 1, 1),
    timezones=st.sampled_from(
        [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
    ),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def cloud_events(draw: st.DrawFn) -> CloudEvent:
    json_data = draw(st.booleans())
    if json_data:
        content_type = draw(
            st.sampled_from([None, "application/json", "application/vnd.x+json; charset=utf-8"])
        )
        data = draw(json_values)
    else:
        content_type = draw(st.sampled_from(["application/octet-stream", "image/png"]))
        data = draw(st.binary(min_size=1, max_size=64))
    extensions: dict[str, ExtensionValue] = draw(
        st.dictionaries(extension_names, extension_values, max_size=4)
    )
    return CloudEvent(
        id=draw(any_text),
        source=draw(uri_text),
        type=draw(any_text),
        subject=draw(st.none() | any_text),
        time=draw(st.none() | times),
        datacontenttype=content_type,
        dataschema=draw(st.none() | uri_text.map(lambda text: "https:" + text)),
        data=data,
        extensions=MappingProxyType(extensions),
    )


def as_text(value: ExtensionValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def comparable(event: CloudEvent, *, text_extensions: bool) -> dict[str, object]:
    extensions = dict(event.extensions)
    if text_extensions:
        extensions = {name: as_text(value) for name, value in extensions.items()}
    if "partitionkey" in extensions:
        extensions["partitionkey"] = as_text(extensions["partitionkey"])
    data = event.data
    return {
        "id": event.id,
        "source": event.source,
        "type": event.type,
        "subject": event.subject,
        "time": event.time,
        "utcoffset": None if event.time is None else event.time.utcoffset(),
        "datacontenttype": event.datacontenttype,
        "dataschema": event.dataschema,
        # a JSON null and no data are the same thing on the wire
        "data": data,
        "extensions": extensions,
    }


@settings(max_examples=60, deadline=None)
@given(cloud_events())
def test_binary_mode_round_trip_keeps_every_attribute(event: CloudEvent) -> None:
    record = encode_event(event, mode=EncodingMode.BINARY)
    (decoded,) = decode_record(record, max_event_bytes=LIMIT)
    assert comparable(decoded, text_extensions=True) == comparable(event, text_extensions=True)


@settings(max_examples=60, deadline=None)
@given(cloud_events())
def test_structured_mode_round_trip_keeps_every_attribute_and_extension_types(
    event: CloudEvent,
) -> None:
    record = encode_event(event, mode=EncodingMode.STRUCTURED)
    (decoded,) = decode_record(record, max_event_bytes=LIMIT)
    expected = comparable(event, text_extensions=False)
    assert comparable(decoded, text_extensions=False) == expected


@settings(max_examples=20, deadline=None)
@given(st.lists(cloud_events(), min_size=1, max_size=5))
def test_batch_round_trip_keeps_order(events: list[CloudEvent]) -> None:
    decoded = decode_record(encode_batch(events), max_event_bytes=LIMIT)
    assert [comparable(e, text_extensions=False) for e in decoded] == [
        comparable(e, text_extensions=False) for e in events
    ]


def test_partitionkey_becomes_the_record_key_and_stays_in_the_event() -> None:
    event = CloudEvent(
        id="1", source="/s", type="t", extensions=MappingProxyType({"partitionkey": "chat-7b"})
    )
    for mode in (EncodingMode.BINARY, EncodingMode.STRUCTURED):
        record = encode_event(event, mode=mode)
        assert record.key == b"chat-7b"
        (decoded,) = decode_record(record, max_event_bytes=LIMIT)
        assert decoded.extensions["partitionkey"] == "chat-7b"


def test_record_key_fills_partitionkey_when_the_event_has_none() -> None:
    record = KafkaRecord(
        value=None,
        headers=binary_headers(),
        key=b"model-a",
    )
    (event,) = decode_record(record, max_event_bytes=LIMIT)
    assert event.extensions["partitionkey"] == "model-a"


def test_binary_mode_puts_partitionkey_in_a_header_too() -> None:
    event = CloudEvent(
        id="1", source="/s", type="t", extensions=MappingProxyType({"partitionkey": "k"})
    )
    headers = dict(encode_event(event).headers)
    assert headers["ce_partitionkey"] == b"k"


def binary_headers(**overrides: str | None) -> tuple[tuple[str, bytes], ...]:
    attributes: dict[str, str | None] = {
        "ce_specversion": "1.0",
        "ce_id": "e-1",
        "ce_source": "/monitors/evidently",
        "ce_type": "io.tuneloop.drift.detected.v1",
    }
    attributes.update(overrides)
    return tuple((name, value.encode()) for name, value in attributes.items() if value is not None)


@pytest.mark.parametrize(
    ("content_type", "mode"),
    [
        (None, EncodingMode.BINARY),
        ("application/json", EncodingMode.BINARY),
        ("application/cloudevents+json", EncodingMode.STRUCTURED),
        ("Application/CloudEvents+JSON; charset=UTF-8", EncodingMode.STRUCTURED),
        ("application/cloudevents-batch+json", EncodingMode.BATCH),
        ("application/cloudevents+avro", EncodingMode.STRUCTURED),
    ],
)
def test_the_content_type_alone_chooses_the_mode(content_type: str | None, mode: EncodingMode):
    assert mode_of(content_type) is mode


def test_structured_record_with_ce_headers_is_read_as_structured() -> None:
    envelope = {"specversion": "1.0", "id": "from-body", "source": "/s", "type": "t"}
    record = KafkaRecord(
        value=json.dumps(envelope).encode(),
        headers=(
            ("content-type", b"application/cloudevents+json"),
            ("ce_id", b"from-header"),
        ),
    )
    (event,) = decode_record(record, max_event_bytes=LIMIT)
    assert event.id == "from-body"


def test_binary_json_data_is_parsed_and_other_data_kept_as_bytes() -> None:
    json_record = KafkaRecord(
        value=b'{"model_id": "m"}',
        headers=(*binary_headers(), ("content-type", b"application/json")),
    )
    bytes_record = KafkaRecord(
        value=b"\x00\xff", headers=(*binary_headers(), ("content-type", b"application/x-bin"))
    )
    assert decode_record(json_record, max_event_bytes=LIMIT)[0].data == {"model_id": "m"}
    assert decode_record(bytes_record, max_event_bytes=LIMIT)[0].data == b"\x00\xff"


def test_producer_time_keeps_its_offset() -> None:
    record = KafkaRecord(value=None, headers=binary_headers(ce_time="2026-03-01T10:00:00.5+02:00"))
    (event,) = decode_record(record, max_event_bytes=LIMIT)
    assert event.time == datetime(2026, 3, 1, 8, 0, 0, 500000, tzinfo=UTC)
    assert event.time is not None
    assert event.time.utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        (binary_headers(ce_id=None), "attribute.missing"),
        (binary_headers(ce_source=None), "attribute.missing"),
        (binary_headers(ce_type=None), "attribute.missing"),
        (binary_headers(ce_specversion=None), "attribute.missing"),
        (binary_headers(ce_specversion="0.3"), "attribute.unsupported_specversion"),
        (binary_headers(ce_id=""), "attribute.invalid"),
        (binary_headers(ce_source="has space"), "attribute.invalid"),
        (binary_headers(ce_dataschema="relative/path"), "attribute.invalid"),
        (binary_headers(ce_time="2026-03-01 10:00:00"), "attribute.invalid_time"),
        (binary_headers(ce_time="2026-03-01T10:00:00"), "attribute.invalid_time"),
        (binary_headers(ce_time="2026-02-30T10:00:00Z"), "attribute.invalid_time"),
        (binary_headers(ce_expirytime="tomorrow"), "attribute.invalid_time"),
        (binary_headers(ce_Model="x"), "attribute.invalid_name"),
        (binary_headers(**{"ce_model-id": "x"}), "attribute.invalid_name"),
        (binary_headers(ce_data="x"), "attribute.invalid_name"),
        ((("x-other", b"1"),), "record.not_cloudevent"),
        ((), "record.not_cloudevent"),
        ((*binary_headers(), ("ce_id", b"e-2")), "header.duplicated"),
        ((*binary_headers(), ("ce_subject", b"\xff\xfe")), "header.not_utf8"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_attribute_rules_refuse_bad_binary_records(headers, code) -> None:
    with pytest.raises(InvalidEventError) as caught:
        decode_record(KafkaRecord(value=None, headers=headers), max_event_bytes=LIMIT)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("envelope", "code"),
    [
        ('{"specversion":"1.0","id":"1","source":"/s"', "structured.invalid_json"),
        ("[1]", "structured.not_object"),
        (
            '{"specversion":"1.0","id":"1","id":"2","source":"/s","type":"t"}',
            "structured.invalid_json",
        ),
        ('{"specversion":"1.0","id":1,"source":"/s","type":"t"}', "attribute.invalid"),
        ('{"specversion":"1.0","id":"1","source":"/s","type":"t","x":1.5}', "attribute.invalid"),
        (
            '{"specversion":"1.0","id":"1","source":"/s","type":"t","x":NaN}',
            "structured.invalid_json",
        ),
        (
            '{"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data_base64":"AA=="}',
            "data.conflict",
        ),
        (
            '{"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"@@"}',
            "data.conflict",
        ),
        (
            '{"specversion":"1.0","id":"1","source":"/s","type":"t","Bad":"x"}',
            "attribute.invalid_name",
        ),
    ],
)
def test_attribute_rules_refuse_bad_structured_records(envelope: str, code: str) -> None:
    record = KafkaRecord(
        value=envelope.encode(), headers=(("content-type", b"application/cloudevents+json"),)
    )
    with pytest.raises(InvalidEventError) as caught:
        decode_record(record, max_event_bytes=LIMIT)
    assert caught.value.code == code


def test_json_content_type_with_non_json_data_is_refused() -> None:
    record = KafkaRecord(
        value=b"not json", headers=(*binary_headers(), ("content-type", b"application/json"))
    )
    with pytest.raises(InvalidEventError) as caught:
        decode_record(record, max_event_bytes=LIMIT)
    assert caught.value.code == "data.invalid_json"


def test_oversized_record_is_refused_before_parsing() -> None:
    record = KafkaRecord(value=b"x" * 11, headers=binary_headers())
    with pytest.raises(InvalidEventError) as caught:
        decode_record(record, max_event_bytes=10)
    assert caught.value.code == "record.too_large"


def test_non_json_event_format_is_refused() -> None:
    record = KafkaRecord(
        value=b"\x00", headers=(("content-type", b"application/cloudevents+avro"),)
    )
    with pytest.raises(InvalidEventError) as caught:
        decode_record(record, max_event_bytes=LIMIT)
    assert caught.value.code == "structured.unsupported_format"


def test_a_batch_with_one_bad_element_is_refused_whole_naming_the_element() -> None:
    batch = [
        {"specversion": "1.0", "id": "1", "source": "/s", "type": "t"},
        {"specversion": "1.0", "source": "/s", "type": "t"},
    ]
    record = KafkaRecord(
        value=json.dumps(batch).encode(),
        headers=(("content-type", b"application/cloudevents-batch+json"),),
    )
    with pytest.raises(InvalidEventError) as caught:
        decode_record(record, max_event_bytes=LIMIT)
    assert caught.value.code == "attribute.missing"
    assert "batch element 1" in caught.value.message


def test_empty_batch_is_refused() -> None:
    record = KafkaRecord(
        value=b"[]", headers=(("content-type", b"application/cloudevents-batch+json"),)
    )
    with pytest.raises(InvalidEventError) as caught:
        decode_record(record, max_event_bytes=LIMIT)
    assert caught.value.code == "batch.invalid"


def test_rfc3339_accepts_lower_case_separators_and_nanoseconds() -> None:
    assert parse_rfc3339("2026-01-02t03:04:05.123456789z") == datetime(
        2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC
    )


def test_a_consumed_message_says_where_it_was_read_and_when_in_utc() -> None:
    message = SimpleNamespace(
        topic="in",
        partition=2,
        offset=41,
        timestamp=1_700_000_000.25,
        key=b"k",
        value=b"{}",
        headers=[("ce_id", b"1"), ("empty", None)],
    )
    record, origin = consumed(message, timestamp_seconds=message.timestamp)
    assert record == KafkaRecord(value=b"{}", headers=(("ce_id", b"1"), ("empty", b"")), key=b"k")
    assert (origin.topic, origin.partition, origin.offset, origin.key) == ("in", 2, 41, b"k")
    assert origin.timestamp == datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)
    assert consumed(message, timestamp_seconds=None)[1].timestamp is None

"""Kafka record <-> `CloudEvent`: the CloudEvents 1.0 Kafka protocol binding, spec-exact.

The intake (`handlers/intake.py`) calls `decode_record` on every consumed record; the
publisher (`handlers/publishing.py`) and `tuneloop emit` call `encode_event`. This is the one
place where wire bytes become validated `CloudEvent` values, so every attribute rule of the
spec is checked here and every failure is an `InvalidEventError` with a stable `Rejection`
code (see `docs/dead-letters.md`).

Written against the spec text rather than the cloudevents SDK because the SDK differs from it
where it matters to us: its `from_kafka` picks binary mode whenever any `ce_` header is
present (the spec decides by the `content-type` prefix only), its v1 `to_binary` drops
`partitionkey` from the event, and its v1 `to_structured` writes the data's content type as
the record's, which a spec-following reader then takes for binary mode.

The rules, as implemented:

- Mode: a `content-type` header starting with `application/cloudevents` (any case) means
  structured mode (`+json` single event, `-batch+json` a JSON array of events; other formats
  are refused); anything else is binary mode.
- Binary: every `ce_<name>` header is an attribute (UTF-8 value), `content-type` is
  `datacontenttype`, the record value is the data unchanged (`None` value: no data).
  Duplicated `ce_*`/`content-type` headers are refused rather than guessed at.
- Key: a record key fills the `partitionkey` extension when the event has none; encoding maps
  `partitionkey` to the record key and keeps it in the event (the binding's key mapper
  "MUST NOT modify the CloudEvent").
- Attributes and the JSON event format (structured mode's envelope, a batch's elements): the
  core's `orchestrator/event_json.py`, the one JSON form of an event, which the rule engine's
  stored state and `tuneloop simulate` use too.
- Data: JSON (by `datacontenttype` `application/json`, `*/*+json`, `text/json`, or absent) is
  parsed into a Python value; any other content type keeps bytes (binary mode,
  `data_base64`) or the JSON value the envelope carried (structured `data`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchestrator import event_json
from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent, ExtensionValue
from orchestrator.rules.state import InputPosition
from orchestrator.vocabulary.rejections import Rejection
from orchestrator.vocabulary.timestamps import format_rfc3339, parse_rfc3339

__all__ = [
    "BATCH_CONTENT_TYPE",
    "CONTENT_TYPE_HEADER",
    "HEADER_PREFIX",
    "STRUCTURED_CONTENT_TYPE",
    "EncodingMode",
    "Headers",
    "KafkaRecord",
    "RecordInfo",
    "decode_record",
    "encode_batch",
    "encode_event",
    "envelope_of",
    "is_json_content_type",
    "mode_of",
    "parse_rfc3339",
]

Headers = tuple[tuple[str, bytes], ...]
"""Kafka headers as on the wire: ordered, names may repeat."""

STRUCTURED_CONTENT_TYPE = "application/cloudevents+json; charset=UTF-8"
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json; charset=UTF-8"
CONTENT_TYPE_HEADER = "content-type"
HEADER_PREFIX = "ce_"


class EncodingMode(enum.StrEnum):
    """The Kafka binding's content modes."""

    BINARY = "binary"
    STRUCTURED = "structured"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """The parts of a Kafka record the binding reads and writes."""

    value: bytes | None
    headers: Headers = ()
    key: bytes | None = None


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """Where a record was read: enough to find it again, and to say where a dead letter came
    from. `timestamp` is the record's Kafka timestamp (UTC)."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime | None = None
    key: bytes | None = None
    sequence: int | None = None
    """Delivery order among the records of one rule key: the keyed topic's offset, set by the
    intake's keyed stage (the rule engine counts a re-delivered event by it)."""

    @property
    def position(self) -> InputPosition | None:
        """Where this record sits on its topic, for the rule engine to tell a re-delivered
        event from a late one; None for a signal, which came from no input record."""
        if self.partition < 0 or self.offset < 0:
            return None
        return InputPosition(f"{self.topic}/{self.partition}", self.offset)


def consumed(message: Any, *, timestamp_seconds: float | None) -> tuple[KafkaRecord, RecordInfo]:
    """A consumed Kafka message as the codec's record and where it was read.

    aiokafka's `ConsumerRecord` and faust's `Message` name these fields alike, but give the
    timestamp in milliseconds and in seconds: the caller passes it in seconds."""
    record = KafkaRecord(
        value=message.value,
        headers=tuple((name, bytes(value or b"")) for name, value in message.headers or ()),
        key=message.key,
    )
    origin = RecordInfo(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp=(
            datetime.fromtimestamp(timestamp_seconds, UTC)
            if timestamp_seconds is not None
            else None
        ),
        key=message.key,
    )
    return record, origin


def is_json_content_type(content_type: str | None) -> bool:
    """Whether data of this `datacontenttype` is JSON (absent counts as JSON, as the JSON
    event format says)."""
    if content_type is None:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("application/json", "text/json") or media.endswith("+json")


# --------------------------------------------------------------------------- decoding


def decode_record(record: KafkaRecord, *, max_event_bytes: int) -> tuple[CloudEvent, ...]:
    """The events in one Kafka record: one, or several for a batch.

    Args:
        record: value, headers (raw list, repeats kept) and key as consumed.
        max_event_bytes: records with a larger value are refused before any parsing.

    Returns:
        The validated events, in record order (a batch is refused as a whole if any element
        is invalid, so a record has exactly one outcome).

    Raises:
        InvalidEventError: with a `Rejection` code saying what is wrong.
    """
    if record.value is not None and len(record.value) > max_event_bytes:
        raise InvalidEventError(
            Rejection.RECORD_TOO_LARGE,
            f"record value is {len(record.value)} bytes, the limit is {max_event_bytes}",
        )
    binding_headers = _binding_headers(record.headers)
    content_type = binding_headers.get(CONTENT_TYPE_HEADER)
    mode = mode_of(content_type)
    key = _key_text(record.key)
    if mode is EncodingMode.BINARY:
        return (_decode_binary(record.value, binding_headers, key),)
    _check_structured_format(content_type or "")
    envelope = _parse_json(record.value, Rejection.ENVELOPE_NOT_JSON, what="envelope")
    if mode is EncodingMode.BATCH:
        if not isinstance(envelope, list) or not envelope:
            raise InvalidEventError(
                Rejection.BATCH_INVALID, "a batch must be a non-empty JSON array of events"
            )
        events = []
        for index, element in enumerate(envelope):
            try:
                events.append(event_json.from_json(element, key=key))
            except InvalidEventError as exc:
                raise InvalidEventError(exc.code, f"batch element {index}: {exc.message}") from exc
        return tuple(events)
    return (event_json.from_json(envelope, key=key),)


def mode_of(content_type: str | None) -> EncodingMode:
    """The binding's mode rule: the `content-type` prefix decides, nothing else."""
    if content_type is None:
        return EncodingMode.BINARY
    media = content_type.split(";", 1)[0].strip().lower()
    if media.startswith("application/cloudevents-batch"):
        return EncodingMode.BATCH
    if media.startswith("application/cloudevents"):
        return EncodingMode.STRUCTURED
    return EncodingMode.BINARY


def _binding_headers(headers: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """`content-type` and `ce_*` headers as text; other headers are not ours to judge."""
    found: dict[str, str] = {}
    for name, raw in headers:
        # Only the first three characters decide; lower-casing whole names cost more.
        prefix = name[:3].lower()
        if prefix == HEADER_PREFIX:
            normalised = name
        elif prefix == "con" and name.lower() == CONTENT_TYPE_HEADER:
            normalised = CONTENT_TYPE_HEADER
        else:
            continue
        if normalised in found:
            raise InvalidEventError(
                Rejection.HEADER_DUPLICATED,
                f"header {name!r} appears more than once; refusing to guess which is meant",
            )
        try:
            found[normalised] = (raw if type(raw) is bytes else bytes(raw or b"")).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidEventError(
                Rejection.HEADER_NOT_UTF8, f"header {name!r} is not valid UTF-8"
            ) from None
    return found


def _key_text(key: bytes | None) -> str | None:
    if not key:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        # A binary key cannot be a string extension; the event simply has no partitionkey.
        return None


def _decode_binary(value: bytes | None, headers: Mapping[str, str], key: str | None) -> CloudEvent:
    attributes: dict[str, Any] = {}
    for name, text in headers.items():
        if name == CONTENT_TYPE_HEADER:
            continue
        attributes[name[len(HEADER_PREFIX) :]] = text
    if not attributes:
        raise InvalidEventError(
            Rejection.NOT_A_CLOUDEVENT,
            "no ce_* headers and no application/cloudevents content type",
        )
    content_type = headers.get(CONTENT_TYPE_HEADER)
    if "datacontenttype" in attributes:
        # The binding maps datacontenttype to content-type only; a ce_ copy could disagree.
        raise InvalidEventError(
            Rejection.ATTRIBUTE_NAME_INVALID,
            "binary mode carries datacontenttype in the content-type header, not ce_",
        )
    if content_type is not None:
        attributes["datacontenttype"] = content_type
    data: Any = None
    # An empty value is no data, like a null one: there is nothing to parse as JSON.
    if value:
        declared = attributes.get("datacontenttype")
        data = (
            _parse_json(value, Rejection.DATA_NOT_JSON, what="data")
            if (is_json_content_type(declared))
            else bytes(value)
        )
    return event_json.from_attributes(attributes, data, key=key)


def _check_structured_format(content_type: str) -> None:
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in ("application/cloudevents+json", "application/cloudevents-batch+json"):
        raise InvalidEventError(
            Rejection.FORMAT_UNSUPPORTED,
            f"structured mode with {media!r}: only the JSON event format is supported",
        )


def _parse_json(raw: bytes | None, code: Rejection, *, what: str) -> Any:
    if raw is None:
        raise InvalidEventError(code, f"the {what} is empty (null record value)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidEventError(code, f"the {what} is not valid UTF-8") from None
    try:
        return _STRICT_JSON.decode(text)
    except (json.JSONDecodeError, _JsonShapeError, RecursionError) as exc:
        raise InvalidEventError(code, f"the {what} is not valid JSON: {exc}") from None


class _JsonShapeError(ValueError):
    pass


def _refuse_duplicate_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) == len(pairs):
        return result
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise _JsonShapeError(f"member {name!r} appears twice")
        seen.add(name)
    raise AssertionError("unreachable: a shorter dict means a repeated name")


def _refuse_constant(name: str) -> Any:
    raise _JsonShapeError(f"{name} is not JSON")


# One decoder for all records: json.loads with hooks would build a new one per call.
_STRICT_JSON = json.JSONDecoder(
    object_pairs_hook=_refuse_duplicate_members, parse_constant=_refuse_constant
)


# --------------------------------------------------------------------------- encoding


def encode_event(event: CloudEvent, *, mode: EncodingMode = EncodingMode.BINARY) -> KafkaRecord:
    """The Kafka record for *event*; `partitionkey` becomes the record key.

    Binary mode writes extensions as text (the binding's headers are strings), so an integer
    or boolean extension reads back as its canonical string. Structured mode keeps types.
    """
    key = event.extensions.get("partitionkey")
    record_key = None if key is None else _canonical(key).encode("utf-8")
    if mode is EncodingMode.BINARY:
        headers = [
            (HEADER_PREFIX + name, value.encode("utf-8")) for name, value in _attribute_texts(event)
        ]
        if event.datacontenttype is not None:
            headers.append((CONTENT_TYPE_HEADER, event.datacontenttype.encode("utf-8")))
        return KafkaRecord(value=_data_bytes(event), headers=tuple(headers), key=record_key)
    if mode is EncodingMode.STRUCTURED:
        return KafkaRecord(
            value=_dumps(envelope_of(event)),
            headers=((CONTENT_TYPE_HEADER, STRUCTURED_CONTENT_TYPE.encode("ascii")),),
            key=record_key,
        )
    raise ValueError("encode_batch writes batches")


def encode_batch(events: Sequence[CloudEvent]) -> KafkaRecord:
    """One `application/cloudevents-batch+json` record holding *events* (no record key)."""
    return KafkaRecord(
        value=_dumps([envelope_of(event) for event in events]),
        headers=((CONTENT_TYPE_HEADER, BATCH_CONTENT_TYPE.encode("ascii")),),
    )


envelope_of = event_json.to_json
"""The JSON event format of an event as a mapping (what structured mode writes)."""


def _attribute_texts(event: CloudEvent) -> list[tuple[str, str]]:
    texts = [
        ("specversion", event.specversion),
        ("id", event.id),
        ("source", event.source),
        ("type", event.type),
    ]
    if event.subject is not None:
        texts.append(("subject", event.subject))
    if event.time is not None:
        texts.append(("time", format_rfc3339(event.time)))
    if event.dataschema is not None:
        texts.append(("dataschema", event.dataschema))
    texts.extend((name, _canonical(value)) for name, value in event.extensions.items())
    return texts


def _canonical(value: ExtensionValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _data_bytes(event: CloudEvent) -> bytes | None:
    data = event.data
    if data is None:
        return None
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    if is_json_content_type(event.datacontenttype):
        return _dumps(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    raise ValueError(
        f"data of type {type(data).__name__} with non-JSON content type "
        f"{event.datacontenttype!r}: pass bytes or a string"
    )


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

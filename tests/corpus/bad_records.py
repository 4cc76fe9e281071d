"""A corpus of records the intake must dead-letter, each with the code it must get.

Used by `tests/unit/events/test_corpus.py` (through `admit`, no broker) and by
`tests/integration/test_intake.py` (through the real broker and worker). Generated rather than
stored as files because many cases are variations of a good record, and a generator keeps the
bytes exact (invalid UTF-8, NUL bytes, a megabyte of payload) where a text file would not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

Headers = tuple[tuple[str, bytes], ...]

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
"""The clock the corpus is written against: ages and expiry times are relative to it."""

STRUCTURED = (("content-type", b"application/cloudevents+json"),)
BATCH = (("content-type", b"application/cloudevents-batch+json"),)
DRIFT_TYPE = "io.tuneloop.drift.detected.v1"
DATA_TYPE = "io.tuneloop.data.arrived.v1"

GOOD_DRIFT = {"model_id": "chat", "metric": "psi", "value": 0.3, "threshold": 0.2}


@dataclass(frozen=True, slots=True)
class BadRecord:
    """One record and the dead-letter code it must end with."""

    name: str
    value: bytes | None
    headers: Headers
    code: str
    key: bytes | None = None


def binary_headers(**attributes: str | None) -> Headers:
    """A good binary-mode drift event's headers, with *attributes* changed (None removes)."""
    base: dict[str, str | None] = {
        "ce_specversion": "1.0",
        "ce_id": "evt-1",
        "ce_source": "/monitors/evidently/prod",
        "ce_type": DRIFT_TYPE,
        "ce_time": "2026-06-01T11:00:00Z",
        "content-type": "application/json",
    }
    base.update(attributes)
    return tuple((name, value.encode()) for name, value in base.items() if value is not None)


def envelope(**members: object) -> dict[str, object]:
    """A good structured drift event, with *members* changed (the value `...` removes)."""
    base: dict[str, object] = {
        "specversion": "1.0",
        "id": "evt-1",
        "source": "/monitors/evidently/prod",
        "type": DRIFT_TYPE,
        "time": "2026-06-01T11:00:00Z",
        "datacontenttype": "application/json",
        "data": GOOD_DRIFT,
    }
    base.update(members)
    return {name: value for name, value in base.items() if value is not ...}


def _structured(name: str, body: object, code: str) -> BadRecord:
    return BadRecord(name, json.dumps(body).encode(), STRUCTURED, code)


GOOD_DATA = json.dumps(GOOD_DRIFT).encode()


def bad_records(*, max_event_bytes: int = 1_048_576) -> Iterator[BadRecord]:
    """Every bad record of the corpus (more than 100), for an intake with *max_event_bytes*."""
    # -- not a CloudEvent at all
    yield BadRecord("no-headers-json", GOOD_DATA, (), "record.not_cloudevent")
    yield BadRecord("no-headers-text", b"hello", (), "record.not_cloudevent")
    yield BadRecord("no-headers-null", None, (), "record.not_cloudevent")
    yield BadRecord("no-headers-binary", bytes(range(256)), (), "record.not_cloudevent")
    for other in ("x-trace", "CE-ID", "cloudevents", "ce-id", "traceparent"):
        yield BadRecord(
            f"foreign-header-{other}", GOOD_DATA, ((other, b"1"),), "record.not_cloudevent"
        )
    yield BadRecord(
        "json-content-type-only",
        GOOD_DATA,
        (("content-type", b"application/json"),),
        "record.not_cloudevent",
    )
    yield BadRecord(
        "plain-json-event-without-structured-content-type",
        json.dumps(envelope()).encode(),
        (),
        "record.not_cloudevent",
    )
    # -- binary mode: required attributes
    for attribute in ("ce_id", "ce_source", "ce_type", "ce_specversion"):
        for data_name, data in (("json", GOOD_DATA), ("null", None)):
            yield BadRecord(
                f"binary-missing-{attribute}-{data_name}",
                data,
                binary_headers(**{attribute: None}),
                "attribute.missing",
            )
    for version in ("0.3", "1", "2.0", "1.0 ", "v1.0"):
        yield BadRecord(
            f"binary-specversion-{version.strip() or 'blank'}-{len(version)}",
            GOOD_DATA,
            binary_headers(ce_specversion=version),
            "attribute.unsupported_specversion",
        )
    for attribute in ("ce_id", "ce_source", "ce_type", "ce_subject"):
        yield BadRecord(
            f"binary-empty-{attribute}",
            GOOD_DATA,
            binary_headers(**{attribute: ""}),
            "attribute.invalid",
        )
    for index, source in enumerate(("has space", "ünïcode", "tab\there", "<script>", "a\nb")):
        yield BadRecord(
            f"binary-bad-source-{index}",
            GOOD_DATA,
            binary_headers(ce_source=source),
            "attribute.invalid",
        )
    for index, schema in enumerate(("relative/path", "no scheme", "://x")):
        yield BadRecord(
            f"binary-bad-dataschema-{index}",
            GOOD_DATA,
            binary_headers(ce_dataschema=schema),
            "attribute.invalid",
        )
    for index, media in enumerate(("json", "application", "app lication/json")):
        yield BadRecord(
            f"binary-bad-content-type-{index}",
            GOOD_DATA,
            binary_headers(**{"content-type": media}),
            "attribute.invalid",
        )
    bad_times = (
        "2026-06-01 11:00:00Z",
        "2026-06-01T11:00:00",
        "2026-06-01",
        "yesterday",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-06-01T25:00:00Z",
        "2026-06-01T11:00:00+25:00",
        "1717239600",
    )
    for index, text in enumerate(bad_times):
        yield BadRecord(
            f"binary-bad-time-{index}",
            GOOD_DATA,
            binary_headers(ce_time=text),
            "attribute.invalid_time",
        )
    for index, text in enumerate(("never", "2026-06-01", "")):
        yield BadRecord(
            f"binary-bad-expirytime-{index}",
            GOOD_DATA,
            binary_headers(ce_expirytime=text),
            "attribute.invalid_time",
        )
    for name in ("Model", "model-id", "model_id", "x.y", "data", "ÿ", ""):
        yield BadRecord(
            f"binary-bad-extension-name-{name or 'empty'}",
            GOOD_DATA,
            (*binary_headers(), (f"ce_{name}", b"v")),
            "attribute.invalid_name",
        )
    yield BadRecord(
        "binary-datacontenttype-as-ce-header",
        GOOD_DATA,
        (*binary_headers(), ("ce_datacontenttype", b"text/plain")),
        "attribute.invalid_name",
    )
    # -- header injection and encoding
    for header, value in (
        ("ce_id", b"evt-2"),
        ("ce_type", b"io.tuneloop.data.arrived.v1"),
        ("ce_source", b"/evil"),
        ("content-type", b"text/plain"),
        ("Content-Type", b"application/json"),
    ):
        yield BadRecord(
            f"injected-duplicate-{header}",
            GOOD_DATA,
            (*binary_headers(), (header, value)),
            "header.duplicated",
        )
    for index, raw in enumerate((b"\xff", b"\xc3\x28", b"abc\xed\xa0\x80")):
        yield BadRecord(
            f"header-not-utf8-{index}",
            GOOD_DATA,
            (*binary_headers(), ("ce_subject", raw)),
            "header.not_utf8",
        )
    # -- binary mode: data that contradicts its content type
    for index, data in enumerate(
        (b"not json", b"{", b"{'single': 1}", b"\xff\xfe\x00", b"[1, 2", b"NaN", b'{"a":1}{"b":2}')
    ):
        yield BadRecord(
            f"binary-json-content-type-non-json-data-{index}",
            data,
            binary_headers(),
            "data.invalid_json",
        )
    # -- structured mode
    whole = json.dumps(envelope()).encode()
    for cut in (1, 10, len(whole) // 2, len(whole) - 1):
        yield BadRecord(
            f"structured-truncated-at-{cut}",
            whole[:cut],
            STRUCTURED,
            "structured.invalid_json",
        )
    for index, raw in enumerate(
        (b"", b"\xff\xfe{}", b'{"id": "\xff"}', b"NaN", b'{"specversion": Infinity}')
    ):
        yield BadRecord(
            f"structured-unparsable-{index}", raw, STRUCTURED, "structured.invalid_json"
        )
    yield BadRecord("structured-null-value", None, STRUCTURED, "structured.invalid_json")
    yield BadRecord(
        "structured-duplicate-member",
        b'{"specversion":"1.0","id":"a","id":"b","source":"/s","type":"t"}',
        STRUCTURED,
        "structured.invalid_json",
    )
    for index, body in enumerate(([envelope()], "event", 42, None, True)):
        yield _structured(f"structured-not-object-{index}", body, "structured.not_object")
    for member in ("id", "source", "type", "specversion"):
        yield _structured(
            f"structured-missing-{member}", envelope(**{member: ...}), "attribute.missing"
        )
    yield _structured("structured-null-id-means-absent", envelope(id=None), "attribute.missing")
    for index, change in enumerate(
        ({"id": 7}, {"source": ["/s"]}, {"type": True}, {"time": 1717239600}, {"subject": {}})
    ):
        yield _structured(f"structured-wrong-type-{index}", envelope(**change), "attribute.invalid")
    for index, value in enumerate((1.5, [1], {"a": 1}, 2**40)):
        yield _structured(
            f"structured-bad-extension-value-{index}",
            envelope(sequence=value),
            "attribute.invalid",
        )
    yield _structured(
        "structured-specversion-0.3",
        envelope(specversion="0.3"),
        "attribute.unsupported_specversion",
    )
    yield _structured(
        "structured-bad-extension-name",
        envelope(**{"Model-Id": "x"}),
        "attribute.invalid_name",
    )
    yield _structured(
        "structured-data-and-base64",
        envelope(data_base64="AAAA"),
        "data.conflict",
    )
    for index, value in enumerate(("@@@", "AAA", 12)):
        yield _structured(
            f"structured-bad-base64-{index}",
            envelope(data=..., data_base64=value, datacontenttype="application/octet-stream"),
            "data.conflict",
        )
    for media in (
        "application/cloudevents+avro",
        "application/cloudevents+xml",
        "application/cloudevents+protobuf",
    ):
        yield BadRecord(
            f"unsupported-format-{media.rsplit('+', 1)[1]}",
            json.dumps(envelope()).encode(),
            (("content-type", media.encode()),),
            "structured.unsupported_format",
        )
    # -- batches
    yield BadRecord("batch-not-array", json.dumps(envelope()).encode(), BATCH, "batch.invalid")
    yield BadRecord("batch-empty", b"[]", BATCH, "batch.invalid")
    yield BadRecord(
        "batch-one-bad-element",
        json.dumps([envelope(id="a"), envelope(id=...)]).encode(),
        BATCH,
        "attribute.missing",
    )
    yield BadRecord("batch-truncated", b'[{"specversion":"1.0"', BATCH, "structured.invalid_json")
    # -- size
    yield BadRecord(
        "binary-over-size-limit",
        b"x" * (max_event_bytes + 1),
        binary_headers(**{"content-type": "application/octet-stream"}),
        "record.too_large",
    )
    big = json.dumps(envelope(data={"blob": "y" * max_event_bytes})).encode()
    yield BadRecord("structured-over-size-limit", big, STRUCTURED, "record.too_large")
    # -- data failing its schema
    for index, data in enumerate(
        (
            {},
            {"model_id": "m", "metric": "psi", "value": "high", "threshold": 0.2},
            {**GOOD_DRIFT, "severity": "apocalyptic"},
            {**GOOD_DRIFT, "rows": -5},
            {**GOOD_DRIFT, "window": {"start": "then", "end": "now"}},
            [GOOD_DRIFT],
        )
    ):
        yield _structured(
            f"drift-schema-mismatch-{index}", envelope(data=data), "data.schema_mismatch"
        )
    yield BadRecord(
        "drift-without-data",
        None,
        binary_headers(),
        "data.schema_mismatch",
    )
    yield BadRecord(
        "drift-as-bytes",
        b"\x00\x01",
        binary_headers(**{"content-type": "application/octet-stream"}),
        "data.schema_mismatch",
    )
    for index, data in enumerate(
        ({"dataset_id": "d"}, {"dataset_id": "d", "uri": "s3://x", "rows": 1.5})
    ):
        yield _structured(
            f"data-arrived-schema-mismatch-{index}",
            envelope(type=DATA_TYPE, data=data),
            "data.schema_mismatch",
        )
    # -- types nobody registered
    for event_type in ("com.example.unknown", "io.tuneloop.drift.detected.v2", "drift"):
        yield _structured(f"unknown-type-{event_type}", envelope(type=event_type), "type.unknown")
    # -- stale and expired
    for age in (timedelta(days=2), timedelta(days=400)):
        yield _structured(
            f"too-old-{age.days}d",
            envelope(time=(NOW - age).isoformat().replace("+00:00", "Z")),
            "event.too_old",
        )
    for ago in (timedelta(seconds=1), timedelta(hours=3)):
        yield _structured(
            f"expired-{int(ago.total_seconds())}s-ago",
            envelope(expirytime=(NOW - ago).isoformat().replace("+00:00", "Z")),
            "event.expired",
        )


def good_records(count: int, *, prefix: str = "good") -> Iterator[tuple[bytes | None, Headers]]:
    """*count* valid drift events alternating binary and structured mode, ids `<prefix>-<n>`."""
    for index in range(count):
        event_id = f"{prefix}-{index}"
        if index % 2:
            yield json.dumps(envelope(id=event_id)).encode(), STRUCTURED
        else:
            yield GOOD_DATA, binary_headers(ce_id=event_id)

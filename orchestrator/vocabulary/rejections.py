"""The stable reasons a record is dead-lettered, one enum for the whole event path.

The codec (`handlers/codec.py`), the schema registry (`orchestrator/vocabulary/registry.py`)
and the intake (`handlers/intake.py`) raise `InvalidEventError(code, message)` with one of
these codes; the dead-letter writer puts it in the `tuneloop-error-code` header. Operators
filter and alert on these strings, so a value never changes meaning once released: add new
members, never rename. `docs/dead-letters.md` explains each one and what to do about it.
"""

from __future__ import annotations

import enum


class Rejection(enum.StrEnum):
    """Why a record could not be handed to the core."""

    RECORD_TOO_LARGE = "record.too_large"
    """The record value is bigger than `max_event_bytes`."""
    NOT_A_CLOUDEVENT = "record.not_cloudevent"
    """No `ce_*` headers and no `application/cloudevents*` content type."""
    HEADER_NOT_UTF8 = "header.not_utf8"
    """A `ce_*` or `content-type` header value is not valid UTF-8."""
    HEADER_DUPLICATED = "header.duplicated"
    """A `ce_*` or `content-type` header appears twice (header injection)."""
    FORMAT_UNSUPPORTED = "structured.unsupported_format"
    """Structured mode with an event format other than JSON (`application/cloudevents+avro`)."""
    ENVELOPE_NOT_JSON = "structured.invalid_json"
    """The structured envelope is not UTF-8 JSON (or has duplicate members, NaN, ...)."""
    ENVELOPE_NOT_OBJECT = "structured.not_object"
    """The structured envelope is JSON but not an object (a batch element included)."""
    BATCH_INVALID = "batch.invalid"
    """A batch (`application/cloudevents-batch+json`) is not a non-empty JSON array."""
    ATTRIBUTE_MISSING = "attribute.missing"
    """A required attribute (`id`, `source`, `specversion`, `type`) is absent."""
    ATTRIBUTE_INVALID = "attribute.invalid"
    """An attribute has the wrong type or an invalid value (empty id, bad URI, bad media type)."""
    ATTRIBUTE_NAME_INVALID = "attribute.invalid_name"
    """An attribute or extension name is not lower-case a-z0-9, or is reserved (`data`)."""
    TIME_INVALID = "attribute.invalid_time"
    """`time` or `expirytime` is not an RFC 3339 timestamp."""
    SPECVERSION_UNSUPPORTED = "attribute.unsupported_specversion"
    """`specversion` is not "1.0"."""
    DATA_CONFLICT = "data.conflict"
    """A structured event has both `data` and `data_base64`, or invalid base64."""
    DATA_NOT_JSON = "data.invalid_json"
    """The content type says JSON but the data does not parse as JSON (or is not UTF-8)."""
    DATA_SCHEMA_MISMATCH = "data.schema_mismatch"
    """The data fails the JSON Schema registered for the event's type."""
    TYPE_UNKNOWN = "type.unknown"
    """No schema is registered for the type and no rule accepts unknown types."""
    EVENT_TOO_OLD = "event.too_old"
    """The event's time is further back than `max_age`."""
    EVENT_EXPIRED = "event.expired"
    """The event's `expirytime` extension has passed."""
    INTAKE_FAILED = "intake.failed"
    """tuneloop itself failed on this record (a bug, or a record on the internal topic that
    tuneloop did not write). Parked here so the worker keeps consuming; report it."""
    SINK_REJECTED = "sink.rejected"
    """The core refused the event for good (it raised `InvalidEventError` itself)."""
    SINK_FAILED = "sink.failed"
    """The core raised an unexpected error; the event is parked here rather than blocking
    its partition forever or being lost. Replaying it after a fix is safe (dedup, idempotent
    launches)."""

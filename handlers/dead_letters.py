"""Dead letters: a record that can never be processed, kept intact with the reason attached.

The intake (`handlers/intake.py`) calls `dead_letter_record` for every record it refuses and
sends the result to the DLQ topic (`TUNELOOP_KAFKA_TOPIC_DLQ`) before the source offset is
committed. Operators read the DLQ with `read_reason` (or any Kafka tool: the headers are
plain UTF-8).

What a dead letter is:
- the original value, key and headers, byte for byte and in their original order (repeats
  included), so a fixed record can be replayed as it was;
- followed by `tuneloop-*` headers with the reason: a stable code (`docs/dead-letters.md`),
  a human message, the source topic/partition/offset and the time it was dead-lettered.

A producer could send its own `tuneloop-error-code` header; ours always come *after* the
original headers, so the reader takes the last occurrence of each (`read_reason` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from handlers.codec import Headers, KafkaRecord, RecordInfo
from orchestrator.vocabulary.timestamps import format_rfc3339

HEADER_CODE = "tuneloop-error-code"
HEADER_MESSAGE = "tuneloop-error-message"
HEADER_TOPIC = "tuneloop-origin-topic"
HEADER_PARTITION = "tuneloop-origin-partition"
HEADER_OFFSET = "tuneloop-origin-offset"
HEADER_AT = "tuneloop-dead-lettered-at"
REASON_HEADERS = (HEADER_CODE, HEADER_MESSAGE, HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET)

MAX_MESSAGE_CHARS = 1000
"""Longer messages are cut: a header is no place for a quoted megabyte payload."""


@dataclass(frozen=True, slots=True)
class DeadLetterReason:
    """Why and from where a record was dead-lettered, as read back from its headers."""

    code: str
    message: str
    topic: str
    partition: int
    offset: int
    at: str


def dead_letter_record(
    original: KafkaRecord,
    *,
    origin: RecordInfo,
    code: str,
    message: str,
    at: datetime,
) -> KafkaRecord:
    """The DLQ record for *original*: its bytes untouched, the reason appended as headers."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    reason: Headers = (
        (HEADER_CODE, str(code).encode("utf-8")),
        (HEADER_MESSAGE, message.encode("utf-8", errors="replace")),
        (HEADER_TOPIC, origin.topic.encode("utf-8")),
        (HEADER_PARTITION, str(origin.partition).encode("ascii")),
        (HEADER_OFFSET, str(origin.offset).encode("ascii")),
        (HEADER_AT, format_rfc3339(at).encode("ascii")),
    )
    return KafkaRecord(value=original.value, headers=(*original.headers, *reason), key=original.key)


def read_reason(headers: Iterable[tuple[str, bytes | None]]) -> DeadLetterReason:
    """The reason tuneloop attached to a DLQ record (the last of each `tuneloop-*` header).

    Raises:
        KeyError: the record has no tuneloop reason (it was not written by tuneloop).
    """
    found: dict[str, str] = {}
    for name, value in headers:
        if name in (*REASON_HEADERS, HEADER_AT):
            found[name] = (value or b"").decode("utf-8", errors="replace")
    return DeadLetterReason(
        code=found[HEADER_CODE],
        message=found.get(HEADER_MESSAGE, ""),
        topic=found[HEADER_TOPIC],
        partition=int(found[HEADER_PARTITION]),
        offset=int(found[HEADER_OFFSET]),
        at=found.get(HEADER_AT, ""),
    )


def original_headers(headers: Iterable[tuple[str, bytes | None]]) -> Headers:
    """The producer's headers of a DLQ record: everything before tuneloop's reason block."""
    listed = [(name, value or b"") for name, value in headers]
    # The reason block is the last six headers; strip exactly those, not earlier look-alikes.
    block = len(REASON_HEADERS) + 1
    if len(listed) >= block and listed[-block][0] == HEADER_CODE:
        return tuple(listed[:-block])
    return tuple(listed)


def reason_summary(reason: DeadLetterReason) -> Mapping[str, object]:
    """The reason as a flat mapping, for logs and the CLI."""
    return {
        "code": reason.code,
        "message": reason.message,
        "origin": f"{reason.topic}/{reason.partition}@{reason.offset}",
        "at": reason.at,
    }

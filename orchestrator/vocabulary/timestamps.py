"""RFC 3339 timestamps, the only time format CloudEvents allows (`time`, `expirytime`).

Used by the codec (`handlers/codec.py`) for attributes and by the schema registry for
`"format": "date-time"` fields in event data, so both edges agree on what a timestamp is.
Stricter than `datetime.fromisoformat`, which also takes ISO 8601 forms RFC 3339 forbids
(no offset, a space instead of `T`, week dates).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from orchestrator.errors import InvalidEventError
from orchestrator.vocabulary.rejections import Rejection

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})"
)


def parse_rfc3339(text: str, *, attribute: str = "time") -> datetime:
    """An RFC 3339 timestamp (with its offset kept); fractions beyond microseconds are cut.

    Raises:
        InvalidEventError: `attribute.invalid_time` naming *attribute*.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise InvalidEventError(
            Rejection.TIME_INVALID, f"{attribute} {text!r} is not an RFC 3339 timestamp"
        )
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        if offset == "Z" and text[10] == "T" and second != "60" and len(fraction or "") <= 6:
            # The common shape, which the regex has vetted: fromisoformat builds the same
            # value much faster than the general path below (and refuses Feb 30 alike).
            return datetime.fromisoformat(text)
        zone = UTC if offset in ("Z", "z") else _offset(offset)
        return datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            # RFC 3339 allows a leap second (60); Python cannot hold it, so it becomes :59.
            min(int(second), 59),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=zone,
        )
    except ValueError:
        raise InvalidEventError(
            Rejection.TIME_INVALID, f"{attribute} {text!r} is not a valid date and time"
        ) from None


def _offset(text: str) -> timezone:
    sign = -1 if text[0] == "-" else 1
    hours, minutes = int(text[1:3]), int(text[4:6])
    if hours > 23 or minutes > 59:
        raise ValueError(text)
    delta = sign * timedelta(hours=hours, minutes=minutes)
    return UTC if not delta else timezone(delta)


def format_rfc3339(moment: datetime) -> str:
    """`time` as text: `Z` for UTC, microseconds only when present; naive means UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    text = moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds")
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text

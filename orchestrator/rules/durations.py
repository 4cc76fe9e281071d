"""Durations as rule files write them: `90s`, `30m`, `6h`, `2d`, or compounds like `1h30m`.

Called by `parsing.py` for every duration field; `format_duration` is the inverse, used in
decision messages and in `tuneloop check` output so that people read back what they wrote.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+)([smhdw])")
_WHOLE = re.compile(r"^(?:\d+[smhdw])+$")


class DurationError(ValueError):
    """The text is not a duration; the message says what a valid one looks like."""


def parse_duration(text: object) -> timedelta:
    """Parse `90s`, `30m`, `6h`, `2d`, `1w` or compounds (`1h30m`) into a timedelta.

    Raises:
        DurationError: the text is not such a duration (numbers without a unit included:
            `3600` is ambiguous, so it is refused).
    """
    if not isinstance(text, str) or not _WHOLE.match(text.strip()):
        raise DurationError(
            f"bad duration {text!r}: use a number and a unit s, m, h, d or w, like 90s, 30m, "
            "6h, 2d or 1h30m"
        )
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text.strip()))
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The shortest rule-file spelling of *value* (`1h30m`, `2d`, `0s`)."""
    remaining = int(value.total_seconds())
    if remaining == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if remaining >= size:
            parts.append(f"{remaining // size}{unit}")
            remaining %= size
    return "".join(parts)

"""The stored form of one key's state: compact bytes for the worker's Table and its changelog.

The worker keeps a `KeyState` per key in a faust Table (`handlers/app.py`, `TableKeyStates`),
in memory and on a changelog topic, so its size is paid per key twice: RSS and changelog
bytes. `encode` writes format 2, one JSON array with no field names:

    [2, horizon, rules, wakeups, sequence, positions, buffer, sweeps]

- a time is an integer, microseconds since the Unix epoch (UTC), so it round-trips exactly;
- trailing fields at their default (null, [], {}) are left out, here and in every array below;
- `rules` maps a rule's name to `[entries, joined, seen, last_launch, launches, running,
  pending]`;
- an entry is `[event_id, source, time]`, plus its amount when not 0; its identity is
  `source + "\\n" + event_id` (`state.identity`). An identity of another shape is written
  whole, in a one-item list, in place of the source;
- a joined event is `[event, identity, time]` and a held one `[event, identity, time,
  release_at]`, the identity null when it is the event's own `source` and `id`;
- pending is `[reason, since, due, event, event_ids]`; a sweep is its `SweepState.to_json()`.

`decode` reads format 2 and also what earlier versions stored: `KeyState.to_json()` (format
1), as the object or as the JSON bytes faust's json codec wrote to the changelog. A changelog
written before this module existed therefore recovers unchanged, and each key is rewritten in
format 2 the next time it is saved. `KeyState.to_json` stays the readable form (tests,
fixtures, debugging).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.ledger import Reason
from orchestrator.rules.state import (
    Buffered,
    Entry,
    InputPosition,
    Joined,
    KeyState,
    Pending,
    RuleState,
)
from orchestrator.sweeps.state import SweepState

FORMAT = 2
"""The first item of every encoded state (`KeyState.to_json` writes format 1, a JSON object)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""Compact JSON, ASCII-escaped: an event decoded from JSON may hold a lone surrogate, which
UTF-8 cannot carry; an escape costs bytes only for the rare non-ASCII text."""


def encode(state: KeyState) -> bytes:
    """*state* in format 2: compact JSON, ASCII (non-ASCII text escaped)."""
    fields: list[Any] = [
        FORMAT,
        _micros(state.horizon),
        {name: _rule(rule) for name, rule in sorted(state.rules.items())},
        [_micros(t) for t in state.wakeups],
        state.sequence,
        [[p.partition, p.offset] for p in state.positions],
        [
            [
                dict(b.event),
                _own_identity(b.identity, b.event),
                _micros(b.time),
                _micros(b.release_at),
            ]
            for b in state.buffer
        ],
        {name: sweep.to_json() for name, sweep in sorted(state.sweeps.items())},
    ]
    return _ENCODER.encode(_trimmed(fields)).encode()


def decode(raw: bytes | str | Mapping[str, Any] | list[Any]) -> KeyState:
    """The state *raw* holds: format 2 (`encode`), or format 1 (`KeyState.to_json()`, as the
    object or as its JSON text).

    Raises:
        ValueError: *raw* is not a key state any version wrote.
    """
    data: Any = raw
    if isinstance(raw, bytes | bytearray | memoryview | str):
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"malformed key state: {exc}") from exc
    if isinstance(data, Mapping):
        return KeyState.from_json(data)  # format 1: written before format 2 existed
    if not isinstance(data, list) or not data or data[0] != FORMAT:
        found = data[0] if isinstance(data, list) and data else type(data).__name__
        raise ValueError(f"unknown key state format {found!r}")
    try:
        return _state(data)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"malformed key state: {exc!r}") from exc


def _state(data: list[Any]) -> KeyState:
    horizon, rules, wakeups, sequence, positions, buffer, sweeps = _padded(data[1:], 7)
    return KeyState(
        horizon=_time_or_none(horizon),
        rules={str(name): _rule_state(value) for name, value in (rules or {}).items()},
        wakeups=tuple(_time(t) for t in wakeups or ()),
        sequence=None if sequence is None else int(sequence),
        positions=tuple(
            InputPosition(partition=str(partition), offset=int(offset))
            for partition, offset in positions or ()
        ),
        buffer=tuple(
            Buffered(
                event=event,
                identity=_identity_of(ident, event),
                time=_time(at),
                release_at=_time(release_at),
            )
            for event, ident, at, release_at in buffer or ()
        ),
        sweeps={str(name): SweepState.from_json(value) for name, value in (sweeps or {}).items()},
    )


def _rule(state: RuleState) -> list[Any]:
    pending = state.pending
    return _trimmed(
        [
            [_entry(e) for e in state.entries],
            {
                name: [dict(j.event), _own_identity(j.identity, j.event), _micros(j.time)]
                for name, j in sorted(state.joined.items())
            }
            if state.joined
            else {},
            {ident: _micros(at) for ident, at in sorted(state.seen.items())} if state.seen else {},
            _micros(state.last_launch),
            [_micros(t) for t in state.launches],
            state.running,
            None
            if pending is None
            else _trimmed(
                [
                    pending.reason.value,
                    _micros(pending.since),
                    _micros(pending.due),
                    dict(pending.event),
                    list(pending.event_ids),
                ]
            ),
        ]
    )


def _rule_state(data: list[Any]) -> RuleState:
    entries, joined, seen, last_launch, launches, running, pending = _padded(data, 7)
    return RuleState(
        entries=tuple(_entry_of(e) for e in entries or ()),
        joined={
            str(name): Joined(event=event, identity=_identity_of(ident, event), time=_time(at))
            for name, (event, ident, at) in (joined or {}).items()
        },
        seen={str(ident): _time(at) for ident, at in (seen or {}).items()},
        last_launch=_time_or_none(last_launch),
        launches=tuple(_time(t) for t in launches or ()),
        running=None if running is None else str(running),
        pending=None if not pending else _pending(pending),
    )


def _pending(data: list[Any]) -> Pending:
    reason, since, due, event, event_ids = _padded(data, 5)
    return Pending(
        reason=Reason(reason),
        since=_time(since),
        due=_time_or_none(due),
        event={} if event is None else event,
        event_ids=tuple(str(i) for i in event_ids or ()),
    )


def _entry(entry: Entry) -> list[Any]:
    suffix = "\n" + entry.event_id
    source: str | list[str] = (
        entry.identity.removesuffix(suffix) if entry.identity.endswith(suffix) else [entry.identity]
    )
    encoded: list[Any] = [entry.event_id, source, _micros(entry.time)]
    if entry.amount:
        encoded.append(entry.amount)
    return encoded


def _entry_of(data: list[Any]) -> Entry:
    event_id, source, at, *amount = data
    identity = source[0] if isinstance(source, list) else f"{source}\n{event_id}"
    return Entry(
        event_id=str(event_id),
        identity=str(identity),
        time=_time(at),
        amount=float(amount[0]) if amount else 0.0,
    )


def _own_identity(identity: str, event: Mapping[str, Any]) -> str | None:
    """None when *identity* is the one *event*'s own source and id give it."""
    return None if identity == f"{event.get('source')}\n{event.get('id')}" else identity


def _identity_of(identity: str | None, event: Mapping[str, Any]) -> str:
    return identity if identity is not None else f"{event['source']}\n{event['id']}"


def _micros(value: datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:  # as `ledger.format_time` reads a naive time: the local one
        value = value.astimezone(UTC)
    return (value - _EPOCH) // _MICROSECOND


def _time(value: Any) -> datetime:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected a time in microseconds since the epoch, got {value!r}")
    return _EPOCH + _MICROSECOND * value


def _time_or_none(value: Any) -> datetime | None:
    return None if value is None else _time(value)


def _trimmed(fields: list[Any]) -> list[Any]:
    """*fields* without its trailing defaults (None, empty)."""
    end = len(fields)
    while end:
        last = fields[end - 1]
        if last is not None and (last or not isinstance(last, list | dict)):
            break
        end -= 1
    return fields[:end]


def _padded(fields: list[Any], size: int) -> list[Any]:
    """*fields* with the trailing defaults `_trimmed` left out back in, as None."""
    if not isinstance(fields, list) or len(fields) > size:
        raise ValueError(f"expected at most {size} fields, got {fields!r}")
    return fields + [None] * (size - len(fields))

"""The rule engine's memory for one key, as JSON-safe frozen values.

The engine (`engine.py` and the modules beside it) is the only writer; the wiring stores
each key's state in a faust Table (changelog-backed, partitioned by key) in the compact form
`state_encoding.py` writes, and hands it back decoded on the next event, so state survives
restarts and rebalances.
Everything in here is bounded: window entries and joins expire with their window, dedup ids
once they fall behind the event-time horizon, launch times after a day.

The readable JSON form (`to_json`) is `STATE_FORMAT` 1, which the worker stored before
`state_encoding.py`'s format 2; states written by earlier versions load unchanged
(`tests/unit/rules/test_state_format.py` keeps one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from orchestrator.events import CloudEvent
from orchestrator.ledger import Reason, format_time, parse_time
from orchestrator.sweeps.state import SweepState

STATE_FORMAT = 1


def identity(event: CloudEvent) -> str:
    """The dedup key of an event: CloudEvents says (source, id) is unique."""
    return f"{event.source}\n{event.id}"


_NO_ITEMS: Mapping[Any, Any] = MappingProxyType({})
"""An empty mapping nobody can change, shared by every state that has nothing in one."""


def _no_items() -> Mapping[Any, Any]:
    return _NO_ITEMS


@dataclass(frozen=True, slots=True)
class Entry:
    """One event counted in a rule's window."""

    event_id: str
    identity: str
    time: datetime
    amount: float = 0.0
    """What the event adds to the window's `sum` (0 for a rule without one)."""


@dataclass(frozen=True, slots=True)
class Joined:
    """The latest event of one join type for the key."""

    event: Mapping[str, Any]
    """The event in the CloudEvents JSON format (`orchestrator/event_json.py`): templates may
    read any field of it."""
    identity: str
    time: datetime


@dataclass(frozen=True, slots=True)
class Pending:
    """A launch whose condition held but which waits: debounce, queue or budget."""

    reason: Reason
    since: datetime
    due: datetime | None
    """When a timer retries it (None: waits for a job to finish)."""
    event: Mapping[str, Any]
    """The event that (last) completed the condition, in the CloudEvents JSON format, for
    templating."""
    event_ids: tuple[str, ...] = ()
    """Every event id that took part while it waited (the window may expire meanwhile)."""


@dataclass(frozen=True, slots=True)
class RuleState:
    """Everything one rule remembers about one key."""

    entries: tuple[Entry, ...] = ()
    """The window: events counted and not yet consumed by a launch, in event-time order."""
    joined: Mapping[str, Joined] = field(default_factory=_no_items)
    """The latest event of each join type, by type."""
    seen: Mapping[str, datetime] = field(default_factory=_no_items)
    """Identities already consumed by a launch, by event time (for `duplicate`)."""
    last_launch: datetime | None = None
    launches: tuple[datetime, ...] = ()
    """Launch times of the last day (for `max_launches_per_day`)."""
    running: str | None = None
    """The job this rule launched for the key and that has not finished."""
    pending: Pending | None = None

    @property
    def is_idle(self) -> bool:
        """Whether nothing is left to remember (the key's state can drop the rule)."""
        return not (
            self.entries
            or self.joined
            or self.seen
            or self.running
            or self.pending
            or self.launches
            or self.last_launch
        )


_EMPTY_RULE_STATE = RuleState()


@dataclass(frozen=True, slots=True)
class Buffered:
    """An event held until its allowed lateness has passed, so events are counted in
    event-time order whatever order they arrived in."""

    event: Mapping[str, Any]
    """The event in the CloudEvents JSON format (`orchestrator/event_json.py`)."""
    identity: str
    time: datetime
    """Its event time (or arrival time, when it has none)."""
    release_at: datetime
    """Processing time at which its allowed lateness has passed."""


@dataclass(frozen=True, slots=True)
class InputPosition:
    """Where the producer's record of an event sits: its input partition, named
    `topic/partition`, and its offset there. Offsets order the records of one partition as
    their producer sent them, whatever order a consumer later delivers them in."""

    partition: str
    offset: int


@dataclass(frozen=True, slots=True)
class KeyState:
    """All rules' state for one key."""

    horizon: datetime | None = None
    """Latest event time processed; an event older than this is `late`."""
    buffer: tuple[Buffered, ...] = ()
    """Events held until their allowed lateness has passed, in event-time order."""
    rules: Mapping[str, RuleState] = field(default_factory=_no_items)
    wakeups: tuple[datetime, ...] = ()
    """Processing times at which `tick` has work (computed by the engine)."""
    sequence: int | None = None
    """Highest delivery sequence (the keyed topic's offset) of an event processed for this key:
    an event delivered with a lower one was sent earlier and only arrives late because the
    transport re-delivered it, so it is counted rather than ruled `late`."""
    positions: tuple[InputPosition, ...] = ()
    """Highest input offset processed for this key, per input partition: an event whose input
    record sits before one already processed from the same partition was sent earlier, and
    arrives behind it only because a consumer read it out of order (faust can skip a fetched
    record around a rebalance and read it again after later ones, on the input topic as on
    the keyed one), so it too is counted rather than ruled `late`."""
    sweeps: Mapping[str, SweepState] = field(default_factory=_no_items)
    """The hyperparameter sweeps of this key's rules, by name (the launch decision's job
    name), running or recently ended (`orchestrator/sweeps/`). The service, not the engine,
    changes them; they are kept here so that a sweep is stored with the decisions that
    started it, in the same changelog."""

    def rule(self, name: str) -> RuleState:
        """This key's state of rule *name* (empty when the rule has none yet)."""
        return self.rules.get(name) or _EMPTY_RULE_STATE

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "horizon": _time(self.horizon),
            "buffer": [
                {
                    "event": dict(b.event),
                    "identity": b.identity,
                    "time": _time(b.time),
                    "release_at": _time(b.release_at),
                }
                for b in self.buffer
            ],
            "rules": {name: _rule_to_json(state) for name, state in sorted(self.rules.items())},
            "wakeups": [_time(t) for t in self.wakeups],
            "sequence": self.sequence,
            "positions": [[p.partition, p.offset] for p in self.positions],
            # Only with sweeps: a state without any writes what it wrote before they existed.
            **(
                {"sweeps": {name: s.to_json() for name, s in sorted(self.sweeps.items())}}
                if self.sweeps
                else {}
            ),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeyState:
        """The inverse of `to_json`.

        Raises:
            ValueError: the data is not a key state this version wrote.
        """
        if not isinstance(data, Mapping) or data.get("format") != STATE_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"unknown key state format {found!r}")
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"malformed key state: {exc!r}") from exc

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> KeyState:
        return cls(
            horizon=_parse(data.get("horizon")),
            buffer=tuple(
                Buffered(
                    event=b["event"],
                    identity=b["identity"],
                    time=parse_time(b["time"]),
                    release_at=parse_time(b["release_at"]),
                )
                for b in data.get("buffer", ())
            ),
            rules={name: _rule_from_json(value) for name, value in data.get("rules", {}).items()},
            wakeups=tuple(parse_time(t) for t in data.get("wakeups", ())),
            sequence=data.get("sequence"),
            # Absent in states written before input positions were kept.
            positions=tuple(
                InputPosition(partition=str(partition), offset=int(offset))
                for partition, offset in data.get("positions", ())
            ),
            sweeps={
                name: SweepState.from_json(value) for name, value in data.get("sweeps", {}).items()
            },
        )


def _time(value: datetime | None) -> str | None:
    return format_time(value) if value is not None else None


def _parse(value: Any) -> datetime | None:
    return parse_time(value) if value is not None else None


def _rule_to_json(state: RuleState) -> dict[str, Any]:
    pending = state.pending
    return {
        "entries": [[e.event_id, e.identity, _time(e.time), e.amount] for e in state.entries],
        "joined": {
            name: {"event": dict(j.event), "identity": j.identity, "time": _time(j.time)}
            for name, j in sorted(state.joined.items())
        },
        "seen": {name: _time(at) for name, at in sorted(state.seen.items())},
        "last_launch": _time(state.last_launch),
        "launches": [_time(t) for t in state.launches],
        "running": state.running,
        "pending": None
        if pending is None
        else {
            "reason": pending.reason.value,
            "since": _time(pending.since),
            "due": _time(pending.due),
            "event": dict(pending.event),
            "event_ids": list(pending.event_ids),
        },
    }


def _rule_from_json(data: Mapping[str, Any]) -> RuleState:
    pending = data.get("pending")
    return RuleState(
        entries=tuple(
            Entry(event_id=event_id, identity=ident, time=parse_time(at), amount=float(amount))
            for event_id, ident, at, amount in data.get("entries", ())
        ),
        joined={
            name: Joined(event=j["event"], identity=j["identity"], time=parse_time(j["time"]))
            for name, j in data.get("joined", {}).items()
        },
        seen={name: parse_time(at) for name, at in data.get("seen", {}).items()},
        last_launch=_parse(data.get("last_launch")),
        launches=tuple(parse_time(t) for t in data.get("launches", ())),
        running=data.get("running"),
        pending=None
        if not pending
        else Pending(
            reason=Reason(pending["reason"]),
            since=parse_time(pending["since"]),
            due=_parse(pending.get("due")),
            event=pending["event"],
            event_ids=tuple(pending.get("event_ids", ())),
        ),
    )

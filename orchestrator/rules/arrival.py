"""Arrival: whether an event is a duplicate, a re-delivery or late, and holding it until its
allowed lateness has passed.

`engine.evaluate` asks these questions of every event before any rule counts it, in this
order: a duplicate first (a re-delivered duplicate keeps its old time and would otherwise read
as late), then whether the transport re-delivered it (by its delivery sequence or input
position), then lateness. Events within the allowed lateness are held in the key's buffer and
released in event-time order, which is what makes arrival order not matter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta

from orchestrator import event_json
from orchestrator.events import CloudEvent
from orchestrator.rules.state import Buffered, InputPosition, KeyState, RuleState


def already_counted(rule_state: RuleState, identity: str) -> bool:
    """Whether the event of *identity* is in the rule's window, joins or consumed ids."""
    return (
        identity in rule_state.seen
        or any(entry.identity == identity for entry in rule_state.entries)
        or any(item.identity == identity for item in rule_state.joined.values())
    )


def is_duplicate(state: KeyState, rule_names: Iterable[str], identity: str) -> bool:
    """Whether the key already holds the event of *identity*, or one of the rules counted it."""
    return any(held.identity == identity for held in state.buffer) or any(
        already_counted(state.rules[name], identity) for name in rule_names if name in state.rules
    )


def take_delivery(
    state: KeyState, *, sequence: int | None, position: InputPosition | None
) -> tuple[KeyState, bool]:
    """*state* with the event's delivery *sequence* and input *position* taken in, and whether
    they show that the transport re-delivered the event behind ones sent after it."""
    redelivered = False
    if sequence is not None:
        if state.sequence is not None and sequence < state.sequence:
            redelivered = True
        else:
            state = replace(state, sequence=sequence)
    if position is not None:
        positions, behind = _with_position(state.positions, position)
        redelivered = redelivered or behind
        if positions != state.positions:
            state = replace(state, positions=positions)
    return state, redelivered


def _with_position(
    positions: tuple[InputPosition, ...], position: InputPosition
) -> tuple[tuple[InputPosition, ...], bool]:
    """*positions* with *position* taken in, and whether *position* is behind one of them."""
    for n, known in enumerate(positions):
        if known.partition == position.partition:
            if position.offset < known.offset:
                return positions, True
            return (*positions[:n], position, *positions[n + 1 :]), False
    return (*positions, position), False


def is_late(state: KeyState, time: datetime, *, redelivered: bool) -> bool:
    """Whether an event of *time* is behind what the key already processed (a re-delivered
    one is not: it is counted where it belongs)."""
    return state.horizon is not None and time < state.horizon and not redelivered


def lost_its_place(rule_state: RuleState, time: datetime, *, behind: bool) -> bool:
    """Whether a re-delivered (*behind*) event comes after the launch that consumed its place
    in the window: counting it now would count it in a window it never belonged to."""
    return behind and rule_state.last_launch is not None and time <= rule_state.last_launch


def hold(
    state: KeyState, event: CloudEvent, *, identity: str, time: datetime, lateness: timedelta
) -> KeyState:
    """*state* with *event* held in the buffer until its allowed *lateness* has passed."""
    held = Buffered(
        event=event_json.to_json(event), identity=identity, time=time, release_at=time + lateness
    )
    buffer = tuple(sorted((*state.buffer, held), key=lambda b: (b.time, b.identity)))
    return replace(state, buffer=buffer)


def release(state: KeyState, *, cutoff: datetime) -> tuple[KeyState, tuple[Buffered, ...]]:
    """*state* without the held events of time *cutoff* or earlier, and those events."""
    released = tuple(held for held in state.buffer if held.time <= cutoff)
    if not released:
        return state, ()
    return replace(state, buffer=tuple(b for b in state.buffer if b.time > cutoff)), released

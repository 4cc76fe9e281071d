"""Count, sum and join windows: what a rule has counted for a key, and whether it is enough.

`engine.py` counts each released event into the rules it reaches (`count`, `join`) after
dropping what the event's time has expired (`expire`); `launching.py` asks `progress` and
`missing_joins` whether the condition holds and consumes the window when it launches;
`pruning.py` expires windows as processing time moves on.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from orchestrator import event_json
from orchestrator.events import CloudEvent
from orchestrator.rules.durations import format_duration
from orchestrator.rules.expressions import Activation, EvaluationError
from orchestrator.rules.model import Join, Rule
from orchestrator.rules.state import Entry, Joined, RuleState

DAY = timedelta(days=1)
"""How long launch times are kept: `max_launches_per_day` counts the launches of a day."""


def expire(rule: Rule, rule_state: RuleState, time: datetime) -> RuleState:
    """*rule_state* without the window entries, joins and launch times that no longer matter
    at event time *time* (the same object when nothing expired)."""
    start = time - rule.window
    entries = tuple(entry for entry in rule_state.entries if entry.time > start)
    launches = tuple(t for t in rule_state.launches if t > time - DAY)
    joined = {
        name: item
        for name, item in rule_state.joined.items()
        if any(join.type == name and item.time > time - join.within for join in rule.joins)
    }
    if (
        len(entries) == len(rule_state.entries)
        and len(launches) == len(rule_state.launches)
        and len(joined) == len(rule_state.joined)
    ):
        return rule_state
    if len(joined) == len(rule_state.joined):
        return replace(rule_state, entries=entries, launches=launches)
    return replace(rule_state, entries=entries, joined=joined, launches=launches)


def amount(rule: Rule, activation: Activation) -> float:
    """What the event adds to the rule's `sum` (0 without one).

    Raises:
        EvaluationError: `sum.of` failed on the event or gave something not a number.
    """
    if rule.sum is None:
        return 0.0
    try:
        value = rule.sum.of.evaluate(activation)
    except EvaluationError as exc:
        raise EvaluationError(f"sum.of: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EvaluationError(f"sum.of gave {value!r}, not a number")
    return float(value)


def count(
    rule_state: RuleState,
    event: CloudEvent,
    *,
    identity: str,
    time: datetime,
    amount: float,
) -> RuleState:
    """*rule_state* with *event* counted in its window, which stays in event-time order
    (expiry relies on it) even when a re-delivered event arrives behind later ones."""
    entry = Entry(event_id=event.id, identity=identity, time=time, amount=amount)
    entries = tuple(sorted((*rule_state.entries, entry), key=lambda e: e.time))
    return replace(rule_state, entries=entries)


def join(
    rule_state: RuleState, join: Join, event: CloudEvent, *, identity: str, time: datetime
) -> RuleState:
    """*rule_state* with *event* as the latest event of its join type (an older event does not
    replace a newer one)."""
    joined = dict(rule_state.joined)
    newer = joined.get(join.type)
    if newer is None or newer.time <= time:
        joined[join.type] = Joined(event=event_json.to_json(event), identity=identity, time=time)
    return replace(rule_state, joined=joined)


def window_sum(rule: Rule, rule_state: RuleState) -> float | None:
    """The window's `sum` (None for a rule without one)."""
    return sum(entry.amount for entry in rule_state.entries) if rule.sum is not None else None


def progress(rule: Rule, rule_state: RuleState) -> tuple[bool, str]:
    """Whether the count (and sum) condition holds, and a sentence saying how far it is."""
    counted = len(rule_state.entries)
    total = window_sum(rule, rule_state)
    holds = counted >= rule.count
    if rule.sum is not None:
        assert total is not None
        holds = holds and total >= rule.sum.at_least
    return holds, progress_message(rule, counted, total)


def progress_message(rule: Rule, counted: int, total: float | None) -> str:
    """How far the window is, as `accumulate` records say it."""
    window = format_duration(rule.window)
    text = f"{counted} of {rule.count} events in the {window} window"
    if rule.sum is None:
        return text
    summed = f"sum {total:g} of {rule.sum.at_least:g} in the {window} window"
    return summed if rule.count == 1 else f"{text}, {summed}"


def missing_joins(rule: Rule, rule_state: RuleState, time: datetime) -> list[str]:
    """The joins the rule still waits for at *time*, as `type within duration`."""
    return [
        f"{join.type} within {format_duration(join.within)}"
        for join in rule.joins
        if join.type not in rule_state.joined
        or rule_state.joined[join.type].time <= time - join.within
    ]


def window_ids(rule_state: RuleState) -> tuple[str, ...]:
    """The ids of the events in the window: counted ones first, then joined ones by time."""
    joined = sorted(rule_state.joined.values(), key=lambda j: (j.time, j.identity))
    return tuple(e.event_id for e in rule_state.entries) + tuple(str(j.event["id"]) for j in joined)

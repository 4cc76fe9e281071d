"""The trigger-rule engine: `(rules, state, event | observation | tick, now) → (state', records)`.

Pure: no I/O, no clock reads, no randomness. The wiring in `handlers/` calls it for the
service and `tuneloop simulate` calls exactly the same functions, so the two cannot disagree.

How the wiring drives it, per event:
  1. `route(rules, event)` gives every (rule, key) the event is relevant to; repartition the
     event by key so that one worker owns all state of a key. Also publish
     `routing_errors(rules, event, now=...)` (events a rule looked at but could not key).
  2. For each DISTINCT key: `evaluate(rules, state_of_key, event, key=key, now=now)`; store
     the new state, publish every record to the audit topic, call the backend for `launch`
     (`record.job`) and `cancel` (`record.job_name`) records.
  3. Call `tick(...)` for a key when `next_wakeup(state)` is due, and `observe(...)` when a
     job the engine launched finishes.

Time: windows, joins, cooldown and debounce use event time. An event whose time is more than
`allowed_lateness` behind what the key has already processed is `late`; events within it are
held and counted in event-time order, which is what makes arrival order not matter.

Global `limits.max_concurrent_jobs` spans keys, so it is not in `KeyState`: the wiring keeps
the number of running jobs and asks `may_launch(rules, running=n)` before each launch, holding
(and retrying) the launch while it says no. The engine's per rule+key limits do not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any

from orchestrator.events import CloudEvent
from orchestrator.jobs.model import LoraSettings, Resources, TrainingRequest, TrainingSettings
from orchestrator.jobs.naming import job_name
from orchestrator.ledger import DecisionRecord, Outcome, Reason, decision_id, format_time
from orchestrator.rules.durations import format_duration
from orchestrator.rules.expressions import Activation, EvaluationError, event_variables
from orchestrator.rules.fastpath import FastPathError, NeedsCel
from orchestrator.rules.model import Concurrency, Mode, Rule, RuleSet, Trigger, accepts_source
from orchestrator.rules.state import (
    Buffered,
    Entry,
    InputPosition,
    Joined,
    KeyState,
    Pending,
    RuleState,
    event_from_json,
    event_to_json,
    identity,
)
from orchestrator.rules.templating import Template, TemplateError, check_value

__all__ = [
    "InputPosition",
    "JobFinished",
    "KeyState",
    "Route",
    "RuleSet",
    "evaluate",
    "may_launch",
    "next_wakeup",
    "observe",
    "route",
    "routing_errors",
    "tick",
]

DAY = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Route:
    """One (rule, key) an event is relevant to."""

    rule: str
    key: str


@dataclass(frozen=True, slots=True)
class JobFinished:
    """A job the engine launched reached a final phase (from the runtimes' observations)."""

    rule: str
    key: str
    job_name: str
    succeeded: bool
    at: datetime


@dataclass(frozen=True, slots=True)
class _Match:
    trigger: Trigger
    key: str | None
    error: str | None = None


def _matches(rules: RuleSet, event: CloudEvent, time: datetime | None = None) -> tuple[_Match, ...]:
    at = event.time or time or _EPOCH
    found, _ = _evaluate_triggers(rules, event, at)
    return found


def _evaluate_triggers(
    rules: RuleSet, event: CloudEvent, at: datetime
) -> tuple[tuple[_Match, ...], Activation | None]:
    triggers = rules.by_type.get(event.type)
    if not triggers:
        return (), None
    variables = event_variables(event, time=at, data_fields=None)
    activation = Activation({"event": variables}, data_fields=rules.data_fields.get(event.type))
    root = activation.variables
    source = event.source
    # Rules of one type mostly share their source globs: test each distinct glob once.
    accepted: dict[tuple[str, ...], bool] = {}
    found: list[_Match] = []
    for trigger in triggers:
        patterns = trigger.sources
        ok = accepted.get(patterns)
        if ok is None:
            ok = accepted[patterns] = accepts_source(patterns, source)
        if not ok:
            continue
        # The compiled fast path, called directly; anything but a bool `where` and a string
        # key (an error, a value for CEL) goes through `_match`, which says what went wrong.
        where, key = trigger.where, trigger.key
        if where is not None:
            fast = where.fast
            try:
                passed = fast(root) if fast is not None else None
            except (FastPathError, NeedsCel):
                passed = None
            if passed is False:
                continue
            if passed is not True:
                _append_match(found, trigger, activation)
                continue
        fast = key.fast
        try:
            value = fast(root) if fast is not None else None
        except (FastPathError, NeedsCel):
            value = None
        if type(value) is str and value:
            found.append(_Match(trigger, value))
        else:
            _append_match(found, trigger, activation)
    return tuple(found), activation


def _activation(rules: RuleSet, event: CloudEvent, time: datetime) -> Activation:
    """What expressions see of *event*; CEL sees only the data fields the rule set reads."""
    variables = event_variables(event, time=time, data_fields=None)
    return Activation({"event": variables}, data_fields=rules.data_fields.get(event.type))


def _append_match(found: list[_Match], trigger: Trigger, activation: Activation) -> None:
    match = _match(trigger, activation)
    if match is not None:
        found.append(match)


def _match(trigger: Trigger, activation: Activation) -> _Match | None:
    """Whether *trigger* (whose source glob accepts the event) accepts it, and under which
    key (or why it could not tell)."""
    where = trigger.where
    if where is not None:
        try:
            accepted = where.evaluate(activation)
        except EvaluationError as exc:
            return _Match(trigger, None, f"where: {exc}")
        if accepted is False:
            return None
        if accepted is not True:
            return _Match(trigger, None, f"where gave {accepted!r}, not a bool")
    try:
        key = trigger.key.evaluate(activation)
    except EvaluationError as exc:
        return _Match(trigger, None, f"key: {exc}")
    if not isinstance(key, str) or not key:
        return _Match(trigger, None, f"key gave {key!r}, not a non-empty string")
    return _Match(trigger, key)


def route(rules: RuleSet, event: CloudEvent) -> tuple[Route, ...]:
    """Every (rule, key) whose `on` selector or one of whose joins accepts *event*."""
    seen: dict[Route, None] = {}
    for match in _matches(rules, event):
        if match.key is not None:
            seen[Route(match.trigger.rule.name, match.key)] = None
    return tuple(seen)


def routing_errors(
    rules: RuleSet, event: CloudEvent, *, now: datetime
) -> tuple[DecisionRecord, ...]:
    """`error` records for rules that looked at *event* but could not evaluate its `where` or
    key (a missing field, a wrong type): the answer to "why did this event do nothing?"."""
    at = event.time or now
    records = []
    for match in _matches(rules, event, now):
        if match.error is not None:
            rule = match.trigger.rule
            records.append(
                _record(
                    rule,
                    "",
                    Outcome.ERROR,
                    Reason.EXPRESSION_ERROR,
                    time=at,
                    event_ids=(event.id,),
                    message=match.error,
                )
            )
    return tuple(records)


def may_launch(rules: RuleSet, *, running: int) -> bool:
    """Whether the global `limits.max_concurrent_jobs` allows one more job now."""
    limit = rules.limits.max_concurrent_jobs
    return limit is None or running < limit


# --- the three inputs ---------------------------------------------------------------------


def evaluate(
    rules: RuleSet,
    state: KeyState | None,
    event: CloudEvent,
    *,
    key: str,
    now: datetime,
    arrived_at: datetime | None = None,
    sequence: int | None = None,
    position: InputPosition | None = None,
) -> tuple[KeyState, tuple[DecisionRecord, ...]]:
    """Decide about *event* for every rule routed to *key*; also run timers due by *now*.

    *sequence* is the event's delivery order for this key (the wiring passes the keyed
    topic's offset) and *position* where its producer's record sits on the input topic. An
    event delivered with a lower sequence than one already processed, or from an input
    position before one already processed from the same partition, was sent before it and
    only arrives behind it because the transport re-delivered it (a rebalance, on either
    topic): it is counted where it belongs instead of being ruled `late`, unless a launch
    already consumed its place in the window. Without either, event time alone decides.
    """
    state = state or KeyState()
    time = event.event_time(arrived_at or now)
    rule_names = _rules_for(rules, event, key, time)
    if not rule_names:
        return _advance(rules, state, key, now)
    ident = identity(event)
    # Duplicates first: a redelivered event has its original (old) time and would otherwise
    # read as late, which hides what happened.
    known = state.rules
    if (state.buffer and any(b.identity == ident for b in state.buffer)) or any(
        _already_counted(known[name], ident) for name in rule_names if name in known
    ):
        records = tuple(
            _record(
                rules.rule(name),
                key,
                Outcome.SUPPRESS,
                Reason.DUPLICATE,
                time=time,
                event_ids=(event.id,),
                message="event already received (same source and id)",
            )
            for name in rule_names
        )
        return state, records
    redelivered = False
    if sequence is not None:
        if state.sequence is not None and sequence < state.sequence:
            redelivered = True
        else:
            state = replace(state, sequence=sequence)
    if position is not None:
        positions, behind = _with_position(state.positions, position)
        redelivered = redelivered or behind
        if positions is not state.positions:
            state = replace(state, positions=positions)
    if state.horizon is not None and time < state.horizon and not redelivered:
        lag = format_duration(state.horizon - time)
        message = (
            f"event time is {lag} behind what this key already processed "
            f"(allowed lateness {format_duration(rules.allowed_lateness)})"
        )
        records = tuple(
            _record(
                rules.rule(name),
                key,
                Outcome.LATE,
                None,
                time=time,
                event_ids=(event.id,),
                message=message,
            )
            for name in rule_names
        )
        return state, records
    if not state.buffer and time <= now - rules.allowed_lateness:
        # Nothing held and the event is due: skip the buffer (the common case without lateness).
        return _advance(rules, state, key, now, due=(event, time, ident))
    held = Buffered(
        event=event_to_json(event),
        identity=ident,
        time=time,
        release_at=time + rules.allowed_lateness,
    )
    buffer = tuple(sorted((*state.buffer, held), key=lambda b: (b.time, b.identity)))
    state = replace(state, buffer=buffer)
    return _advance(rules, state, key, now)


def _with_position(
    positions: tuple[InputPosition, ...], position: InputPosition
) -> tuple[tuple[InputPosition, ...], bool]:
    """*positions* with *position* taken in, and whether *position* is behind one of them."""
    for n, known in enumerate(positions):
        if known.partition == position.partition:
            if position.offset < known.offset:
                return positions, True
            if position.offset == known.offset:
                return positions, False
            return (*positions[:n], position, *positions[n + 1 :]), False
    return (*positions, position), False


def tick(
    rules: RuleSet, state: KeyState | None, *, key: str, now: datetime
) -> tuple[KeyState, tuple[DecisionRecord, ...]]:
    """Release held events, fire due debounces, retry deferred launches, drop expired state."""
    return _advance(rules, state or KeyState(), key, now)


def observe(
    rules: RuleSet, state: KeyState | None, observation: JobFinished, *, key: str, now: datetime
) -> tuple[KeyState, tuple[DecisionRecord, ...]]:
    """A job finished: release `forbid`, start a `queue`d launch."""
    state = state or KeyState()
    current = state.rules.get(observation.rule)
    if current is None or current.running != observation.job_name:
        return _advance(rules, state, key, now)
    rule_state = replace(current, running=None)
    records: list[DecisionRecord] = []
    try:
        rule = rules.rule(observation.rule)
    except KeyError:
        rule = None
    pending = rule_state.pending
    if rule is not None and pending is not None and pending.reason is Reason.QUEUED:
        at = max(observation.at, pending.since)
        decider = _Decider(rules, rule, key)
        rule_state, more = _attempt(decider, rule_state, at=at, event=pending.event)
        records += more
    state = _with_rule(state, observation.rule, rule_state)
    state, more_records = _advance(rules, state, key, now, changed=observation.rule)
    return state, (*records, *more_records)


def next_wakeup(state: KeyState) -> datetime | None:
    """When `tick` next has work for this key (None: nothing until the next event)."""
    return min(state.wakeups) if state.wakeups else None


# --- inside -------------------------------------------------------------------------------


def _rules_for(rules: RuleSet, event: CloudEvent, key: str, time: datetime) -> tuple[str, ...]:
    names = {m.trigger.rule.name: None for m in _matches(rules, event, time) if m.key == key}
    return tuple(names)


def _with_rule(state: KeyState, name: str, rule_state: RuleState) -> KeyState:
    return replace(state, rules={**state.rules, name: rule_state})


def _advance(
    rules: RuleSet,
    state: KeyState,
    key: str,
    now: datetime,
    *,
    due: tuple[CloudEvent, datetime, str] | None = None,
    changed: str | None = None,
) -> tuple[KeyState, tuple[DecisionRecord, ...]]:
    """Process held events due by *now* in event-time order, with timers in between.

    *due* is an event that needs no holding (nothing else is held and its time has come), with
    its identity, already checked not to be a duplicate for any rule routed to *key*.
    *changed* names a rule whose state the caller changed without a record (a job ended).
    """
    cutoff = now - rules.allowed_lateness
    records: list[DecisionRecord] = []
    timers_due = bool(state.wakeups) and now >= state.wakeups[0]
    released: list[tuple[datetime, Buffered | CloudEvent]] = []
    if state.buffer:
        released = [(b.time, b) for b in state.buffer if b.time <= cutoff]
        if released:
            buffer = tuple(b for b in state.buffer if b.time > cutoff)
            state = replace(state, buffer=buffer)
    checked = None
    if due is not None:
        released.append((due[1], due[0]))
        checked = due[2]
    for time, item in released:
        # Timers due before this event fire first, exactly as if no event had been held.
        if timers_due:
            state = _fire_timers(
                rules, state, key=key, until=time, records=records, inclusive=False
            )
        if isinstance(item, CloudEvent):
            event, ident = item, checked
        else:
            event, ident = event_from_json(item.event), None
        state = _process(
            rules, state, key=key, event=event, time=time, records=records, checked=ident
        )
    if timers_due or released:
        state = _fire_timers(rules, state, key=key, until=cutoff, records=records, inclusive=True)
    touched = None
    if not timers_due:
        touched = {r.rule for r in records}
        if changed:
            touched.add(changed)
    state = _prune(rules, state, now=now, touched=touched)
    return state, tuple(records)


@dataclass(frozen=True, slots=True)
class _Decider:
    """One rule deciding for one key: what every step below needs, bundled."""

    rules: RuleSet
    rule: Rule
    key: str

    def record(
        self,
        outcome: Outcome,
        reason: Reason | None,
        *,
        time: datetime,
        event_ids: tuple[str, ...],
        message: str,
        job_name: str | None = None,
        rule_state: RuleState | None = None,
    ) -> DecisionRecord:
        rule = self.rule
        if rule_state is None:
            count = total = None
        else:
            count = len(rule_state.entries)
            total = _window_sum(rule, rule_state)
        return DecisionRecord(
            outcome=outcome,
            reason=reason,
            rule=rule.name,
            rule_version=rule.version,
            key=self.key,
            time=time,
            event_ids=event_ids,
            message=message,
            job_name=job_name,
            window_count=count,
            window_sum=total,
        )


def _record(
    rule: Rule,
    key: str,
    outcome: Outcome,
    reason: Reason | None,
    *,
    time: datetime,
    event_ids: tuple[str, ...],
    message: str,
) -> DecisionRecord:
    # For records made outside a decision step (late, duplicate, routing errors).
    return _Decider(_NO_RULES, rule, key).record(
        outcome, reason, time=time, event_ids=event_ids, message=message
    )


_NO_RULES = RuleSet(rules=(), version="")


def _process(  # noqa: PLR0912, PLR0915 - split by concern in the next step
    rules: RuleSet,
    state: KeyState,
    *,
    key: str,
    event: CloudEvent,
    time: datetime,
    records: list[DecisionRecord],
    checked: str | None = None,
) -> KeyState:
    """Count (or join) one released event into every rule routed to *key*, then decide, and
    advance the horizon to it.

    *checked*: the event's identity, when the caller already found it counted by no rule
    routed to *key* (nothing between that check and this call can count it; only this call,
    when the event reaches a rule twice, by its `on` and by a join).
    """
    ident = checked or identity(event)
    horizon = state.horizon
    behind = horizon is not None and time < horizon  # a re-delivered event
    updated = dict(state.rules)
    ids = (event.id,)
    reached: set[str] = set()
    for match in _matches(rules, event, time):
        if match.key != key:
            continue
        rule = match.trigger.rule
        rule_state = _expire(rule, updated.get(rule.name) or state.rule(rule.name), time)
        unchecked = checked is None or rule.name in reached
        reached.add(rule.name)
        if unchecked and _already_counted(rule_state, ident):
            message = "event already counted (same source and id)"
            records.append(
                _Decider(rules, rule, key).record(
                    Outcome.SUPPRESS, Reason.DUPLICATE, time=time, event_ids=ids, message=message
                )
            )
            continue
        join = match.trigger.join
        if behind and rule_state.last_launch is not None and time <= rule_state.last_launch:
            message = "re-delivered after the launch that consumed its place in the window"
            records.append(
                _Decider(rules, rule, key).record(
                    Outcome.LATE, None, time=time, event_ids=ids, message=message
                )
            )
            continue
        if join is not None:
            joined = dict(rule_state.joined)
            newer = joined.get(join.type)
            if newer is None or newer.time <= time:
                joined[join.type] = Joined(event=event_to_json(event), identity=ident, time=time)
            rule_state = replace(rule_state, joined=joined)
        else:
            amount = 0.0
            if rule.sum is not None:
                try:
                    amount = _amount(rule, _activation(rules, event, time))
                except EvaluationError as exc:
                    records.append(
                        _Decider(rules, rule, key).record(
                            Outcome.ERROR,
                            Reason.EXPRESSION_ERROR,
                            time=time,
                            event_ids=ids,
                            message=str(exc),
                        )
                    )
                    continue
            entry = Entry(event_id=event.id, identity=ident, time=time, amount=amount)
            entries = (*rule_state.entries, entry)
            if behind:  # keep entries in event-time order, which expiry relies on
                entries = tuple(sorted(entries, key=lambda e: e.time))
            rule_state = replace(rule_state, entries=entries)
        count = len(rule_state.entries)
        if join is None and count < rule.count:
            # Counted, not enough yet (what `_consider` says).
            total = _window_sum(rule, rule_state)
            records.append(
                _Decider(rules, rule, key).record(
                    Outcome.ACCUMULATE,
                    None,
                    time=time,
                    event_ids=ids,
                    message=_progress_message(rule, count, total),
                    rule_state=rule_state,
                )
            )
        else:
            rule_state, more = _consider(
                _Decider(rules, rule, key),
                rule_state,
                time=time,
                event=event,
                via_join=join is not None,
            )
            records += more
        updated[rule.name] = rule_state
    if horizon is None or time > horizon:
        horizon = time
    return replace(state, horizon=horizon, rules=updated)


def _amount(rule: Rule, activation: Activation) -> float:
    assert rule.sum is not None
    of = rule.sum.of
    if of.fast is not None:
        try:
            value = of.fast(activation.variables)
        except (FastPathError, NeedsCel):
            pass
        else:
            if type(value) is int or type(value) is float:
                return float(value)
    try:
        value = rule.sum.of.evaluate(activation)
    except EvaluationError as exc:
        raise EvaluationError(f"sum.of: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EvaluationError(f"sum.of gave {value!r}, not a number")
    return float(value)


def _already_counted(rule_state: RuleState, ident: str) -> bool:
    return (
        ident in rule_state.seen
        or ident in map(_IDENTITY, rule_state.entries)  # a scan in C: windows can be long
        or any(j.identity == ident for j in rule_state.joined.values())
    )


_IDENTITY = attrgetter("identity")
_PENDING = attrgetter("pending")


def _expire(rule: Rule, rule_state: RuleState, time: datetime) -> RuleState:
    """Drop window entries, joins and launch times that no longer matter at *time*."""
    start = time - rule.window
    entries, joined, launches = rule_state.entries, rule_state.joined, rule_state.launches
    entries_fresh = not entries or entries[0].time > start
    launches_fresh = not launches or min(launches) > time - DAY
    if entries_fresh and launches_fresh and not joined:
        return rule_state  # the common case, kept cheap: entries are in event-time order
    # Rebuild only the parts where something expired (once windows expire, this runs for
    # every key's oldest entry).
    if not entries_fresh:
        entries = tuple(e for e in entries if e.time > start)
    if not launches_fresh:
        launches = tuple(t for t in launches if t > time - DAY)
    if joined:
        kept = {
            name: j
            for name, j in joined.items()
            if any(join.type == name and j.time > time - join.within for join in rule.joins)
        }
        if len(kept) != len(joined):
            joined = kept
    if (entries, joined, launches) == (
        rule_state.entries,
        rule_state.joined,
        rule_state.launches,
    ):
        return rule_state
    return replace(rule_state, entries=entries, joined=joined, launches=launches)


def _progress(rule: Rule, rule_state: RuleState) -> tuple[bool, str]:
    """Whether the count/sum condition holds, and a sentence saying how far it is."""
    count = len(rule_state.entries)
    total = _window_sum(rule, rule_state)
    holds = count >= rule.count
    if rule.sum is not None:
        assert total is not None
        holds = holds and total >= rule.sum.at_least
    return holds, _progress_message(rule, count, total)


def _progress_message(rule: Rule, count: int, total: float | None) -> str:
    window = format_duration(rule.window)
    counted = f"{count} of {rule.count} events in the {window} window"
    if rule.sum is None:
        return counted
    summed = f"sum {total:g} of {rule.sum.at_least:g} in the {window} window"
    return summed if rule.count == 1 else f"{counted}, {summed}"


def _missing_joins(rule: Rule, rule_state: RuleState, time: datetime) -> list[str]:
    return [
        f"{join.type} within {format_duration(join.within)}"
        for join in rule.joins
        if join.type not in rule_state.joined
        or rule_state.joined[join.type].time <= time - join.within
    ]


def _consider(
    decider: _Decider,
    rule_state: RuleState,
    *,
    time: datetime,
    event: CloudEvent,
    via_join: bool,
) -> tuple[RuleState, list[DecisionRecord]]:
    """The rule's condition after *event* was added: accumulate, debounce, or try to launch."""
    rule = decider.rule
    holds, progress = _progress(rule, rule_state)
    ids = (event.id,)

    def record(outcome: Outcome, reason: Reason | None, message: str) -> list[DecisionRecord]:
        return [
            decider.record(
                outcome, reason, time=time, event_ids=ids, message=message, rule_state=rule_state
            )
        ]

    if not holds:
        prefix = f"joined {event.type}; " if via_join else ""
        return rule_state, record(
            Outcome.ACCUMULATE, Reason.JOINED if via_join else None, prefix + progress
        )
    missing = _missing_joins(rule, rule_state, time)
    if missing:
        return rule_state, record(
            Outcome.ACCUMULATE, Reason.JOIN_MISSING, f"{progress}; waiting for {', '.join(missing)}"
        )
    pending = rule_state.pending
    window_ids = _window_ids(rule_state)
    if pending is not None and pending.reason in (Reason.QUEUED, Reason.BUDGET):
        # A launch already waits: coalesce this event into it rather than queue a second.
        coalesced = replace(
            pending, event=event_to_json(event), event_ids=_merge(pending.event_ids, window_ids)
        )
        rule_state = replace(rule_state, pending=coalesced)
        return rule_state, record(
            Outcome.DEFER, pending.reason, f"coalesced into the waiting launch; {progress}"
        )
    if rule.debounce is not None:
        since = pending.since if pending is not None else time
        due = min(since + rule.debounce.max_wait, time + rule.debounce.quiet)
        earlier = pending.event_ids if pending is not None else ()
        waiting = Pending(
            reason=Reason.DEBOUNCE_PENDING,
            since=since,
            due=due,
            event=event_to_json(event),
            event_ids=_merge(earlier, window_ids),
        )
        rule_state = replace(rule_state, pending=waiting)
        return rule_state, record(
            Outcome.SUPPRESS,
            Reason.DEBOUNCE_PENDING,
            f"{progress}; launches at {format_time(due)} unless more events come",
        )
    return _attempt(decider, rule_state, at=time, event=event_to_json(event), deciding=ids)


def _window_ids(rule_state: RuleState) -> tuple[str, ...]:
    joined = sorted(rule_state.joined.values(), key=lambda j: (j.time, j.identity))
    return tuple(e.event_id for e in rule_state.entries) + tuple(str(j.event["id"]) for j in joined)


def _merge(first: Iterable[str], second: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*first, *second)))


def _attempt(
    decider: _Decider,
    rule_state: RuleState,
    *,
    at: datetime,
    event: Mapping[str, Any],
    deciding: tuple[str, ...] | None = None,
) -> tuple[RuleState, list[DecisionRecord]]:
    """Launch now unless cooldown, concurrency or the daily budget says otherwise.

    *deciding* names the event ids the record is about when an event triggered the attempt;
    a timer or a job finishing makes the record name the whole waiting window instead.
    """
    rule = decider.rule
    pending = rule_state.pending
    ids = _merge(pending.event_ids if pending else (), _window_ids(rule_state))
    record_ids = deciding or ids
    since = pending.since if pending else at

    def record(
        outcome: Outcome, reason: Reason, message: str, job_name: str | None = None
    ) -> DecisionRecord:
        return decider.record(
            outcome,
            reason,
            time=at,
            event_ids=record_ids,
            message=message,
            job_name=job_name,
            rule_state=rule_state,
        )

    if rule_state.last_launch is not None and at < rule_state.last_launch + rule.cooldown:
        until = format_time(rule_state.last_launch + rule.cooldown)
        rule_state = replace(rule_state, pending=None)
        return rule_state, [
            record(Outcome.SUPPRESS, Reason.COOLDOWN, f"in cooldown until {until}; window kept")
        ]
    records: list[DecisionRecord] = []
    running = rule_state.running
    if running is not None and rule.mode is Mode.LIVE:
        if rule.concurrency is Concurrency.FORBID:
            rule_state = replace(rule_state, pending=None)
            return rule_state, [
                record(
                    Outcome.SUPPRESS,
                    Reason.CONCURRENCY,
                    f"job {running} still runs; window kept",
                    running,
                )
            ]
        if rule.concurrency is Concurrency.QUEUE:
            queued = Pending(
                reason=Reason.QUEUED, since=since, due=None, event=event, event_ids=ids
            )
            rule_state = replace(rule_state, pending=queued)
            return rule_state, [
                record(
                    Outcome.DEFER, Reason.QUEUED, f"queued until job {running} finishes", running
                )
            ]
        records.append(record(Outcome.CANCEL, Reason.REPLACED, f"replacing job {running}", running))
    launches = tuple(t for t in rule_state.launches if t > at - DAY)
    budget = rule.max_launches_per_day
    if budget is not None and len(launches) >= budget:
        due = min(launches) + DAY
        waiting = Pending(reason=Reason.BUDGET, since=since, due=due, event=event, event_ids=ids)
        rule_state = replace(rule_state, pending=waiting, launches=launches)
        message = (
            f"{len(launches)} launches in the last day (max {budget}); retry at {format_time(due)}"
        )
        return rule_state, [*records, record(Outcome.DEFER, Reason.BUDGET, message)]
    return _launch(
        decider, rule_state, at=at, event=event, ids=ids, launches=launches, records=records
    )


def _launch(
    decider: _Decider,
    rule_state: RuleState,
    *,
    at: datetime,
    event: Mapping[str, Any],
    ids: tuple[str, ...],
    launches: tuple[datetime, ...],
    records: list[DecisionRecord],
) -> tuple[RuleState, list[DecisionRecord]]:
    """Resolve the job and consume the window (or, in shadow mode, say what would launch)."""
    rule = decider.rule
    live = rule.mode is Mode.LIVE
    name = job_name(rule=rule.name, key=decider.key, window_event_ids=ids)
    outcome, reason = (Outcome.LAUNCH, None) if live else (Outcome.SUPPRESS, Reason.SHADOW)
    record_id = decision_id(
        rule_version=rule.version,
        key=decider.key,
        outcome=outcome,
        reason=reason,
        event_ids=ids,
        time=at,
    )
    try:
        request = _render(decider, rule_state, event=event, ids=ids, name=name, record_id=record_id)
    except TemplateError as exc:
        rule_state = replace(rule_state, pending=None)
        failure = decider.record(
            Outcome.ERROR,
            Reason.TEMPLATE_ERROR,
            time=at,
            event_ids=ids,
            message=f"launch template: {exc}; window kept",
            rule_state=rule_state,
        )
        return rule_state, [*records, failure]
    _, progress = _progress(rule, rule_state)
    message = (
        f"launched job {name}: {progress}"
        if live
        else (f"shadow mode: would launch {name}: {progress}")
    )
    launch = DecisionRecord(
        decision_id=record_id,
        outcome=outcome,
        reason=reason,
        rule=rule.name,
        rule_version=rule.version,
        key=decider.key,
        time=at,
        event_ids=ids,
        message=message,
        job=request,
        job_name=name,
        window_count=len(rule_state.entries),
        window_sum=_window_sum(rule, rule_state),
    )
    # Consumed: the next launch needs fresh events; the ids stay known for dedup.
    seen = dict(rule_state.seen)
    seen.update((entry.identity, entry.time) for entry in rule_state.entries)
    seen.update((joined.identity, joined.time) for joined in rule_state.joined.values())
    consumed = RuleState(
        seen=seen,
        last_launch=at,
        launches=(*launches, at),
        running=name if live else rule_state.running,
    )
    return consumed, [*records, launch]


def _window_sum(rule: Rule, rule_state: RuleState) -> float | None:
    return sum(map(_AMOUNT, rule_state.entries)) if rule.sum is not None else None


_AMOUNT = attrgetter("amount")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _render(
    decider: _Decider,
    rule_state: RuleState,
    *,
    event: Mapping[str, Any],
    ids: tuple[str, ...],
    name: str,
    record_id: str,
) -> TrainingRequest:
    """The launch template rendered with `event`, `key`, `window` and `joined`, type-checked.

    Raises:
        TemplateError: an expression failed, a value has the wrong type, or a templated
            runtime is outside the allowlist.
    """
    rule, rules, key = decider.rule, decider.rules, decider.key
    completing = event_from_json(event)
    completing_time = completing.event_time(_EPOCH)
    entries = rule_state.entries
    window = {
        "count": len(entries),
        "sum": sum(e.amount for e in entries),
        "first_time": entries[0].time if entries else completing_time,
        "last_time": entries[-1].time if entries else completing_time,
        "event_ids": list(ids),
    }
    joined = {
        type_name: event_variables(event_from_json(item.event), time=item.time, data_fields=None)
        for type_name, item in rule_state.joined.items()
    }
    activation = Activation(
        {
            "event": event_variables(completing, time=completing_time, data_fields=None),
            "key": key,
            "window": window,
            "joined": joined,
        }
    )
    launch = rule.launch

    def text(field: str, template: Template) -> Any:
        return check_value("", field, template.render(activation))

    runtime = text("runtime", launch.runtime)
    if not launch.runtime.is_literal and runtime not in rules.runtimes:
        allowed = ", ".join(sorted(rules.runtimes))
        raise TemplateError(f"runtime {runtime!r} is not in the allowlist ({allowed})")
    sections = {
        section: {
            field: check_value(section, field, template.render(activation))
            for field, template in getattr(launch, section).items()
        }
        for section in ("lora", "training", "resources")
    }
    return TrainingRequest(
        name=name,
        rule=rule.name,
        rule_version=rule.version,
        key=key,
        decision_id=record_id,
        causing_event_ids=ids,
        runtime=runtime,
        base_model=text("base_model", launch.base_model),
        dataset=text("dataset", launch.dataset),
        lora=LoraSettings(**sections["lora"]),
        training=TrainingSettings(**sections["training"]),
        resources=Resources(**sections["resources"]),
        output_uri=text("output_uri", launch.output_uri) if launch.output_uri else None,
        deadline_seconds=int(launch.deadline.total_seconds()) if launch.deadline else None,
        model_id=key,
    )


def _fire_timers(
    rules: RuleSet,
    state: KeyState,
    *,
    key: str,
    until: datetime,
    records: list[DecisionRecord],
    inclusive: bool,
) -> KeyState:
    """Fire debounce and budget timers due by *until* (event time), earliest first."""
    # The common case: no launch waits, nothing to fire. A scan in C (a Pending is always
    # true): this runs once or twice per event over every rule of the key.
    if not any(map(_PENDING, state.rules.values())):
        return state
    while True:
        due_rules = [
            (rule_state.pending.due, name)
            for name, rule_state in state.rules.items()
            if rule_state.pending is not None
            and rule_state.pending.due is not None
            and (rule_state.pending.due < until or (inclusive and rule_state.pending.due == until))
        ]
        if not due_rules:
            return state
        due, name = min(due_rules)
        rule_state = state.rules[name]
        pending = rule_state.pending
        assert pending is not None
        try:
            rule = rules.rule(name)
        except KeyError:  # the rule was removed by a reload: its waiting launch goes with it
            state = _with_rule(state, name, replace(rule_state, pending=None))
            continue
        decider = _Decider(rules, rule, key)
        rule_state, more = _attempt(
            decider, _expire(rule, rule_state, due), at=due, event=pending.event
        )
        records += more
        state = _with_rule(state, name, rule_state)


def _prune(
    rules: RuleSet,
    state: KeyState,
    *,
    now: datetime,
    touched: Iterable[str] | None = None,
) -> KeyState:
    """Drop what can never matter again, and compute when `tick` next has work.

    With *touched* (the rules an event just changed) and no timer due yet, only those rules
    are looked at: the others cannot have changed. The wakeup kept may then be earlier than
    needed, which costs one empty `tick`, never a missed one.
    """
    cutoff = now - rules.allowed_lateness
    previous = state.wakeups[0] if state.wakeups else None
    only_touched = touched is not None and (previous is None or now < previous)
    names = tuple(touched or ()) if only_touched else tuple(state.rules)
    kept: dict[str, RuleState] = dict(state.rules) if only_touched else {}
    wakeup = state.buffer[0].release_at if state.buffer else None
    if only_touched and previous is not None and (wakeup is None or previous < wakeup):
        wakeup = previous
    for name in names:
        rule_state = state.rules.get(name)
        if rule_state is None:
            continue
        current, rule_wakeup = _prune_rule(rules, name, rule_state, cutoff)
        if current is None:
            kept.pop(name, None)
        else:
            kept[name] = current
        if rule_wakeup is not None and (wakeup is None or rule_wakeup < wakeup):
            wakeup = rule_wakeup
    return replace(state, rules=kept, wakeups=(wakeup,) if wakeup is not None else ())


def _prune_rule(
    rules: RuleSet, name: str, rule_state: RuleState, cutoff: datetime
) -> tuple[RuleState | None, datetime | None]:
    """One rule's state without what expired (None: nothing left), and its earliest wakeup."""
    rule = rules.by_name.get(name)
    if rule is None:
        # Removed by a reload. A running job is never touched; keep knowing about it.
        return (rule_state if rule_state.running is not None else None), None
    lateness = rules.allowed_lateness
    current = _expire(rule, rule_state, cutoff)
    first_seen = None
    if current.seen:
        # Keep consumed ids as long as an event of that time could still count.
        oldest = cutoff - rule.horizon - lateness
        first_seen = min(current.seen.values())
        if first_seen <= oldest:
            seen = {i: t for i, t in current.seen.items() if t > oldest}
            current = replace(current, seen=seen)
            first_seen = min(seen.values()) if seen else None
    if (
        current.last_launch is not None
        and not current.launches
        and current.running is None
        and current.last_launch + rule.cooldown < cutoff
    ):
        current = replace(current, last_launch=None)
    wakeups = []
    if current.pending is not None and current.pending.due is not None:
        wakeups.append(current.pending.due + lateness)
    if current.entries:
        wakeups.append(current.entries[0].time + rule.window + lateness)
    for join in rule.joins:
        joined_event = current.joined.get(join.type)
        if joined_event is not None:
            wakeups.append(joined_event.time + join.within + lateness)
    if current.launches:
        wakeups.append(current.launches[0] + DAY + lateness)
    if first_seen is not None:
        wakeups.append(first_seen + rule.horizon + 2 * lateness)
    return (None if current.is_idle else current), (min(wakeups) if wakeups else None)

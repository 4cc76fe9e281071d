"""The trigger-rule engine: `(rules, state, event | observation | tick, now) → (state', records)`.

Pure: no I/O, no clock reads (`now` is passed in), no randomness, no state kept between calls:
what it knows about a key is the `KeyState` it is given and returns. The wiring in `handlers/`
calls it for the service and `tuneloop simulate` calls exactly the same functions, so the two
cannot disagree.

How the wiring drives it, per event:
  1. `route(rules, event)` gives every (rule, key) the event is relevant to; repartition the
     event by key so that one worker owns all state of a key. Also publish
     the why-not records (rules that name the event's type but did not consider it: a source
     glob, a false `where`, a `where` or key that failed) that `why_not_written` lets
     through, so that one rule writes at most a few per minute.
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

This module is the engine's public face and the loop that moves a key through event time. Each
concern has its own module beside it:

  matching.py   which rules an event reaches, under which key (selectors, `where`, `key`)
  arrival.py    duplicates, re-deliveries, lateness; holding events until they are due
  windows.py    count, sum and join windows, and whether a rule's condition holds
  launching.py  the gates a launch passes: debounce, cooldown, concurrency, budget
  rendering.py  the job a launch starts, from the rule's templates
  timers.py     waiting launches whose time has come; `next_wakeup`
  pruning.py    dropping what can never matter again; computing the next wakeup
  records.py    the decision records one rule writes for one key
  why_not.py    how many why-not records (`why_not`) a rule may write per minute
  state.py      the key's state as frozen values, and its JSON form
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from orchestrator import event_json
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import TraceContext
from orchestrator.ledger import DecisionRecord, Outcome, Reason
from orchestrator.rules import arrival, matching, pruning, timers, windows
from orchestrator.rules.durations import format_duration
from orchestrator.rules.expressions import EvaluationError
from orchestrator.rules.launching import attempt, consider
from orchestrator.rules.model import Rule, RuleSet
from orchestrator.rules.records import Decider
from orchestrator.rules.state import InputPosition, KeyState, identity
from orchestrator.rules.timers import next_wakeup
from orchestrator.rules.why_not import WhyNotLimit, take
from orchestrator.sweeps.spec import SweepSpec
from orchestrator.sweeps.state import SweepState

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
    "sweep_of",
    "tick",
    "why_not",
    "with_sweeps",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The time expressions see for an event without one when no arrival time is known."""


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


def route(rules: RuleSet, event: CloudEvent) -> tuple[Route, ...]:
    """Every (rule, key) whose `on` selector or one of whose joins accepts *event*."""
    found = matching.matches(rules, event, time=event.event_time(_EPOCH))
    routes = {Route(m.trigger.rule.name, m.key): None for m in found if m.key is not None}
    return tuple(routes)


def routing_errors(
    rules: RuleSet, event: CloudEvent, *, now: datetime
) -> tuple[DecisionRecord, ...]:
    """`error` records for rules that looked at *event* but could not evaluate its `where` or
    key (a missing field, a wrong type): the answer to "why did this event do nothing?"."""
    time = event.event_time(now)
    trace = TraceContext.of(event.extensions)
    return tuple(
        Decider(rules, match.trigger.rule, "").record(
            Outcome.ERROR,
            Reason.EXPRESSION_ERROR,
            time=time,
            event_ids=(event.id,),
            message=match.error,
            trace=trace,
        )
        for match in matching.matches(rules, event, time=time)
        if match.error is not None
    )


@dataclass(frozen=True, slots=True)
class WhyNot:
    """Why one rule that names an event's type did not consider the event, before it becomes
    a record: the service asks the per-minute limit first, and builds the record (its id is a
    hash) only when the limit lets it be written (`why_not_record`)."""

    rule: Rule
    outcome: Outcome
    reason: Reason
    message: str


def why_not_reasons(rules: RuleSet, event: CloudEvent, *, now: datetime) -> tuple[WhyNot, ...]:
    """Every rule that names *event*'s type but did not consider it, and why: first each rule
    whose `where` or key failed (an `error`), then each whose source globs or `where` turned
    the event away (an `ignore`). One matching pass."""
    found, missed = matching.examine(rules, event, time=event.event_time(now))
    errors = tuple(
        WhyNot(match.trigger.rule, Outcome.ERROR, Reason.EXPRESSION_ERROR, match.error)
        for match in found
        if match.error is not None
    )
    ignored = tuple(
        WhyNot(
            miss.rule,
            Outcome.IGNORE,
            Reason.WHERE_FALSE if miss.source_matched else Reason.SOURCE_MISMATCH,
            miss.message,
        )
        for miss in missed
    )
    return (*errors, *ignored)


def why_not_record(
    rules: RuleSet, event: CloudEvent, why: WhyNot, *, now: datetime, suppressed: int = 0
) -> DecisionRecord:
    """The record (key "") of *why*, counting *suppressed* records its rule left out before."""
    record = Decider(rules, why.rule, "").record(
        why.outcome,
        why.reason,
        time=event.event_time(now),
        event_ids=(event.id,),
        message=why.message,
        trace=TraceContext.of(event.extensions),
    )
    return replace(record, suppressed=suppressed) if suppressed else record


def why_not(rules: RuleSet, event: CloudEvent, *, now: datetime) -> tuple[DecisionRecord, ...]:
    """Why-not records for every rule that names *event*'s type but did not consider it (see
    `why_not_reasons`), each written out. The service builds only those the per-minute limit
    lets through (`why_not.take`); `tuneloop simulate` shows them all."""
    return tuple(
        why_not_record(rules, event, why, now=now) for why in why_not_reasons(rules, event, now=now)
    )


def why_not_written(
    rules: RuleSet, limit: WhyNotLimit, event: CloudEvent, *, now: datetime
) -> tuple[WhyNotLimit, tuple[DecisionRecord, ...]]:
    """The why-not records of *event* that the per-minute *limit* lets through, each counting
    the records its rule left out before it, and the limit's new state. A record the limit
    leaves out is never built (its id is a hash): the worker calls this for every event."""
    time = event.event_time(now)
    written = []
    for why in why_not_reasons(rules, event, now=now):
        limit, left_out = take(limit, why.rule.name, time)
        if left_out is not None:
            written.append(why_not_record(rules, event, why, now=now, suppressed=left_out))
    return limit, tuple(written)


def sweep_of(rules: RuleSet, record: DecisionRecord) -> SweepSpec | None:
    """The sweep a `launch` record starts: its rule's `sweep:` block (None: the record
    launches one job). A trial's own launch (reason `trial`) starts nothing."""
    if record.outcome is not Outcome.LAUNCH or record.reason is not None or record.job is None:
        return None
    rule = rules.by_name.get(record.rule)
    return rule.launch.sweep if rule is not None else None


def with_sweeps(
    rules: RuleSet, state: KeyState, sweeps: Mapping[str, SweepState], *, now: datetime
) -> KeyState:
    """*state* with the key's sweeps replaced by *sweeps* (the service drives them,
    `orchestrator/sweeps/driving.py`) and its next wakeup computed again with them."""
    return pruning.prune(rules, replace(state, sweeps=sweeps), now=now)


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
    reaching = matching.for_key(matching.matches(rules, event, time=time), key)
    names = matching.rule_names(reaching)
    if not names:
        return _advance(rules, state, key, now)
    ident = identity(event)

    trace = TraceContext.of(event.extensions)

    def refuse(outcome: Outcome, reason: Reason | None, message: str) -> tuple[DecisionRecord, ...]:
        return tuple(
            Decider(rules, rules.rule(name), key).record(
                outcome, reason, time=time, event_ids=(event.id,), message=message, trace=trace
            )
            for name in names
        )

    # Duplicates first: a redelivered event has its original (old) time and would otherwise
    # read as late, which hides what happened.
    if arrival.is_duplicate(state, names, ident):
        return state, refuse(
            Outcome.SUPPRESS, Reason.DUPLICATE, "event already received (same source and id)"
        )
    state, redelivered = arrival.take_delivery(state, sequence=sequence, position=position)
    if arrival.is_late(state, time, redelivered=redelivered):
        assert state.horizon is not None
        return state, refuse(
            Outcome.LATE,
            None,
            f"event time is {format_duration(state.horizon - time)} behind what this key "
            f"already processed (allowed lateness {format_duration(rules.allowed_lateness)})",
        )
    if not state.buffer and time <= now - rules.allowed_lateness:
        # Nothing held and the event is due: no need to hold it.
        return _advance(rules, state, key, now, due=(time, event, reaching))
    state = arrival.hold(state, event, identity=ident, time=time, lateness=rules.allowed_lateness)
    return _advance(rules, state, key, now)


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
    rule = rules.by_name.get(observation.rule)
    pending = rule_state.pending
    if rule is not None and pending is not None and pending.reason is Reason.QUEUED:
        at = max(observation.at, pending.since)
        rule_state, records = attempt(
            Decider(rules, rule, key), rule_state, at=at, event=pending.event
        )
    state = replace(state, rules={**state.rules, observation.rule: rule_state})
    state, more = _advance(rules, state, key, now, changed=observation.rule)
    return state, (*records, *more)


# --- moving a key through event time -----------------------------------------------------


def _advance(
    rules: RuleSet,
    state: KeyState,
    key: str,
    now: datetime,
    *,
    due: tuple[datetime, CloudEvent, tuple[matching.Match, ...]] | None = None,
    changed: str | None = None,
) -> tuple[KeyState, tuple[DecisionRecord, ...]]:
    """Process held events due by *now* in event-time order, with timers in between.

    *due* is an event (with its time and its matches under *key*) that needs no holding:
    nothing else is held and its time has come; it was already checked not to be a duplicate
    for any rule routed to *key*.
    *changed* names a rule whose state the caller changed without a record (a job ended).
    """
    cutoff = now - rules.allowed_lateness
    records: list[DecisionRecord] = []
    timers_due = bool(state.wakeups) and now >= state.wakeups[0]
    state, held = arrival.release(state, cutoff=cutoff)
    released: list[tuple[datetime, CloudEvent, tuple[matching.Match, ...] | None]] = [
        (item.time, event_json.from_json(item.event), None) for item in held
    ]
    if due is not None:
        released.append(due)
    for time, event, found in released:
        # Timers due before this event fire first, exactly as if no event had been held.
        if timers_due:
            state = timers.fire_due(
                rules, state, key=key, until=time, inclusive=False, records=records
            )
        # A held event is matched when it is released, by the rules in force then.
        reaching = (
            found
            if found is not None
            else matching.for_key(matching.matches(rules, event, time=time), key)
        )
        state = _process(
            rules, state, key=key, event=event, time=time, reaching=reaching, records=records
        )
    if timers_due or released:
        state = timers.fire_due(
            rules, state, key=key, until=cutoff, inclusive=True, records=records
        )
    touched = None
    if not timers_due:
        touched = {record.rule for record in records}
        if changed:
            touched.add(changed)
    return pruning.prune(rules, state, now=now, touched=touched), tuple(records)


def _process(
    rules: RuleSet,
    state: KeyState,
    *,
    key: str,
    event: CloudEvent,
    time: datetime,
    reaching: tuple[matching.Match, ...],
    records: list[DecisionRecord],
) -> KeyState:
    """Count (or join) one released event into every rule it *reaches* under *key*, then
    decide, and advance the horizon to it; the records are appended to *records*."""
    ident = identity(event)
    behind = state.horizon is not None and time < state.horizon  # a re-delivered event
    first = len(records)
    updated = dict(state.rules)
    ids = (event.id,)
    for match in reaching:
        rule = match.trigger.rule
        decider = Decider(rules, rule, key)
        rule_state = windows.expire(rule, updated.get(rule.name) or state.rule(rule.name), time)
        # An event reaches a rule twice when it is both the rule's `on` event and a join.
        if arrival.already_counted(rule_state, ident):
            message = "event already counted (same source and id)"
            records.append(
                decider.record(
                    Outcome.SUPPRESS, Reason.DUPLICATE, time=time, event_ids=ids, message=message
                )
            )
            continue
        if arrival.lost_its_place(rule_state, time, behind=behind):
            message = "re-delivered after the launch that consumed its place in the window"
            records.append(
                decider.record(Outcome.LATE, None, time=time, event_ids=ids, message=message)
            )
            continue
        join = match.trigger.join
        if join is not None:
            rule_state = windows.join(rule_state, join, event, identity=ident, time=time)
        else:
            try:
                amount = windows.amount(rule, matching.activation(rules, event, time=time))
            except EvaluationError as exc:
                records.append(
                    decider.record(
                        Outcome.ERROR,
                        Reason.EXPRESSION_ERROR,
                        time=time,
                        event_ids=ids,
                        message=str(exc),
                    )
                )
                continue
            rule_state = windows.count(rule_state, event, identity=ident, time=time, amount=amount)
        rule_state, more = consider(
            decider, rule_state, time=time, event=event, via_join=join is not None
        )
        records += more
        updated[rule.name] = rule_state
    trace = TraceContext.of(event.extensions)
    if trace is not None:
        # What this event decided carries its producer's trace (a launch already has the
        # trace of the event that completed it, which is this one).
        records[first:] = [
            record if record.trace is not None else replace(record, trace=trace)
            for record in records[first:]
        ]
    horizon = time if state.horizon is None or time > state.horizon else state.horizon
    return replace(state, horizon=horizon, rules=updated)

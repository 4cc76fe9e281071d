"""Launching: once a rule's condition holds, whether it launches now, waits, or not at all.

`engine.py` calls `consider` after counting an event into a rule; `timers.py` and
`engine.observe` call `attempt` when a waiting launch's timer is due or the job it waited for
finished. A launch passes four gates, one function each:

- debounce (`_debounce`): wait for `quiet` without new events, at most `max_wait`;
- cooldown (`_cooldown`): no launch within `cooldown` of the last one; the window is kept;
- concurrency (`_concurrency`): with the rule's previous job still running, `forbid`
  suppresses, `queue` waits for it, `replace` cancels it;
- budget (`_budget`): at most `max_launches_per_day`; the launch waits for the oldest to age.

A launch that passes renders its job (`rendering.py`) and consumes the window: the next launch
needs fresh events, and the consumed ids stay known so that a duplicate is not counted again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from orchestrator import event_json
from orchestrator.events import CloudEvent
from orchestrator.jobs.naming import job_name
from orchestrator.ledger import DecisionRecord, Outcome, Reason, decision_id, format_time
from orchestrator.rules.model import Concurrency, Mode
from orchestrator.rules.records import Decider
from orchestrator.rules.rendering import render
from orchestrator.rules.state import Pending, RuleState
from orchestrator.rules.templating import TemplateError
from orchestrator.rules.windows import (
    DAY,
    missing_joins,
    progress,
    window_ids,
    window_sum,
)

Decided = tuple[RuleState, list[DecisionRecord]]
"""The rule's new state and the records saying what was decided."""


def consider(
    decider: Decider,
    rule_state: RuleState,
    *,
    time: datetime,
    event: CloudEvent,
    via_join: bool,
) -> Decided:
    """The rule's condition after *event* was counted (or, *via_join*, joined): accumulate,
    coalesce into a waiting launch, debounce, or attempt the launch."""
    rule = decider.rule
    holds, how_far = progress(rule, rule_state)
    ids = (event.id,)

    def record(outcome: Outcome, reason: Reason | None, message: str) -> list[DecisionRecord]:
        return [
            decider.record(
                outcome, reason, time=time, event_ids=ids, message=message, rule_state=rule_state
            )
        ]

    if not holds:
        if via_join:
            return rule_state, record(
                Outcome.ACCUMULATE, Reason.JOINED, f"joined {event.type}; {how_far}"
            )
        return rule_state, record(Outcome.ACCUMULATE, None, how_far)
    missing = missing_joins(rule, rule_state, time)
    if missing:
        return rule_state, record(
            Outcome.ACCUMULATE, Reason.JOIN_MISSING, f"{how_far}; waiting for {', '.join(missing)}"
        )
    pending = rule_state.pending
    if pending is not None and pending.reason in (Reason.QUEUED, Reason.BUDGET):
        # A launch already waits: coalesce this event into it rather than queue a second.
        coalesced = replace(
            pending,
            event=event_json.to_json(event),
            event_ids=merge(pending.event_ids, window_ids(rule_state)),
        )
        rule_state = replace(rule_state, pending=coalesced)
        return rule_state, record(
            Outcome.DEFER, pending.reason, f"coalesced into the waiting launch; {how_far}"
        )
    if rule.debounce is not None:
        return _debounce(decider, rule_state, time=time, event=event, how_far=how_far)
    return attempt(decider, rule_state, at=time, event=event_json.to_json(event), deciding=ids)


def _debounce(
    decider: Decider, rule_state: RuleState, *, time: datetime, event: CloudEvent, how_far: str
) -> Decided:
    """Wait for `quiet` without new events, at most `max_wait` after the first: a timer
    (`timers.py`) attempts the launch when the wait is over."""
    debounce = decider.rule.debounce
    assert debounce is not None
    pending = rule_state.pending
    since = pending.since if pending is not None else time
    due = min(since + debounce.max_wait, time + debounce.quiet)
    earlier = pending.event_ids if pending is not None else ()
    waiting = Pending(
        reason=Reason.DEBOUNCE_PENDING,
        since=since,
        due=due,
        event=event_json.to_json(event),
        event_ids=merge(earlier, window_ids(rule_state)),
    )
    rule_state = replace(rule_state, pending=waiting)
    message = f"{how_far}; launches at {format_time(due)} unless more events come"
    record = decider.record(
        Outcome.SUPPRESS,
        Reason.DEBOUNCE_PENDING,
        time=time,
        event_ids=(event.id,),
        message=message,
        rule_state=rule_state,
    )
    return rule_state, [record]


def merge(first: Iterable[str], second: Iterable[str]) -> tuple[str, ...]:
    """The ids of *first* then those of *second*, each once."""
    return tuple(dict.fromkeys((*first, *second)))


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One launch attempt: by whom, when, for which event, and which ids its records name."""

    decider: Decider
    at: datetime
    event: Mapping[str, Any]
    """The completing event as structured JSON, for the templates."""
    ids: tuple[str, ...]
    """Every event id that took part: the window's and those a waiting launch collected."""
    record_ids: tuple[str, ...]
    """The ids a gate's record names: the deciding event's, or all of `ids`."""
    since: datetime
    """When the launch started waiting (or `at`, when it did not)."""

    def record(
        self,
        rule_state: RuleState,
        outcome: Outcome,
        reason: Reason,
        message: str,
        job_name: str | None = None,
    ) -> DecisionRecord:
        return self.decider.record(
            outcome,
            reason,
            time=self.at,
            event_ids=self.record_ids,
            message=message,
            job_name=job_name,
            rule_state=rule_state,
        )


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What one gate made of an attempt."""

    rule_state: RuleState
    records: tuple[DecisionRecord, ...] = ()
    passed: bool = True


def attempt(
    decider: Decider,
    rule_state: RuleState,
    *,
    at: datetime,
    event: Mapping[str, Any],
    deciding: tuple[str, ...] | None = None,
) -> Decided:
    """Launch now unless cooldown, concurrency or the daily budget says otherwise.

    Args:
        decider: the rule and key.
        rule_state: the rule's state, its condition holding.
        at: event time of the attempt (the deciding event's, a timer's due time, or when the
            awaited job finished).
        event: the completing event as structured JSON.
        deciding: the event ids the records are about when an event triggered the attempt;
            a timer or a job finishing makes them name the whole waiting window instead.
    """
    pending = rule_state.pending
    ids = merge(pending.event_ids if pending else (), window_ids(rule_state))
    this = _Attempt(
        decider=decider,
        at=at,
        event=event,
        ids=ids,
        record_ids=deciding or ids,
        since=pending.since if pending else at,
    )
    records: list[DecisionRecord] = []
    for gate in (_cooldown, _concurrency, _budget):
        verdict = gate(this, rule_state)
        rule_state = verdict.rule_state
        records += verdict.records
        if not verdict.passed:
            return rule_state, records
    return _launch(this, rule_state, records)


def _cooldown(this: _Attempt, rule_state: RuleState) -> _Verdict:
    """No launch within the rule's `cooldown` of its last one; the window is kept."""
    last = rule_state.last_launch
    if last is None or this.at >= last + this.decider.rule.cooldown:
        return _Verdict(rule_state)
    rule_state = replace(rule_state, pending=None)
    message = f"in cooldown until {format_time(last + this.decider.rule.cooldown)}; window kept"
    record = this.record(rule_state, Outcome.SUPPRESS, Reason.COOLDOWN, message)
    return _Verdict(rule_state, (record,), passed=False)


def _concurrency(this: _Attempt, rule_state: RuleState) -> _Verdict:
    """The rule's previous job for the key still runs: forbid, queue or replace it."""
    rule, running = this.decider.rule, rule_state.running
    if running is None or rule.mode is not Mode.LIVE:
        return _Verdict(rule_state)
    if rule.concurrency is Concurrency.FORBID:
        rule_state = replace(rule_state, pending=None)
        message = f"job {running} still runs; window kept"
        record = this.record(rule_state, Outcome.SUPPRESS, Reason.CONCURRENCY, message, running)
        return _Verdict(rule_state, (record,), passed=False)
    if rule.concurrency is Concurrency.QUEUE:
        queued = Pending(
            reason=Reason.QUEUED, since=this.since, due=None, event=this.event, event_ids=this.ids
        )
        rule_state = replace(rule_state, pending=queued)
        message = f"queued until job {running} finishes"
        record = this.record(rule_state, Outcome.DEFER, Reason.QUEUED, message, running)
        return _Verdict(rule_state, (record,), passed=False)
    message = f"replacing job {running}"
    cancel = this.record(rule_state, Outcome.CANCEL, Reason.REPLACED, message, running)
    return _Verdict(rule_state, (cancel,))


def _budget(this: _Attempt, rule_state: RuleState) -> _Verdict:
    """At most `max_launches_per_day`: past it, the launch waits for the oldest to age."""
    budget = this.decider.rule.max_launches_per_day
    launches = _launches_of_the_day(rule_state, this.at)
    if budget is None or len(launches) < budget:
        return _Verdict(rule_state)
    due = min(launches) + DAY
    waiting = Pending(
        reason=Reason.BUDGET, since=this.since, due=due, event=this.event, event_ids=this.ids
    )
    rule_state = replace(rule_state, pending=waiting, launches=launches)
    message = (
        f"{len(launches)} launches in the last day (max {budget}); retry at {format_time(due)}"
    )
    record = this.record(rule_state, Outcome.DEFER, Reason.BUDGET, message)
    return _Verdict(rule_state, (record,), passed=False)


def _launches_of_the_day(rule_state: RuleState, at: datetime) -> tuple[datetime, ...]:
    return tuple(t for t in rule_state.launches if t > at - DAY)


def _launch(this: _Attempt, rule_state: RuleState, records: list[DecisionRecord]) -> Decided:
    """Resolve the job and consume the window (or, in shadow mode, say what would launch)."""
    decider, at, ids = this.decider, this.at, this.ids
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
        request = render(
            decider, rule_state, event=this.event, ids=ids, name=name, record_id=record_id
        )
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
    _, how_far = progress(rule, rule_state)
    message = (
        f"launched job {name}: {how_far}"
        if live
        else f"shadow mode: would launch {name}: {how_far}"
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
        window_sum=window_sum(rule, rule_state),
        trace=request.trace,
    )
    # Consumed: the next launch needs fresh events; the ids stay known for dedup.
    seen = dict(rule_state.seen)
    seen.update((entry.identity, entry.time) for entry in rule_state.entries)
    seen.update((joined.identity, joined.time) for joined in rule_state.joined.values())
    consumed = RuleState(
        seen=seen,
        last_launch=at,
        launches=(*_launches_of_the_day(rule_state, at), at),
        running=name if live else rule_state.running,
    )
    return consumed, [*records, launch]

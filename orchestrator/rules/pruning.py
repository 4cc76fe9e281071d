"""Pruning: dropping what can never matter again, and computing when a key next has work.

`engine.py` prunes a key's state at the end of every evaluation. Everything in a key's state
is bounded this way: window entries and joins expire with their window, consumed ids once an
event of their time could no longer count, launch times after a day, and a rule removed by a
reload goes once its last job has finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from orchestrator.rules.model import RuleSet
from orchestrator.rules.state import KeyState, RuleState
from orchestrator.rules.windows import DAY, expire
from orchestrator.sweeps import state as sweeps


def prune(
    rules: RuleSet,
    state: KeyState,
    *,
    now: datetime,
    touched: Iterable[str] | None = None,
) -> KeyState:
    """*state* without what expired by processing time *now*, and with its next wakeup.

    With *touched* (the rules an event just changed) and no wakeup due yet, only those rules
    are looked at: the others cannot have changed since the last wakeup was computed. The
    wakeup kept may then be earlier than needed, which costs one empty `tick`, never a
    missed one.
    """
    cutoff = now - rules.allowed_lateness
    previous = state.wakeups[0] if state.wakeups else None
    only_touched = touched is not None and (previous is None or now < previous)
    names = tuple(touched or ()) if only_touched else tuple(state.rules)
    kept: dict[str, RuleState] = dict(state.rules) if only_touched else {}
    wakeups = [state.buffer[0].release_at] if state.buffer else []
    if only_touched and previous is not None:
        wakeups.append(previous)
    for name in names:
        rule_state = state.rules.get(name)
        if rule_state is None:
            continue
        current, wakeup = _prune_rule(rules, name, rule_state, cutoff)
        if current is None:
            kept.pop(name, None)
        else:
            kept[name] = current
        if wakeup is not None:
            wakeups.append(wakeup)
    # A sweep's budget deadline (or when an ended one is forgotten) is the service's timer.
    sweeps_due = sweeps.next_wakeup(state.sweeps) if state.sweeps else None
    if sweeps_due is not None:
        wakeups.append(sweeps_due)
    return replace(state, rules=kept, wakeups=(min(wakeups),) if wakeups else ())


def _prune_rule(
    rules: RuleSet, name: str, rule_state: RuleState, cutoff: datetime
) -> tuple[RuleState | None, datetime | None]:
    """One rule's state without what expired (None: nothing left), and its earliest wakeup."""
    rule = rules.by_name.get(name)
    if rule is None:
        # Removed by a reload. A running job is never touched; keep knowing about it.
        return (rule_state if rule_state.running is not None else None), None
    lateness = rules.allowed_lateness
    current = expire(rule, rule_state, cutoff)
    if current.seen:
        # Keep consumed ids as long as an event of that time could still count.
        oldest = cutoff - rule.horizon - lateness
        if min(current.seen.values()) <= oldest:
            current = replace(current, seen={i: t for i, t in current.seen.items() if t > oldest})
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
        joined = current.joined.get(join.type)
        if joined is not None:
            wakeups.append(joined.time + join.within + lateness)
    if current.launches:
        wakeups.append(current.launches[0] + DAY + lateness)
    if current.seen:
        wakeups.append(min(current.seen.values()) + rule.horizon + 2 * lateness)
    return (None if current.is_idle else current), (min(wakeups) if wakeups else None)

"""Timers: waiting launches whose time has come, and when a key next has work.

A debounce, or a budget that ran out, leaves a `Pending` launch with a due time in the rule's
state. `engine.py` calls `fire_due` as event time moves on (between released events, so that a
timer due before an event fires first, exactly as if no event had been held). `pruning.py`
computes each key's next wakeup; the wiring asks `next_wakeup` when to call `engine.tick`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from orchestrator.ledger import DecisionRecord
from orchestrator.rules.launching import attempt
from orchestrator.rules.model import RuleSet
from orchestrator.rules.records import Decider
from orchestrator.rules.state import KeyState
from orchestrator.rules.windows import expire


def next_wakeup(state: KeyState) -> datetime | None:
    """When `engine.tick` next has work for this key (None: nothing until the next event)."""
    return min(state.wakeups) if state.wakeups else None


def fire_due(
    rules: RuleSet,
    state: KeyState,
    *,
    key: str,
    until: datetime,
    inclusive: bool,
    records: list[DecisionRecord],
) -> KeyState:
    """*state* after attempting every waiting launch due before *until* (event time; at it
    too when *inclusive*), earliest first; their records are appended to *records*."""
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
        rule = rules.by_name.get(name)
        if rule is None:  # the rule was removed by a reload: its waiting launch goes with it
            rule_state = replace(rule_state, pending=None)
        else:
            rule_state, more = attempt(
                Decider(rules, rule, key),
                expire(rule, rule_state, due),
                at=due,
                event=pending.event,
            )
            records += more
        state = replace(state, rules={**state.rules, name: rule_state})

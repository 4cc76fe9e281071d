"""Matching: which rules an event reaches, and under which key.

A rule reaches an event through its `on` selector or one of its joins (each a `Trigger`): the
event's type and source must match, its `where` must be true, and its key expression must give
a non-empty string. `engine.route` asks this of every event to repartition it by key;
`engine.evaluate` asks it again for the key it was routed to, so both always agree, and
counts the event into the rules it found (and, for an event it held, the rules it finds when
it releases it: a rule set reloaded meanwhile decides). `misses` answers the opposite
question for `engine.why_not` (`examine`, in the same pass): which rules name the event's
type and still did not consider it, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orchestrator.events import CloudEvent
from orchestrator.rules.expressions import Activation, EvaluationError, event_variables
from orchestrator.rules.model import Rule, RuleSet, Trigger


@dataclass(frozen=True, slots=True)
class Match:
    """A trigger whose type and source accept an event: under which key, or why it could not
    tell (then `key` is None and `error` says what went wrong)."""

    trigger: Trigger
    key: str | None
    error: str | None = None


def activation(rules: RuleSet, event: CloudEvent, *, time: datetime) -> Activation:
    """What the rule set's expressions see of *event*, with *time* when it has none.

    CEL, when an expression needs it, sees only the data fields the rule set reads.
    """
    variables = event_variables(event, time=time, data_fields=None)
    return Activation({"event": variables}, data_fields=rules.data_fields.get(event.type))


def matches(rules: RuleSet, event: CloudEvent, *, time: datetime) -> tuple[Match, ...]:
    """Every trigger of *rules* that accepts *event*, with its key or its error."""
    triggers = rules.by_type.get(event.type, ())
    seen = activation(rules, event, time=time)
    found = []
    for trigger in triggers:
        if trigger.accepts_source(event.source):
            match = _match(trigger, seen)
            if match is not None:
                found.append(match)
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Miss:
    """A rule that names an event's type but did not consider the event: no way in accepted
    its source (`source_matched` False), or every one that did had a false `where`."""

    rule: Rule
    source_matched: bool
    message: str


def examine(
    rules: RuleSet, event: CloudEvent, *, time: datetime
) -> tuple[tuple[Match, ...], tuple[Miss, ...]]:
    """In one pass: every trigger that accepts *event* (as `matches` gives them), and every
    rule that names *event*'s type but neither considered it nor failed on it, in rule-set
    order."""
    triggers = rules.by_type.get(event.type, ())
    if not triggers:
        return (), ()
    seen = activation(rules, event, time=time)
    found: list[Match] = []
    # Per rule, in rule-set order: whether a way in reached the event (with a key or an
    # error), the `where`s that were false and the source globs that refused it.
    reached: dict[str, bool] = {}
    wheres: dict[str, list[str]] = {}
    globs: dict[str, list[str]] = {}
    by_name: dict[str, Rule] = {}
    for trigger in triggers:
        name = trigger.rule.name
        by_name.setdefault(name, trigger.rule)
        reached.setdefault(name, False)
        if not trigger.accepts_source(event.source):
            globs.setdefault(name, []).extend(trigger.sources)
            continue
        match = _match(trigger, seen)
        if match is not None:
            found.append(match)
            reached[name] = True
        else:
            where = trigger.where
            wheres.setdefault(name, []).append(where.source if where is not None else "")
    missed = []
    for name, was_reached in reached.items():
        if was_reached:
            continue
        if name in wheres:
            shown = " / ".join(f"`{text}`" for text in wheres[name])
            missed.append(Miss(by_name[name], True, f"`where` is false: {shown}"))
        else:
            shown = ", ".join(repr(glob) for glob in dict.fromkeys(globs.get(name, ())))
            message = f"source {event.source!r} matches none of the rule's sources ({shown})"
            missed.append(Miss(by_name[name], False, message))
    return tuple(found), tuple(missed)


def _match(trigger: Trigger, seen: Activation) -> Match | None:
    """Whether *trigger* (whose type and source accept the event) accepts it, and under which
    key (or why it could not tell); None when its `where` is false."""
    where = trigger.where
    if where is not None:
        try:
            accepted = where.evaluate(seen)
        except EvaluationError as exc:
            return Match(trigger, None, f"where: {exc}")
        if accepted is False:
            return None
        if accepted is not True:
            return Match(trigger, None, f"where gave {accepted!r}, not a bool")
    try:
        key = trigger.key.evaluate(seen)
    except EvaluationError as exc:
        return Match(trigger, None, f"key: {exc}")
    if not isinstance(key, str) or not key:
        return Match(trigger, None, f"key gave {key!r}, not a non-empty string")
    return Match(trigger, key)


def for_key(found: tuple[Match, ...], key: str) -> tuple[Match, ...]:
    """The matches of *found* under *key*."""
    return tuple(match for match in found if match.key == key)


def rule_names(found: tuple[Match, ...]) -> tuple[str, ...]:
    """The names of the rules of *found*, each once (a rule matches twice when an event is
    both its `on` event and one of its joins), in rule-set order."""
    return tuple(dict.fromkeys(match.trigger.rule.name for match in found))

"""Why-not records: why a rule that names an event's type did not consider the event, and how
many such records a rule may write.

`engine.why_not_reasons` finds, from what `matching` found, why a rule did not consider an
event (a source glob that did not match, a false `where`, a `where` or key expression that
failed); `take` lets at most `per_minute` of them per rule per minute of event time be
written, so that a noisy producer cannot flood the audit topic, and the next record that is
written says how many were left out (`DecisionRecord.suppressed`). `engine.why_not_written`
asks `take` before it builds each record.

The limit's state is a value (`WhyNotLimit`) that the caller keeps and passes back in: the
service keeps one per worker, in memory. That is enough for diagnostic records: a restart
forgets how many were written this minute and at worst writes `per_minute` more. Counting by
event time (not the wall clock) keeps `take` pure; an event older than the minute being
counted counts against that minute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType

DEFAULT_PER_MINUTE = 10
"""Why-not records one rule may write per minute of event time, by default."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One rule's why-not records in the minute being counted."""

    minute: datetime
    """The start of the minute of event time being counted."""
    written: int = 0
    """Records written in that minute."""
    left_out: int = 0
    """Records left out since the last one written (carried into later minutes)."""


@dataclass(frozen=True, slots=True)
class WhyNotLimit:
    """How many why-not records each rule may still write: the limiter's whole state."""

    per_minute: int = DEFAULT_PER_MINUTE
    quotas: Mapping[str, Quota] = field(default_factory=lambda: MappingProxyType({}))


def take(state: WhyNotLimit, rule: str, time: datetime) -> tuple[WhyNotLimit, int | None]:
    """Count one why-not record of *rule* at event *time*: the new state, and how many records
    of the rule were left out before this one if it may be written (None: it is left out).

    `engine.why_not_written` calls it before it builds a record, so a record the limit
    leaves out is never built.
    """
    minute = time.replace(second=0, microsecond=0)
    quota = state.quotas.get(rule)
    if quota is None or minute > quota.minute:
        quota = Quota(minute=minute, left_out=quota.left_out if quota else 0)
    written: int | None
    if quota.written < state.per_minute:
        written = quota.left_out
        quota = Quota(minute=quota.minute, written=quota.written + 1)
    else:
        written = None
        quota = replace(quota, left_out=quota.left_out + 1)
    quotas = MappingProxyType({**state.quotas, rule: quota})
    return replace(state, quotas=quotas), written

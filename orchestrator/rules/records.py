"""The decision records one rule makes for one key.

Every step of the engine (`arrival.py`, `launching.py`, `timers.py`, `engine.py`) says what it
decided through a `Decider`, so that every record carries the rule's name and version, the
key and, when there is one, the window's count and sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orchestrator.jobs.model import TraceContext
from orchestrator.ledger import DecisionRecord, Outcome, Reason
from orchestrator.rules.model import Rule, RuleSet
from orchestrator.rules.state import RuleState
from orchestrator.rules.windows import window_sum


@dataclass(frozen=True, slots=True)
class Decider:
    """One rule deciding for one key: what every step needs to write a record."""

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
        trace: TraceContext | None = None,
    ) -> DecisionRecord:
        """A record of this rule for this key; with *rule_state*, it states the window."""
        return DecisionRecord(
            outcome=outcome,
            reason=reason,
            rule=self.rule.name,
            rule_version=self.rule.version,
            key=self.key,
            time=time,
            event_ids=event_ids,
            message=message,
            job_name=job_name,
            window_count=len(rule_state.entries) if rule_state is not None else None,
            window_sum=window_sum(self.rule, rule_state) if rule_state is not None else None,
            trace=trace,
        )

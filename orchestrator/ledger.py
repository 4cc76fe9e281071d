"""The decision ledger: one record per evaluation, saying what a rule decided and why.

The rule engine (`orchestrator/rules/engine.py`) produces `DecisionRecord`s; the wiring
publishes them to the audit topic as `io.tuneloop.decision.v1` CloudEvents (`to_cloudevent`)
and turns launch and cancel records into backend calls; `tuneloop simulate --json` writes them
as JSON Lines (`to_json`) and `tuneloop explain` reads them back (`from_json`,
`from_cloudevent`). Everything here is deterministic: a replay gives the same records, ids
included.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import (
    LoraSettings,
    Resources,
    TraceContext,
    TrainingRequest,
    TrainingSettings,
)
from orchestrator.jobs.promotion import PromotionPolicy
from orchestrator.vocabulary.timestamps import format_rfc3339, parse_rfc3339

DECISION_EVENT_TYPE = "io.tuneloop.decision.v1"
DECISION_SOURCE = "/tuneloop/rules"


class Outcome(enum.Enum):
    """What an evaluation decided."""

    ACCUMULATE = "accumulate"
    """The event counted (or was joined), the rule's condition does not hold yet."""
    LAUNCH = "launch"
    """Start the job in `job`."""
    SUPPRESS = "suppress"
    """The condition held but nothing launches; `reason` says why."""
    DEFER = "defer"
    """The condition held; the launch is kept and retried later (budget, queue)."""
    LATE = "late"
    """The event arrived after its allowed lateness and was not counted."""
    CANCEL = "cancel"
    """Cancel the running job `job_name` (concurrency `replace`); a launch record follows."""
    ERROR = "error"
    """An expression or template failed on this event; `message` says how. Nothing counted."""
    IGNORE = "ignore"
    """A why-not record: the rule names the event's type but did not consider the event;
    `reason` says why (`source-mismatch`, `where-false`). Written with key "", sampled per
    rule (see `rules/why_not.py`); `suppressed` counts the ones left out before it."""
    PROMOTE = "promote"
    """The job `job_name` succeeded and the promotion gate made its adapter the champion of
    the rule and key; `reason` is the gate's verdict and `message` the scores compared."""
    DECLINE = "decline"
    """The job `job_name` succeeded but the promotion gate kept the champion; `reason` and
    `message` say why."""
    CONCLUDE = "conclude"
    """A sweep ended (`reason`: `goal-reached`, `max-trials`, `budget` or `max-failed`);
    `job_name` is its best trial's job (none when no trial completed with a score) and
    `message` says how it went (docs/sweeps.md)."""


class Reason(enum.Enum):
    """Why a record has its outcome (null for a plain accumulate or launch)."""

    COOLDOWN = "cooldown"
    CONCURRENCY = "concurrency"
    DUPLICATE = "duplicate"
    SHADOW = "shadow"
    DEBOUNCE_PENDING = "debounce-pending"
    BUDGET = "budget"
    """`defer`: `max_launches_per_day` is spent; `conclude`: a sweep's budget ran out."""
    QUEUED = "queued"
    JOIN_MISSING = "join-missing"
    JOINED = "joined"
    REPLACED = "replaced"
    DEBOUNCE_SETTLED = "debounce-settled"
    RETRIED = "retried"
    EXPRESSION_ERROR = "expression-error"
    TEMPLATE_ERROR = "template-error"
    SOURCE_MISMATCH = "source-mismatch"
    """`ignore`: the event's source matches none of the rule's source globs for its type."""
    WHERE_FALSE = "where-false"
    """`ignore`: the rule's `where` is false for the event."""
    NO_CHAMPION = "no-champion"
    """`promote`: there was no champion yet, so the first adapter became it."""
    BETTER = "better"
    """`promote`: the candidate beat the champion by more than `min_delta`."""
    NOT_BETTER = "not-better"
    """`decline`: the candidate was worse, or better by no more than `min_delta`."""
    TIE = "tie"
    """`decline`: the candidate scored exactly what the champion did."""
    NO_ADAPTER = "no-adapter"
    """`decline`: the job reported no adapter."""
    METRIC_MISSING = "metric-missing"
    """`decline`: the candidate or the champion has no score of the gate's metric."""
    CHAMPION_ERROR = "champion-error"
    """`decline`: the trainer could not evaluate the champion."""
    CHAMPION_CHANGED = "champion-changed"
    """`decline`: the champion moved while the job ran, so the comparison no longer holds."""
    TRIAL = "trial"
    """`launch`: a trial of a sweep; `job` is the trial's job, its parameters set."""
    PRUNED = "pruned"
    """`cancel`: the median rule stopped a trial that was behind the completed ones."""
    SWEEP_ENDED = "sweep-ended"
    """`cancel`: a trial still ran when its sweep ended."""
    GOAL_REACHED = "goal-reached"
    """`conclude`: a trial reached the sweep's goal."""
    MAX_TRIALS = "max-trials"
    """`conclude`: every trial the sweep could start has finished."""
    MAX_FAILED = "max-failed"
    """`conclude`: `max_failed` trials failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord:
    """One decision of one rule for one key."""

    outcome: Outcome
    reason: Reason | None
    rule: str
    rule_version: str
    key: str
    time: datetime
    """Event time of the decision: the deciding event's time, or a timer's due time."""
    event_ids: tuple[str, ...]
    message: str = ""
    job: TrainingRequest | None = None
    """The resolved job, for `launch` (and for `suppress` with reason `shadow`)."""
    job_name: str | None = None
    """The job concerned: launched, cancelled or blocking."""
    window_count: int | None = None
    window_sum: float | None = None
    suppressed: int = 0
    """Why-not records (`ignore`, and `error` records of events no rule could key) of this
    rule that the per-rule limit left out since the previous one was written."""
    trace: TraceContext | None = None
    """The deciding event's trace context (its `traceparent`, `tracestate`), if it had one."""
    decision_id: str = ""
    """Deterministic id of the decision; left empty, it is derived from the fields above
    (see the function `decision_id`), which is what the engine does."""

    def __post_init__(self) -> None:
        if not self.decision_id:
            derived = decision_id(
                rule_version=self.rule_version,
                key=self.key,
                outcome=self.outcome,
                reason=self.reason,
                event_ids=self.event_ids,
                time=self.time,
            )
            # The one derived field of a frozen value, set once while it is being built.
            object.__setattr__(self, "decision_id", derived)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: what `simulate --json` prints and the audit event carries.

        `suppressed`, `traceparent` and `tracestate` appear only when they say something
        (a count above 0, a trace): absent means 0 and no trace, and records written before
        they existed read the same.
        """
        data: dict[str, Any] = {
            "decision_id": self.decision_id,
            "outcome": self.outcome.value,
            "reason": self.reason.value if self.reason else None,
            "rule": self.rule,
            "rule_version": self.rule_version,
            "key": self.key,
            "time": format_time(self.time),
            "event_ids": list(self.event_ids),
            "message": self.message,
            "job": job_to_json(self.job) if self.job else None,
            "job_name": self.job_name,
            "window": {"count": self.window_count, "sum": self.window_sum},
        }
        if self.suppressed:
            data["suppressed"] = self.suppressed
        if self.trace is not None:
            data.update(self.trace.as_extensions())
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecisionRecord:
        """The inverse of `to_json`.

        Raises:
            ValueError: a field is missing or has the wrong type.
        """
        try:
            window = data.get("window") or {}
            return cls(
                decision_id=str(data["decision_id"]),
                outcome=Outcome(data["outcome"]),
                reason=Reason(data["reason"]) if data.get("reason") else None,
                rule=str(data["rule"]),
                rule_version=str(data["rule_version"]),
                key=str(data["key"]),
                time=parse_time(data["time"]),
                event_ids=tuple(str(i) for i in data["event_ids"]),
                message=str(data.get("message") or ""),
                job=job_from_json(data["job"]) if data.get("job") else None,
                job_name=data.get("job_name"),
                window_count=window.get("count"),
                window_sum=window.get("sum"),
                suppressed=int(data.get("suppressed") or 0),
                trace=TraceContext.of(data),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a decision record: {exc!r}") from exc


def decision_id(
    *,
    rule_version: str,
    key: str,
    outcome: Outcome,
    reason: Reason | None,
    event_ids: tuple[str, ...],
    time: datetime,
) -> str:
    """Deterministic id of a decision: the same inputs always give the same id."""
    # Unit separators cannot occur in rule versions, keys or ids that parse as text we
    # accept, so the joined text is unambiguous; blake2b is the fastest stdlib hash here.
    parts = [
        rule_version,
        key,
        _VALUES[outcome],
        _VALUES[reason] if reason else "",
        time.isoformat(),
    ]
    text = "\x1f".join(parts) + "\x1e" + "\x1f".join(event_ids)
    return "d-" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


_VALUES: dict[enum.Enum, str] = {member: member.value for member in (*Outcome, *Reason)}


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, the way CloudEvents writes `time`."""
    return format_rfc3339(value.astimezone(UTC))


def parse_time(text: Any) -> datetime:
    """An RFC 3339 timestamp in UTC (`vocabulary/timestamps.py` parses; one parser for all).

    Raises:
        ValueError: *text* is not an RFC 3339 timestamp (an offset is required: a time
            without one is ambiguous).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected an RFC 3339 time string, got {text!r}")
    try:
        return parse_rfc3339(text).astimezone(UTC)
    except InvalidEventError as exc:
        raise ValueError(exc.message) from None


def job_to_json(job: TrainingRequest) -> dict[str, Any]:
    return {
        "name": job.name,
        "rule": job.rule,
        "rule_version": job.rule_version,
        "key": job.key,
        "decision_id": job.decision_id,
        "causing_event_ids": list(job.causing_event_ids),
        "runtime": job.runtime,
        "base_model": job.base_model,
        "dataset": job.dataset,
        "lora": {
            "r": job.lora.r,
            "alpha": job.lora.alpha,
            "dropout": job.lora.dropout,
            "target_modules": list(job.lora.target_modules)
            if job.lora.target_modules is not None
            else None,
        },
        "training": {
            "epochs": job.training.epochs,
            "learning_rate": job.training.learning_rate,
            "max_steps": job.training.max_steps,
            "batch_size": job.training.batch_size,
            "gradient_accumulation_steps": job.training.gradient_accumulation_steps,
            "max_seq_length": job.training.max_seq_length,
            "seed": job.training.seed,
            "eval_fraction": job.training.eval_fraction,
            "packing": job.training.packing,
        },
        "resources": {
            "nodes": job.resources.nodes,
            "gpus_per_node": job.resources.gpus_per_node,
            "cpu": job.resources.cpu,
            "memory": job.resources.memory,
        },
        "output_uri": job.output_uri,
        "deadline_seconds": job.deadline_seconds,
        "model_id": job.model_id,
        # Only with a trace, as in the record: jobs written before it read the same.
        **(job.trace.as_extensions() if job.trace else {}),
        # Likewise only with a promote: block and a champion.
        **({"promotion": job.promotion.to_json()} if job.promotion else {}),
        **({"champion_uri": job.champion_uri} if job.champion_uri else {}),
    }


def job_from_json(data: Mapping[str, Any]) -> TrainingRequest:
    lora = dict(data.get("lora") or {})
    if lora.get("target_modules") is not None:
        lora["target_modules"] = tuple(lora["target_modules"])
    return TrainingRequest(
        name=data["name"],
        rule=data["rule"],
        rule_version=data["rule_version"],
        key=data["key"],
        decision_id=data["decision_id"],
        causing_event_ids=tuple(data["causing_event_ids"]),
        runtime=data["runtime"],
        base_model=data["base_model"],
        dataset=data["dataset"],
        lora=LoraSettings(**lora),
        training=TrainingSettings(**(data.get("training") or {})),
        resources=Resources(**(data.get("resources") or {})),
        output_uri=data.get("output_uri"),
        deadline_seconds=data.get("deadline_seconds"),
        model_id=data.get("model_id"),
        trace=TraceContext.of(data),
        promotion=PromotionPolicy.from_json(data["promotion"]) if data.get("promotion") else None,
        champion_uri=data.get("champion_uri"),
    )


def to_cloudevent(record: DecisionRecord, *, source: str = DECISION_SOURCE) -> CloudEvent:
    """The audit event for *record*: id = decision id (so republishing dedupes), subject =
    `rule/key`, `partitionkey` = key (one key's story stays in order on one partition), and
    the deciding event's trace context as the distributed-tracing extension."""
    extensions: dict[str, str] = {"partitionkey": record.key}
    if record.trace is not None:
        extensions.update(record.trace.as_extensions())
    return CloudEvent(
        id=record.decision_id,
        source=source,
        type=DECISION_EVENT_TYPE,
        subject=f"{record.rule}/{record.key}",
        time=record.time,
        datacontenttype="application/json",
        data=record.to_json(),
        extensions=extensions,
    )


def from_cloudevent(event: CloudEvent) -> DecisionRecord:
    """The record an audit event carries.

    Raises:
        InvalidEventError: `not-a-decision` when the type or data is not a decision record.
    """
    if event.type != DECISION_EVENT_TYPE or not isinstance(event.data, Mapping):
        raise InvalidEventError("not-a-decision", f"event {event.id!r} is not a decision record")
    try:
        return DecisionRecord.from_json(event.data)
    except ValueError as exc:
        raise InvalidEventError("not-a-decision", str(exc)) from exc

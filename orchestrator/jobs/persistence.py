"""JSON forms of the completion records, for durable stores (a faust Table, a file).

Called by the stores in `handlers/app.py`; the format is versioned so that an old worker
never misreads a record written by a newer one. Format 2 added the promotion policy and the
champion of a job's context, and the gate's decision; format 1 records read as jobs without
promotion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.jobs.completion import CompletionRecord
from orchestrator.jobs.model import JobContext, JobPhase, TraceContext
from orchestrator.jobs.promotion import PromotionDecision, PromotionPolicy
from orchestrator.jobs.tracking import Milestone
from orchestrator.ledger import format_time, parse_time

FORMAT = 2
READABLE_FORMATS = (1, 2)


def record_to_json(record: CompletionRecord) -> dict[str, Any]:
    """A JSON-safe dict for *record*."""
    context = record.context
    return {
        "format": FORMAT,
        "job": record.job,
        "phase": record.phase.value if record.phase is not None else None,
        "announced": [m.value for m in record.announced],
        "started_at": format_time(record.started_at) if record.started_at else None,
        "promotion": record.promotion.to_json() if record.promotion else None,
        "context": None
        if context is None
        else {
            "job": context.job,
            "rule": context.rule,
            "rule_version": context.rule_version,
            "key": context.key,
            "decision_id": context.decision_id,
            "causing_event_ids": list(context.causing_event_ids),
            "runtime": context.runtime,
            "base_model": context.base_model,
            "dataset": context.dataset,
            "model_id": context.model_id,
            "output_uri": context.output_uri,
            "launched_at": format_time(context.launched_at) if context.launched_at else None,
            "traceparent": context.trace.traceparent if context.trace else None,
            "tracestate": context.trace.tracestate if context.trace else None,
            "promotion": context.promotion.to_json() if context.promotion else None,
            "champion_uri": context.champion_uri,
        },
    }


def record_from_json(data: Mapping[str, Any]) -> CompletionRecord:
    """The record *data* describes.

    Raises:
        ValueError: *data* was written in another format.
    """
    if data.get("format") not in READABLE_FORMATS:
        raise ValueError(f"unknown completion record format {data.get('format')!r}")
    raw = data.get("context")
    context = None
    if isinstance(raw, Mapping):
        context = JobContext(
            job=raw["job"],
            rule=raw["rule"],
            rule_version=raw["rule_version"],
            key=raw["key"],
            decision_id=raw["decision_id"],
            causing_event_ids=tuple(raw["causing_event_ids"]),
            runtime=raw["runtime"],
            base_model=raw["base_model"],
            dataset=raw["dataset"],
            model_id=raw.get("model_id"),
            output_uri=raw.get("output_uri"),
            launched_at=parse_time(raw["launched_at"]) if raw.get("launched_at") else None,
            trace=TraceContext.of(raw),
            promotion=PromotionPolicy.from_json(raw["promotion"]) if raw.get("promotion") else None,
            champion_uri=raw.get("champion_uri"),
        )
    return CompletionRecord(
        job=data["job"],
        context=context,
        phase=JobPhase(data["phase"]) if data.get("phase") else None,
        announced=tuple(Milestone(m) for m in data.get("announced", ())),
        started_at=parse_time(data["started_at"]) if data.get("started_at") else None,
        promotion=PromotionDecision.from_json(data["promotion"]) if data.get("promotion") else None,
    )

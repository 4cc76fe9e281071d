"""A job's promotion policy, champion and gate decision survive the completion store's JSON."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.jobs.completion import CompletionRecord
from orchestrator.jobs.model import JobContext, JobPhase, TrainingRequest
from orchestrator.jobs.persistence import record_from_json, record_to_json
from orchestrator.jobs.promotion import Mode, PromotionDecision, PromotionPolicy, Verdict
from orchestrator.jobs.tracking import Milestone
from orchestrator.ledger import DecisionRecord, Outcome

CONTEXT = JobContext(
    job="ft-1",
    rule="drift",
    rule_version="v1",
    key="m1",
    decision_id="d-1",
    causing_event_ids=("e-1",),
    runtime="rt",
    base_model="tiny",
    dataset="s3://b/d.jsonl",
    launched_at=datetime(2026, 1, 1, tzinfo=UTC),
    promotion=PromotionPolicy(metric="token_accuracy", mode=Mode.MAX, min_delta=0.02),
    champion_uri="s3://b/adapters/ft-0",
)
DECISION = PromotionDecision(
    policy=CONTEXT.promotion,
    verdict=Verdict.TIE,
    reason="token_accuracy 0.5 against the champion's 0.5: a tie keeps the champion",
    candidate=0.5,
    champion=0.5,
    champion_uri="s3://b/adapters/ft-0",
    candidate_uri="s3://b/adapters/ft-1",
)


def test_a_record_with_a_policy_a_champion_and_a_decision_reads_back_as_it_was():
    record = CompletionRecord(
        job="ft-1",
        context=CONTEXT,
        phase=JobPhase.SUCCEEDED,
        announced=(Milestone.COMPLETED,),
        promotion=DECISION,
    )
    assert record_from_json(record_to_json(record)) == record


def test_a_record_written_before_promotion_existed_reads_as_a_job_without_it():
    written_by_format_1 = {
        "format": 1,
        "job": "ft-1",
        "phase": "Running",
        "announced": ["started"],
        "started_at": None,
        "context": {
            "job": "ft-1",
            "rule": "drift",
            "rule_version": "v1",
            "key": "m1",
            "decision_id": "d-1",
            "causing_event_ids": ["e-1"],
            "runtime": "rt",
            "base_model": "tiny",
            "dataset": "s3://b/d.jsonl",
            "model_id": None,
            "output_uri": None,
            "launched_at": None,
            "traceparent": None,
            "tracestate": None,
        },
    }
    record = record_from_json(written_by_format_1)
    assert record.promotion is None
    assert record.context is not None
    assert record.context.promotion is None
    assert record.context.champion_uri is None


def test_a_record_of_a_newer_format_is_refused_rather_than_misread():
    with pytest.raises(ValueError, match="unknown completion record format 3"):
        record_from_json({"format": 3, "job": "ft-1"})


def test_a_launch_record_keeps_its_jobs_promotion_policy_and_champion():
    job = TrainingRequest(
        name="ft-1",
        rule="drift",
        rule_version="v1",
        key="m1",
        decision_id="d-1",
        causing_event_ids=("e-1",),
        runtime="rt",
        base_model="tiny",
        dataset="s3://b/d.jsonl",
        promotion=CONTEXT.promotion,
        champion_uri="s3://b/adapters/ft-0",
    )
    launch = DecisionRecord(
        outcome=Outcome.LAUNCH,
        reason=None,
        rule="drift",
        rule_version="v1",
        key="m1",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        event_ids=("e-1",),
        job=job,
        job_name="ft-1",
    )
    written = launch.to_json()
    assert written["job"]["promotion"] == {
        "metric": "token_accuracy",
        "mode": "max",
        "min_delta": 0.02,
    }
    assert DecisionRecord.from_json(written) == launch

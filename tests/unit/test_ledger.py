"""Decision records: JSON and audit-CloudEvent round trips, deterministic ids."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import LoraSettings, TraceContext, TrainingRequest
from orchestrator.ledger import (
    DECISION_EVENT_TYPE,
    DecisionRecord,
    Outcome,
    Reason,
    decision_id,
    format_time,
    from_cloudevent,
    parse_time,
    to_cloudevent,
)

AT = datetime(2026, 3, 1, 9, 20, tzinfo=UTC)


def launch_record() -> DecisionRecord:
    job = TrainingRequest(
        name="chat-drift-chat-model-136c30d510",
        rule="r",
        rule_version="v1",
        key="chat-7",
        decision_id="d-1",
        causing_event_ids=("e1", "e2"),
        runtime="torch-distributed",
        base_model="HuggingFaceTB/SmolLM2-135M",
        dataset="s3://x",
        lora=LoraSettings(target_modules=("q_proj",)),
        deadline_seconds=60,
        model_id="chat-7",
    )
    return DecisionRecord(
        decision_id="d-1",
        outcome=Outcome.LAUNCH,
        reason=None,
        rule="r",
        rule_version="v1",
        key="chat-7",
        time=AT,
        event_ids=("e1", "e2"),
        message="launched",
        job=job,
        job_name=job.name,
        window_count=2,
    )


def test_a_record_survives_a_json_round_trip():
    record = launch_record()
    assert DecisionRecord.from_json(record.to_json()) == record


def test_json_has_the_fields_other_tools_read():
    data = launch_record().to_json()
    assert {"outcome", "reason", "rule", "key", "time", "event_ids", "job"} <= set(data)
    assert data["time"] == "2026-03-01T09:20:00Z"
    assert {"name", "runtime", "base_model", "dataset", "lora", "training", "resources"} <= set(
        data["job"]
    )


def test_a_record_survives_the_audit_cloudevent_round_trip():
    record = launch_record()
    event = to_cloudevent(record)
    assert event.type == DECISION_EVENT_TYPE
    assert event.id == record.decision_id
    assert event.extensions["partitionkey"] == "chat-7"
    assert from_cloudevent(event) == record


def test_an_event_that_is_not_a_decision_is_refused_with_a_code():
    with pytest.raises(InvalidEventError) as caught:
        from_cloudevent(CloudEvent(id="x", source="/s", type="other", data={}))
    assert caught.value.code == "not-a-decision"


def test_decision_ids_are_deterministic_and_depend_on_every_input():
    base = dict(
        rule_version="v1",
        key="k",
        outcome=Outcome.SUPPRESS,
        reason=Reason.COOLDOWN,
        event_ids=("e1",),
        time=AT,
    )
    assert decision_id(**base) == decision_id(**base)
    assert decision_id(**base) != decision_id(**{**base, "reason": Reason.CONCURRENCY})
    assert decision_id(**base) != decision_id(**{**base, "event_ids": ("e2",)})


def test_a_malformed_record_is_a_value_error():
    with pytest.raises(ValueError, match="not a decision record"):
        DecisionRecord.from_json({"outcome": "launch"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01T12:00:00Z", datetime(2026, 3, 1, 12, tzinfo=UTC)),
        ("2026-03-01T13:30:00.250+01:30", datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)),
    ],
    ids=["zulu", "offset-and-fraction"],
)
def test_stored_times_read_back_in_utc(text, expected):
    assert parse_time(text) == expected
    assert parse_time(text).tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    ["2026-03-01T12:00:00", "2026-03-01 12:00:00Z", "2026-W09-7T12:00:00Z", 1767225600],
    ids=["no-offset", "space-not-T", "week-date", "not-a-string"],
)
def test_a_time_rfc_3339_forbids_is_a_value_error(text):
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time(text)


def test_times_are_written_in_utc_with_a_z():
    moment = datetime(2026, 3, 1, 13, 30, tzinfo=timezone(timedelta(hours=1, minutes=30)))
    assert format_time(moment) == "2026-03-01T12:00:00Z"
    assert format_time(moment.replace(microsecond=5)) == "2026-03-01T12:00:00.000005Z"


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_why_not_record_with_a_trace_and_a_suppressed_count_survives_both_round_trips():
    record = DecisionRecord(
        outcome=Outcome.IGNORE,
        reason=Reason.WHERE_FALSE,
        rule="r",
        rule_version="v1",
        key="",
        time=AT,
        event_ids=("e9",),
        message="`where` is false",
        suppressed=4,
        trace=TraceContext(TRACEPARENT, "vendor=1"),
    )
    assert DecisionRecord.from_json(record.to_json()) == record
    assert from_cloudevent(to_cloudevent(record)) == record


def test_the_why_not_and_trace_fields_are_flat_json_for_the_dashboard():
    record = DecisionRecord(
        outcome=Outcome.IGNORE,
        reason=Reason.SOURCE_MISMATCH,
        rule="r",
        rule_version="v1",
        key="",
        time=AT,
        event_ids=("e9",),
        suppressed=2,
        trace=TraceContext(TRACEPARENT),
    )
    data = record.to_json()
    assert (data["outcome"], data["reason"], data["suppressed"]) == (
        "ignore",
        "source-mismatch",
        2,
    )
    assert data["traceparent"] == TRACEPARENT
    assert "tracestate" not in data


def test_the_audit_event_carries_the_deciding_events_trace_as_the_tracing_extension():
    record = replace(launch_record(), trace=TraceContext(TRACEPARENT, "vendor=1"))
    extensions = to_cloudevent(record).extensions
    assert extensions["traceparent"] == TRACEPARENT
    assert extensions["tracestate"] == "vendor=1"


def test_a_record_without_a_trace_or_suppressed_records_writes_neither_field():
    record = launch_record()
    data = record.to_json()
    assert {"suppressed", "traceparent", "tracestate"}.isdisjoint(data)
    assert "traceparent" not in to_cloudevent(record).extensions


@pytest.mark.parametrize(
    "traceparent",
    [
        "not-a-trace",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        42,
    ],
    ids=["garbage", "zero-trace-id", "zero-span-id", "upper-case", "not-a-string"],
)
def test_a_malformed_traceparent_is_no_trace_context(traceparent):
    assert TraceContext.of({"traceparent": traceparent}) is None


def test_a_trace_context_names_its_trace_id():
    assert TraceContext(TRACEPARENT).trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"

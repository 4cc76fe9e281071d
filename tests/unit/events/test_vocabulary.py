"""The event vocabulary: built-in schemas, user schemas, tuneloop's own output events."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest

from orchestrator.errors import ConfigError, InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobRef, JobResult, TrainingRequest
from orchestrator.vocabulary import EventType, SchemaRegistry
from orchestrator.vocabulary.output import finetune_completed, finetune_failed, finetune_started

REGISTRY = SchemaRegistry.builtin()
AT = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)

DRIFT = {
    "model_id": "chat-lora-base",
    "metric": "jensen_shannon",
    "value": 0.17,
    "threshold": 0.1,
    "feature": "prompt_length",
    "severity": "high",
    "window": {"start": "2026-05-01T00:00:00Z", "end": "2026-05-01T12:00:00Z"},
    "reference_dataset_id": "ref-2026-04",
    "current_dataset_id": "cur-2026-05-01",
    "rows": 48210,
    "detector": "evidently@0.7.23",
}


def event(event_type: str, data: object) -> CloudEvent:
    return CloudEvent(id="1", source="/monitors/x", type=event_type, data=data)


def test_every_builtin_type_has_a_schema() -> None:
    assert set(REGISTRY.types) == {member.value for member in EventType}


SCHEMA_FILES = sorted(
    (Path(__file__).parents[3] / "orchestrator/vocabulary/schemas").glob("*.json")
)


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=[path.stem for path in SCHEMA_FILES])
def test_every_builtin_schema_is_a_valid_json_schema(path: Path) -> None:
    # The built-in registry does not check its own schemas at each start; this does.
    schema = json.loads(path.read_text("utf-8"))
    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_a_complete_drift_report_is_valid() -> None:
    REGISTRY.validate(event(EventType.DRIFT_DETECTED, DRIFT))


def test_drift_needs_only_model_metric_value_and_threshold() -> None:
    minimal = {key: DRIFT[key] for key in ("model_id", "metric", "value", "threshold")}
    REGISTRY.validate(event(EventType.DRIFT_DETECTED, minimal))


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"model_id": None}, "model_id"),
        ({"value": "high"}, "value"),
        ({"severity": "apocalyptic"}, "severity"),
        ({"rows": -1}, "rows"),
        ({"window": {"start": "yesterday", "end": "2026-05-01T12:00:00Z"}}, "window/start"),
    ],
    ids=["model_id-null", "value-not-number", "severity-unknown", "rows-negative", "window-time"],
)
def test_drift_data_failing_its_schema_names_the_place(change: dict, where: str) -> None:
    data = {**DRIFT, **change}
    with pytest.raises(InvalidEventError) as caught:
        REGISTRY.validate(event(EventType.DRIFT_DETECTED, data))
    assert caught.value.code == "data.schema_mismatch"
    assert where in caught.value.message


def test_data_arrived_needs_dataset_uri_and_rows() -> None:
    good = {"dataset_id": "support-tickets", "uri": "s3://b/p/", "rows": 500, "format": "jsonl"}
    REGISTRY.validate(event(EventType.DATA_ARRIVED, good))
    with pytest.raises(InvalidEventError):
        REGISTRY.validate(event(EventType.DATA_ARRIVED, {"dataset_id": "d", "rows": 5}))


def test_bytes_data_fails_a_json_schema() -> None:
    with pytest.raises(InvalidEventError) as caught:
        REGISTRY.validate(event(EventType.DATA_ARRIVED, b"\x00"))
    assert caught.value.code == "data.schema_mismatch"


def test_unknown_type_is_refused_unless_accepted() -> None:
    unknown = event("com.example.something", {"x": 1})
    with pytest.raises(InvalidEventError) as caught:
        REGISTRY.validate(unknown)
    assert caught.value.code == "type.unknown"
    REGISTRY.validate(unknown, accept_unknown=True)


def test_user_schema_file_registers_a_new_type(tmp_path: Path) -> None:
    path = tmp_path / "com.example.labels.ready.v1.json"
    path.write_text(json.dumps({"type": "object", "required": ["count"]}))
    registry = REGISTRY.with_schema_file(path)
    registry.validate(event("com.example.labels.ready.v1", {"count": 3}))
    with pytest.raises(InvalidEventError):
        registry.validate(event("com.example.labels.ready.v1", {}))
    assert not REGISTRY.knows("com.example.labels.ready.v1")


def test_user_schema_file_may_name_its_type_and_be_yaml(tmp_path: Path) -> None:
    path = tmp_path / "labels.yaml"
    path.write_text("x-cloudevents-type: com.example.labels.v2\ntype: object\n")
    assert REGISTRY.with_schema_file(path).knows("com.example.labels.v2")


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"type": "no-such-type"}', "[1, 2]"],
    ids=["unparsable", "invalid-schema", "not-an-object"],
)
def test_bad_user_schema_file_is_a_config_error_naming_the_file(tmp_path: Path, content: str):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=r"bad\.json"):
        REGISTRY.with_schema_file(path)


REQUEST = TrainingRequest(
    name="ft-chat-3f9a2c",
    rule="retrain-on-drift",
    rule_version="7",
    key="chat-lora-base",
    decision_id="dec-42",
    causing_event_ids=("drift-1", "drift-2"),
    runtime="lora-cpu",
    base_model="smollm2-135m",
    dataset="support-tickets",
)
JOB = JobRef(name="ft-chat-3f9a2c", backend="kubernetes", namespace="ml")


def test_output_events_validate_against_their_schemas() -> None:
    started = finetune_started(REQUEST, job=JOB, at=AT)
    completed = finetune_completed(
        REQUEST,
        job=JOB,
        at=AT + timedelta(minutes=5),
        result=JobResult(adapter_uri="file:///a", metrics={"eval_loss": 1.2}),
        launched_at=AT - timedelta(minutes=1),
        started_at=AT,
    )
    failed = finetune_failed(REQUEST, job=JOB, at=AT, reason="OOMKilled", message="137")
    for produced in (started, completed, failed):
        REGISTRY.validate(produced)
    assert completed.data["durations"] == {
        "total_seconds": 360.0,
        "running_seconds": 300.0,
        "queued_seconds": 60.0,
    }


def test_output_events_link_decision_and_cause_and_key_by_model() -> None:
    completed = finetune_completed(REQUEST, job=JOB, at=AT, result=JobResult())
    assert completed.extensions["correlationid"] == "dec-42"
    assert completed.extensions["causationid"] == "drift-2"
    assert completed.extensions["partitionkey"] == "chat-lora-base"
    assert completed.data["causing_event_ids"] == ["drift-1", "drift-2"]


def test_republishing_an_outcome_gives_the_same_event_identity() -> None:
    first = finetune_failed(REQUEST, job=JOB, at=AT, reason="x")
    again = finetune_failed(REQUEST, job=JOB, at=AT + timedelta(hours=1), reason="x")
    other = finetune_completed(REQUEST, job=JOB, at=AT, result=JobResult())
    assert first.identity == again.identity == ("/tuneloop/orchestrator", "ft-chat-3f9a2c.failed")
    assert other.identity != first.identity

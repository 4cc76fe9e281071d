"""What a backend gives the trainer so that it tracks its run: two variables, only when a
tracking server is configured; the expected values are built by hand from the request."""

import json

from orchestrator.jobs.model import TrainingRequest
from runtimes.kubernetes import manifests
from runtimes.kubernetes.catalog import RuntimeInfo
from runtimes.tracking import RunContext, TrackingSettings, trainer_environment
from runtimes.tracking.context import run_context_of

REQUEST = TrainingRequest(
    name="drift-acme-1a2b3c4d5e",
    rule="drift",
    rule_version="v3",
    key="acme/llama",
    decision_id="decision-9",
    causing_event_ids=("event-1", "event-2"),
    runtime="tuneloop-lora",
    base_model="tiny",
    dataset="s3://data/acme.jsonl",
)


def test_without_a_tracking_server_the_trainer_gets_nothing():
    assert trainer_environment(REQUEST, None) == {}


def test_with_a_tracking_server_the_trainer_gets_its_uri_and_the_jobs_provenance():
    environment = trainer_environment(REQUEST, "http://mlflow:5000")
    assert environment["TUNELOOP_MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert json.loads(environment["TUNELOOP_RUN_CONTEXT"]) == {
        "job": "drift-acme-1a2b3c4d5e",
        "rule": "drift",
        "rule_version": "v3",
        "key": "acme/llama",
        "decision_id": "decision-9",
        "causing_event_ids": ["event-1", "event-2"],
    }


def test_the_trainer_reads_back_the_context_it_was_given():
    context = run_context_of(trainer_environment(REQUEST, "http://mlflow:5000"))
    assert context == RunContext(
        job="drift-acme-1a2b3c4d5e",
        rule="drift",
        rule_version="v3",
        key="acme/llama",
        decision_id="decision-9",
        causing_event_ids=("event-1", "event-2"),
    )


def test_an_unreadable_context_is_no_context():
    assert run_context_of({"TUNELOOP_RUN_CONTEXT": "{not json"}) is None
    assert run_context_of({"TUNELOOP_RUN_CONTEXT": '{"job": 1}'}) is None
    assert run_context_of({}) is None


def _trainer_env(settings: manifests.Settings) -> dict[str, str]:
    runtime = RuntimeInfo(kind="ClusterTrainingRuntime", name="tuneloop-lora")
    job = manifests.build_trainjob(REQUEST, namespace="ml", runtime=runtime, settings=settings)
    return {e["name"]: e.get("value") for e in job["spec"]["trainer"]["env"]}


def test_a_trainjob_carries_the_tracking_variables_only_when_tracking_is_configured():
    assert "TUNELOOP_MLFLOW_TRACKING_URI" not in _trainer_env(manifests.Settings())
    assert "TUNELOOP_RUN_CONTEXT" not in _trainer_env(manifests.Settings())
    env = _trainer_env(manifests.Settings(mlflow_tracking_uri="http://mlflow.ml:5000"))
    assert env["TUNELOOP_MLFLOW_TRACKING_URI"] == "http://mlflow.ml:5000"
    assert json.loads(env["TUNELOOP_RUN_CONTEXT"])["decision_id"] == "decision-9"


def test_tracking_settings_read_the_uri_timeout_and_mlflows_own_credential_variables():
    settings = TrackingSettings.from_env(
        {
            "TUNELOOP_MLFLOW_TRACKING_URI": "http://mlflow:5000/",
            "TUNELOOP_MLFLOW_REQUEST_TIMEOUT": "3",
            "MLFLOW_TRACKING_TOKEN": "secret-token",
        }
    )
    assert settings.tracking_uri == "http://mlflow:5000"
    assert settings.request_timeout == 3.0
    assert settings.token == "secret-token"
    assert "secret-token" not in repr(settings)
    assert not TrackingSettings.from_env({}).enabled

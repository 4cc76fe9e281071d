"""A TrainJob whose adapter goes to object storage: the trainer is told where to publish, gets
the store's settings from a Secret by reference, and the completion's adapter URI is only the
one the trainer reported."""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.jobs.model import TrainingRequest
from orchestrator.settings import Settings
from runtimes.kubernetes import manifests, results
from runtimes.kubernetes.backend import BackendSettings
from runtimes.kubernetes.catalog import RuntimeInfo

REQUEST = TrainingRequest(
    name="ft-s3",
    rule="r",
    rule_version="1",
    key="model-a",
    decision_id="d-1",
    causing_event_ids=("e-1",),
    runtime="torch-distributed",
    base_model="tiny",
    dataset="s3://datasets/support/",
    output_uri="s3://adapters/support",
)


def build(request: TrainingRequest = REQUEST, **settings: Any) -> dict[str, Any]:
    return manifests.build_trainjob(
        request,
        namespace="ml",
        runtime=RuntimeInfo(name="torch-distributed"),
        settings=manifests.Settings(**settings),
    )


def argument(obj: dict[str, Any], name: str) -> str | None:
    args = obj["spec"]["trainer"]["args"]
    return args[args.index(name) + 1] if name in args else None


def test_an_s3_output_is_published_by_the_trainer_under_the_job_name():
    obj = build()
    assert argument(obj, "--output-uri") == "s3://adapters/support"
    assert argument(obj, "--output-dir") == "/workspace/output/ft-s3"
    assert argument(obj, "--job-name") == "ft-s3"


def test_the_deployments_s3_base_is_published_to_when_the_request_names_none():
    obj = build(dataclasses.replace(REQUEST, output_uri=None), output_base_uri="s3://adapters")
    assert argument(obj, "--output-uri") == "s3://adapters"


def test_a_local_output_is_written_in_place_and_not_published():
    obj = build(dataclasses.replace(REQUEST, output_uri="file:///srv/adapters/ft-s3"))
    assert argument(obj, "--output-uri") is None
    assert argument(obj, "--output-dir") == "/srv/adapters/ft-s3"


def test_the_store_settings_come_from_the_named_secret_by_reference_only():
    env = build(storage_secret="object-storage")["spec"]["trainer"]["env"]
    by_name = {entry["name"]: entry for entry in env}
    assert by_name["AWS_ACCESS_KEY_ID"] == {
        "name": "AWS_ACCESS_KEY_ID",
        "valueFrom": {"secretKeyRef": {"name": "object-storage", "key": "AWS_ACCESS_KEY_ID"}},
    }
    assert by_name["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "object-storage",
        "key": "AWS_SECRET_ACCESS_KEY",
    }
    assert by_name["TUNELOOP_S3_ENDPOINT_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "object-storage",
        "key": "TUNELOOP_S3_ENDPOINT_URL",
        "optional": True,
    }
    assert by_name["AWS_REGION"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert not [entry for entry in env if "value" in entry and "AWS" in entry["name"]]


def test_without_a_storage_secret_no_store_variable_is_set():
    env = build()["spec"]["trainer"]["env"]
    assert [entry["name"] for entry in env] == ["TUNELOOP_DECISION_ID", "TUNELOOP_OUTPUT_URI"]


def finished(obj: dict[str, Any], metrics: list[dict[str, str]]) -> dict[str, Any]:
    obj["status"] = {"trainerStatus": {"progressPercentage": 100, "metrics": metrics}}
    return obj


def test_the_adapter_uri_is_the_one_the_trainers_final_report_names():
    obj = finished(
        build(),
        [
            {"name": "adapter_uri", "value": "s3://adapters/support/ft-s3"},
            {"name": "eval_loss", "value": "0.5"},
        ],
    )
    result = results.result_of(obj)
    assert result.adapter_uri == "s3://adapters/support/ft-s3"
    assert dict(result.metrics) == {"eval_loss": 0.5}


def test_a_long_reported_adapter_uri_is_joined_from_its_pieces():
    uri = "s3://adapters/" + "a" * 60 + "/" + "b" * 30 + "/ft-s3"
    pieces = [uri[:64], uri[64:128]]
    obj = finished(
        build(),
        [
            {"name": "adapter_uri.2", "value": pieces[1]},
            {"name": "adapter_uri.1", "value": pieces[0]},
        ],
    )
    result = results.result_of(obj)
    assert result.adapter_uri == uri
    assert dict(result.metrics) == {}


def test_an_s3_output_the_trainer_never_reported_names_no_adapter():
    obj = finished(build(), [{"name": "eval_loss", "value": "0.5"}])
    assert results.result_of(obj).adapter_uri is None


def test_the_worker_setting_names_the_secret_every_trainjob_refers_to():
    kubernetes = Settings.from_env(
        {"TUNELOOP_KUBERNETES_STORAGE_SECRET": "object-storage"}
    ).kubernetes
    backend = BackendSettings.from_settings(kubernetes)
    assert backend.manifests.storage_secret == "object-storage"
    env = build(storage_secret=backend.manifests.storage_secret)["spec"]["trainer"]["env"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in env if "valueFrom" in e}
    assert refs == {"object-storage"}

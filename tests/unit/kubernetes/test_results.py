"""Reading back what a TrainJob produced and where it came from."""

from __future__ import annotations

import json

from orchestrator.jobs.model import TrainingRequest
from runtimes.kubernetes import manifests, results
from runtimes.kubernetes.catalog import RuntimeInfo

REQUEST = TrainingRequest(
    name="ft-a",
    rule="r",
    rule_version="1",
    key="model-a",
    decision_id="d-1",
    causing_event_ids=("e-1", "e-2"),
    runtime="torch-distributed",
    base_model="tiny",
    dataset="file:///d",
    model_id="model-a",
)


def built(output_uri=None):
    request = (
        REQUEST
        if output_uri is None
        else TrainingRequest(
            **{
                **{f: getattr(REQUEST, f) for f in REQUEST.__dataclass_fields__},
                "output_uri": output_uri,
            }
        )
    )
    return manifests.build_trainjob(
        request,
        namespace="ml",
        runtime=RuntimeInfo(name="torch-distributed"),
        settings=manifests.Settings(),
    )


def test_result_defaults_to_the_output_uri_and_status_metrics():
    obj = built()
    obj["status"] = {
        "trainerStatus": {
            "metrics": [{"name": "train_loss", "value": "0.5"}, {"name": "steps", "value": "20"}]
        }
    }
    result = results.result_of(obj)
    assert result.adapter_uri == "file:///var/lib/tuneloop/adapters/ft-a"
    assert dict(result.metrics) == {"train_loss": 0.5, "steps": 20}


def test_result_file_under_the_output_uri_wins(tmp_path):
    (tmp_path / "result.json").write_text(
        json.dumps({"adapter_uri": f"file://{tmp_path}/adapter", "metrics": {"eval_loss": 0.4}})
    )
    obj = built(output_uri=f"file://{tmp_path}")
    obj["status"] = {"trainerStatus": {"metrics": [{"name": "eval_loss", "value": "9"}]}}
    result = results.result_of(obj, file_result=results.read_result_file(f"file://{tmp_path}"))
    assert result.adapter_uri == f"file://{tmp_path}/adapter"
    assert dict(result.metrics) == {"eval_loss": 0.4}


def test_missing_or_remote_result_files_are_none(tmp_path):
    assert results.read_result_file(f"file://{tmp_path}/nothing-here") is None
    assert results.read_result_file("s3://bucket/out") is None
    (tmp_path / "result.json").write_text("{not json")
    assert results.read_result_file(str(tmp_path)) is None


def test_context_is_recovered_from_the_annotations_the_builder_wrote():
    obj = built()
    obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    context = results.context_of_trainjob(obj)
    assert context is not None
    assert (context.rule, context.key, context.decision_id) == ("r", "model-a", "d-1")
    assert context.causing_event_ids == ("e-1", "e-2")
    assert context.model_id == "model-a"
    assert context.launched_at.year == 2026


def test_foreign_trainjobs_have_no_context():
    assert results.context_of_trainjob({"metadata": {"name": "x", "labels": {}}}) is None


def test_the_trainers_adapter_dir_becomes_a_file_uri(tmp_path):
    (tmp_path / "result.json").write_text(
        json.dumps(
            {"status": "succeeded", "adapter_dir": "/out/a/adapter", "metrics": {"steps": 3}}
        )
    )
    result = results.read_result_file(str(tmp_path))
    assert result.adapter_uri == "file:///out/a/adapter"
    assert dict(result.metrics) == {"steps": 3}

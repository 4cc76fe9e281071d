"""The trainer's failure rule for tracking (`runtimes/tracking/runs.py`), on a STAND-IN client.

`StandInMlflowClient` stands in for `runtimes/tracking/client.py` only here, in a unit test of
the rule's logic: which calls are made while the server is away, what is sent when it comes
back, and that nothing ever raises into training. The real client against a real server is
tested in tests/integration/test_mlflow_tracking.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtimes.tracking.client import Metric, ModelVersion, RunInfo
from runtimes.tracking.context import RunContext
from runtimes.tracking.errors import TrackingRequestError, TrackingUnavailableError
from runtimes.tracking.runs import TrackedRun

CONTEXT = RunContext(
    job="job-1",
    rule="drift",
    rule_version="v1",
    key="m1",
    decision_id="d-1",
    causing_event_ids=("e-1",),
)


@dataclass
class StandInMlflowClient:
    """Records each call; raises `TrackingUnavailableError` while `down`, and refuses
    uploads with `refuse_uploads` (a server without `--serve-artifacts`)."""

    down: bool = False
    refuse_uploads: bool = False
    calls: list[str] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    ended: str | None = None
    versions: list[dict[str, Any]] = field(default_factory=list)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.down:
            raise TrackingUnavailableError(f"{name}: the server cannot be reached")

    def experiment_id(self, name: str) -> str:
        self._call("experiment_id")
        return "1"

    def find_run(self, experiment_id: str, *, tag: str, value: str) -> RunInfo | None:
        self._call("find_run")
        return None

    def create_run(self, experiment_id: str, *, name: str, tags: dict[str, str]) -> RunInfo:
        self._call("create_run")
        return RunInfo("run-1", "1", "mlflow-artifacts:/1/run-1/artifacts", "RUNNING")

    def log_batch(self, run_id: str, *, metrics=(), params=None, tags=None) -> None:
        self._call("log_batch")
        self.metrics += list(metrics)
        self.tags.update(tags or {})

    def upload_artifacts(self, artifact_uri: str, files) -> tuple[str, ...]:
        self._call("upload_artifacts")
        if self.refuse_uploads:
            raise TrackingRequestError("not proxied", status=0, error_code="ARTIFACTS_NOT_PROXIED")
        return tuple(relative for _, relative in files)

    def ensure_registered_model(self, name: str, *, tags: dict[str, str]) -> None:
        self._call("ensure_registered_model")

    def find_model_versions(self, name: str, *, tag: str, value: str) -> tuple[ModelVersion, ...]:
        self._call("find_model_versions")
        return ()

    def create_model_version(self, name: str, *, source: str, run_id, tags) -> ModelVersion:
        self._call("create_model_version")
        self.versions.append({"name": name, "source": source, "run_id": run_id})
        return ModelVersion(name, "1", source, run_id or "", tags, ())

    def end_run(self, run_id: str, status: str) -> None:
        self._call("end_run")
        self.ended = status

    def reopen_run(self, run_id: str) -> None:
        self._call("reopen_run")


def _run(client: StandInMlflowClient, warnings: list[str]) -> TrackedRun:
    return TrackedRun(
        client,  # type: ignore[arg-type]
        job="job-1",
        context=CONTEXT,
        params={"lora_r": "8"},
        tags={},
        warn=warnings.append,
        flush_seconds=0.0,
    )


def _adapter(tmp_path: Path) -> Path:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    return adapter


def test_a_server_that_is_away_is_not_called_again_until_the_run_ends(tmp_path):
    client, warnings = StandInMlflowClient(down=True), []
    run = _run(client, warnings)
    run.start()
    for step in range(1, 51):
        run.log_metrics({"train_loss": 1.0 / step}, step=step)
    assert client.calls == ["experiment_id"]  # one try, then nothing per step
    assert len(warnings) == 1
    assert "cannot be reached" in warnings[0]


def test_a_server_back_at_the_end_gets_every_step_and_the_warnings(tmp_path):
    client, warnings = StandInMlflowClient(down=True), []
    run = _run(client, warnings)
    run.start()
    for step in (1, 2, 3):
        run.log_metrics({"train_loss": float(step)}, step=step)
    client.down = False
    outcome = run.complete(
        metrics={"eval_loss": 0.5},
        step=3,
        adapter_dir=_adapter(tmp_path),
        adapter_uri=None,
    )
    assert sorted((m.key, m.step) for m in client.metrics) == [
        ("eval_loss", 3),
        ("train_loss", 1),
        ("train_loss", 2),
        ("train_loss", 3),
    ]
    assert client.ended == "FINISHED"
    assert outcome.artifacts_uploaded
    assert outcome.model_version == "1"
    assert "cannot be reached" in client.tags["tuneloop.tracking_warnings"]


def test_an_upload_refused_is_skipped_and_the_published_location_is_registered(tmp_path):
    client, warnings = StandInMlflowClient(refuse_uploads=True), []
    run = _run(client, warnings)
    run.start()
    outcome = run.complete(
        metrics={},
        step=1,
        adapter_dir=_adapter(tmp_path),
        adapter_uri="s3://adapters/job-1",
    )
    assert not outcome.artifacts_uploaded
    assert client.versions == [
        {"name": "tuneloop.drift.m1", "source": "s3://adapters/job-1", "run_id": "run-1"}
    ]
    assert client.tags["tuneloop.artifacts"].startswith("not uploaded")
    assert client.ended == "FINISHED"
    assert any("not proxied" in w for w in warnings)


def test_a_local_adapter_that_was_not_uploaded_is_not_registered(tmp_path):
    client, warnings = StandInMlflowClient(refuse_uploads=True), []
    run = _run(client, warnings)
    outcome = run.complete(metrics={}, step=1, adapter_dir=_adapter(tmp_path), adapter_uri=None)
    assert client.versions == []
    assert outcome.model_version is None
    assert any("no model version" in w for w in warnings)
    assert client.ended == "FINISHED"


def test_nothing_raises_into_training_whatever_the_client_does(tmp_path):
    class Broken(StandInMlflowClient):
        def experiment_id(self, name: str) -> str:
            raise RuntimeError("a bug of ours")

    client, warnings = Broken(), []
    run = _run(client, warnings)
    run.start()
    run.log_metrics({"train_loss": 1.0}, step=1)
    run.fail("the trainer failed")
    assert any("RuntimeError: a bug of ours" in w for w in warnings)


def test_a_failed_job_ends_its_run_failed_with_the_error():
    client, warnings = StandInMlflowClient(), []
    run = _run(client, warnings)
    run.start()
    run.fail("dataset is malformed")
    assert client.ended == "FAILED"
    assert client.tags["tuneloop.error"] == "dataset is malformed"
    assert warnings == []

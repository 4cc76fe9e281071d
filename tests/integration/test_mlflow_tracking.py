"""Training runs tracked in a real MLflow server, and the champion alias in its registry.

The trainer runs as the backends start it (`python -m runtimes.trainer`, with the two
variables a backend gives it); what it logged is read back over MLflow's REST API by the
tests' own reader (`tests/fixtures/mlflow.py`), never by `runtimes/tracking/client.py`. The
expected names are written out by hand.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.errors import TransientBackendError
from runtimes.tracking import TrackingSettings
from runtimes.tracking.champions import MlflowChampionStore
from tests.fixtures.mlflow import MlflowRest, tags_of

pytestmark = [pytest.mark.mlflow, pytest.mark.training]

STEPS = 4


def _train(
    model: Path,
    dataset: Path,
    output: Path,
    *,
    job: str,
    tracking_uri: str,
    context: dict[str, object],
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "runtimes.trainer"]
    command += ["--base-model", str(model), "--dataset", str(dataset), "--output-dir", str(output)]
    command += ["--max-steps", str(STEPS), "--batch-size", "4", "--logging-steps", "1"]
    command += ["--lora-r", "8", "--learning-rate", "0.001", "--job-name", job]
    command += ["--save-steps", "0", "--cpu-threads", "1", "--progress", "json"]
    command += ["--progress-interval", "0"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TUNELOOP_", "KUBEFLOW_"))}
    env = {
        **clean,
        # What both backends give a trainer when tracking is on (runtimes/tracking/context.py),
        # written here by hand.
        "TUNELOOP_MLFLOW_TRACKING_URI": tracking_uri,
        "TUNELOOP_RUN_CONTEXT": json.dumps(context),
    }
    return subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, timeout=300
    )


def _context(job: str, rule: str, key: str) -> dict[str, object]:
    return {
        "job": job,
        "rule": rule,
        "rule_version": "v1",
        "key": key,
        "decision_id": f"decision-of-{job}",
        "causing_event_ids": [f"{job}-event-1", f"{job}-event-2"],
    }


def _events(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def rule() -> str:
    return f"drift-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def two_jobs(tiny_model_dir, reverse_dataset, tmp_path_factory, mlflow_server, rule):
    """Two finished jobs of one rule and key, tracked: (job name, output dir) each."""
    jobs = []
    for job in ("job-one", "job-two"):
        output = tmp_path_factory.mktemp(job) / "out"
        completed = _train(
            tiny_model_dir,
            reverse_dataset,
            output,
            job=f"{rule}-{job}",
            tracking_uri=mlflow_server.tracking_uri,
            context=_context(f"{rule}-{job}", rule, "acme-llama"),
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        warnings = [e for e in _events(completed.stdout) if e["event"] == "warning"]
        assert warnings == []
        jobs.append((f"{rule}-{job}", output))
    return jobs


def test_a_training_run_logs_params_per_step_metrics_the_adapter_and_its_provenance(
    two_jobs, mlflow_rest: MlflowRest, rule
):
    job, output = two_jobs[0]
    run = mlflow_rest.run_of_job(f"tuneloop/{rule}", job)
    assert run is not None
    assert run["info"]["status"] == "FINISHED"
    assert run["info"]["run_name"] == job

    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["lora_r"] == "8"
    assert params["learning_rate"] == "0.001"
    assert params["max_steps"] == str(STEPS)
    assert params["base_model"].endswith("tiny-llama")

    run_id = run["info"]["run_id"]
    # One train_loss point per optimiser step, as the trainer logged them (logging_steps 1).
    train_loss = mlflow_rest.metric_history(run_id, "train_loss")
    assert [step for step, _ in train_loss] == list(range(1, STEPS + 1))
    # The held-out loss before training (step 0) and after it (the last step).
    eval_loss = mlflow_rest.metric_history(run_id, "eval_loss")
    assert next(step for step, _ in eval_loss) == 0
    assert [step for step, _ in eval_loss][-1] == STEPS
    result = json.loads((output / "result.json").read_text())
    assert eval_loss[-1][1] == pytest.approx(result["metrics"]["eval_loss"])
    assert mlflow_rest.metric_history(run_id, "perplexity")[-1][1] == pytest.approx(
        result["metrics"]["perplexity"]
    )

    tags = tags_of(run)
    assert tags["tuneloop.rule"] == rule
    assert tags["tuneloop.key"] == "acme-llama"
    assert tags["tuneloop.decision_id"] == f"decision-of-{job}"
    assert json.loads(tags["tuneloop.causing_event_ids"]) == [f"{job}-event-1", f"{job}-event-2"]
    assert tags["tuneloop.adapter_uri"] == str((output / "adapter").resolve())
    assert tags["tuneloop.artifacts"] == "uploaded"

    # The adapter itself, byte for byte, through the server's artifact proxy.
    listed = mlflow_rest.get("mlflow/artifacts/list", run_id=run_id, path="adapter")
    names = {Path(f["path"]).name for f in listed["files"]}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        uploaded = mlflow_rest.download(run["info"]["artifact_uri"], f"adapter/{name}")
        assert uploaded == (output / "adapter" / name).read_bytes()


def test_each_finished_job_is_a_version_of_the_rule_and_keys_model_and_none_is_champion_yet(
    two_jobs, mlflow_rest: MlflowRest, rule
):
    model = f"tuneloop.{rule}.acme-llama"
    versions = mlflow_rest.versions(model)
    assert [tags_of(v)["tuneloop.job"] for v in versions] == [job for job, _ in two_jobs]
    for version, (job, output) in zip(versions, two_jobs, strict=True):
        run = mlflow_rest.run_of_job(f"tuneloop/{rule}", job)
        assert version["run_id"] == run["info"]["run_id"]
        assert version["source"] == f"{run['info']['artifact_uri']}/adapter"
        assert tags_of(version)["tuneloop.adapter_uri"] == str((output / "adapter").resolve())
    assert mlflow_rest.champion_version(model) is None


async def test_the_champion_alias_moves_on_promote_and_only_then(
    two_jobs, mlflow_rest: MlflowRest, mlflow_tracking: TrackingSettings, rule
):
    store = MlflowChampionStore(mlflow_tracking)
    model = f"tuneloop.{rule}.acme-llama"
    (first, first_out), (second, second_out) = two_jobs
    first_adapter = str((first_out / "adapter").resolve())
    second_adapter = str((second_out / "adapter").resolve())

    assert await store.current(rule, "acme-llama") is None

    await store.promote(rule, "acme-llama", first_adapter, first, {"eval_loss": 1.25})
    assert mlflow_rest.champion_version(model) == "1"
    assert await store.current(rule, "acme-llama") == first_adapter
    champion = mlflow_rest.get("mlflow/model-versions/get", name=model, version="1")
    assert tags_of(champion["model_version"])["tuneloop.score.eval_loss"] == "1.25"

    # The second job's version exists since it finished; the alias did not move with it.
    assert len(mlflow_rest.versions(model)) == 2
    assert mlflow_rest.champion_version(model) == "1"

    await store.promote(rule, "acme-llama", second_adapter, second, {"eval_loss": 1.0})
    assert mlflow_rest.champion_version(model) == "2"
    assert await store.current(rule, "acme-llama") == second_adapter

    # A replayed promotion of the same job changes nothing and registers nothing new.
    await store.promote(rule, "acme-llama", second_adapter, second, {"eval_loss": 1.0})
    assert mlflow_rest.champion_version(model) == "2"
    assert len(mlflow_rest.versions(model)) == 2


async def test_promote_registers_the_adapter_of_a_job_the_trainer_could_not_track(
    tmp_path: Path, mlflow_rest: MlflowRest, mlflow_tracking: TrackingSettings
):
    rule = f"untracked-{uuid.uuid4().hex[:8]}"
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    store = MlflowChampionStore(mlflow_tracking)

    await store.promote(rule, "k", str(adapter), f"{rule}-job", {"eval_loss": 2.0})

    model = f"tuneloop.{rule}.k"
    assert mlflow_rest.champion_version(model) == "1"
    (version,) = mlflow_rest.versions(model)
    assert tags_of(version)["tuneloop.job"] == f"{rule}-job"
    uploaded = mlflow_rest.download(version["source"], "adapter_config.json")
    assert uploaded == b'{"peft_type": "LORA"}'
    assert await store.current(rule, "k") == str(adapter)


def _port_with_nothing_listening() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_training_succeeds_with_a_warning_when_the_tracking_server_is_down(
    tiny_model_dir, reverse_dataset, tmp_path: Path
):
    down = f"http://127.0.0.1:{_port_with_nothing_listening()}"
    completed = _train(
        tiny_model_dir,
        reverse_dataset,
        tmp_path / "out",
        job="job-untracked",
        tracking_uri=down,
        context=_context("job-untracked", "drift", "k"),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "result.json").read_text())["status"] == "succeeded"
    warnings = [e for e in _events(completed.stdout) if e["event"] == "warning"]
    assert warnings
    assert {w["source"] for w in warnings} == {"mlflow"}
    assert "cannot be reached" in str(warnings[0]["message"])
    # Tried at the start, skipped while training, tried once more at the end: not per step.
    assert len(warnings) <= 3


async def test_the_champion_store_asks_to_retry_later_when_the_server_is_down():
    down = f"http://127.0.0.1:{_port_with_nothing_listening()}"
    store = MlflowChampionStore(TrackingSettings(tracking_uri=down, request_timeout=2.0))
    with pytest.raises(TransientBackendError):
        await store.current("drift", "k")
    with pytest.raises(TransientBackendError):
        await store.promote("drift", "k", "/adapters/a", "job", {})

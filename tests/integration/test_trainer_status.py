"""The trainer program reports its progress and final metrics to Kubeflow's status server
when the TrainJob gives it one, here a named STAND-IN for it
(`tests/unit/trainer/stand_in_status_server.py`); the real server is exercised once the local
control plane runs the Trainer controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.trainer.stand_in_status_server import StandInStatusServer
from tests.unit.trainer.test_kubeflow_status import assert_is_an_update_trainjob_status_request

pytestmark = pytest.mark.training


@pytest.fixture
def status_server(tmp_path: Path):
    (tmp_path / "server").mkdir()
    stand_in = StandInStatusServer().start(tmp_path / "server")
    yield stand_in
    stand_in.stop()


def _train(model: Path, dataset: Path, output: Path, env: dict[str, str]):
    command = [sys.executable, "-m", "runtimes.trainer"]
    command += ["--base-model", str(model), "--dataset", str(dataset)]
    command += ["--output-dir", str(output), "--max-steps", "3", "--batch-size", "4"]
    command += ["--save-steps", "0", "--cpu-threads", "1", "--progress", "json"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TUNELOOP_", "KUBEFLOW_"))}
    return subprocess.run(
        command, env={**clean, **env}, capture_output=True, text=True, check=False, timeout=300
    )


def test_a_run_reports_to_the_status_server_and_ends_with_its_final_metrics(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path, status_server
):
    completed = _train(tiny_model_dir, reverse_dataset, tmp_path / "out", status_server.environ())
    assert completed.returncode == 0, completed.stderr[-3000:]

    bodies = [request.body for request in status_server.received]
    assert len(bodies) >= 2
    for body in bodies:
        assert_is_an_update_trainjob_status_request(body)
    assert bodies[0]["trainerStatus"]["progressPercentage"] == 0
    # 100 % only in the last report, sent once the adapter is written (transformers' own
    # Kubeflow callback, which would report 100 % before that, is not installed).
    progress = [body["trainerStatus"].get("progressPercentage") for body in bodies]
    assert 100 not in progress[:-1]
    final = bodies[-1]["trainerStatus"]
    assert final["progressPercentage"] == 100
    assert final["estimatedRemainingSeconds"] == 0
    metrics = {m["name"]: m["value"] for m in final["metrics"]}
    written = json.loads((tmp_path / "out" / "result.json").read_text())["metrics"]
    assert metrics["steps"] == "3"
    # The evaluation's score, the one a promotion gate compares, as in result.json.
    assert float(metrics["eval_loss"]) == pytest.approx(written["eval_loss"])
    assert float(metrics["perplexity"]) == pytest.approx(written["perplexity"])
    assert float(metrics["train_loss"]) == pytest.approx(written["train_loss_last"])


def test_a_status_server_that_refuses_every_report_does_not_fail_the_run(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path, status_server
):
    status_server.answer = 500
    completed = _train(tiny_model_dir, reverse_dataset, tmp_path / "out", status_server.environ())
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert (tmp_path / "out" / "result.json").is_file()
    assert "progress not reported to Kubeflow (HTTP 500" in completed.stderr

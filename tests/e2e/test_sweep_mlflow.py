"""A sweep tracked in MLflow: one parent run, each trial's run its child. The real broker, the
worker wired by `build_worker` with `TUNELOOP_MLFLOW_TRACKING_URI` set, the local-process
backend running the real trainer on the tiny model, and a real `mlflow server`.

One drift alarm fires a rule whose launch sweeps a grid of two learning rates, both trials at
once, a few steps each. What MLflow holds is read back with the tests' own HTTP calls
(`tests/fixtures/mlflow.py`), and the expected values come from the rule written here and the
sweep's result event: the parent run is named after the sweep and holds its spec as params
and its best trial and objective as metrics; each trial's run names it as `mlflow.parentRunId`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from devservices.mlflow_server import MlflowEndpoint
from orchestrator.events import CloudEvent
from orchestrator.settings import MlflowSettings
from runtimes.localprocess.backend import LocalProcessBackend
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.mlflow import MlflowRest, tags_of
from tests.fixtures.topics import read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.training,
    pytest.mark.mlflow,
    pytest.mark.timeout(300),
]

SWEEP_COMPLETED = "io.tuneloop.finetune.sweep.completed.v1"
RATES = (3e-3, 1e-9)

RULES = """
runtimes: [local]
rules:
  - name: {rule}
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    launch:
      runtime: local
      base_model: tiny
      dataset: "file://{dataset}"
      training: {{max_steps: 10, batch_size: 16, max_seq_length: 64}}
      promote: {{metric: eval_loss}}
      sweep:
        objective: {{metric: eval_loss, mode: min}}
        algorithm: grid
        parameters:
          training.learning_rate: {{values: [0.003, 1.0e-9]}}
        parallel: 2
"""


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "sweep-mlflow")


def params_of(run: dict[str, Any]) -> dict[str, str]:
    return {item["key"]: item["value"] for item in run["data"].get("params", [])}


def metrics_of(run: dict[str, Any]) -> dict[str, float]:
    return {item["key"]: float(item["value"]) for item in run["data"].get("metrics", [])}


async def test_a_sweep_is_one_parent_run_whose_children_are_its_trials(
    kafka_bootstrap: str,
    topics: dict[str, str],
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
    mlflow_server: MlflowEndpoint,
    mlflow_rest: MlflowRest,
) -> None:
    rule = f"sweep-mlflow-{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(rule=rule, dataset=reverse_dataset))
    settings = dataclasses.replace(
        worker_settings(kafka_bootstrap, topics),
        mlflow=MlflowSettings(tracking_uri=mlflow_server.tracking_uri),
    )

    async def result() -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return [e for e in out if e.type == SWEEP_COMPLETED]

    async with LocalProcessBackend(
        tmp_path / "jobs",
        max_concurrent=2,
        poll_interval=0.2,
        trainer_overrides={"cpu_threads": 1, "save_steps": 0},
        tracking_uri=mlflow_server.tracking_uri,
    ) as backend:
        worker = build_test_worker(settings, rules=rules, backend=backend)
        async with running(worker):
            await send_events(kafka_bootstrap, topics["in"], [drift_alarm("sweep-mlflow-1")])
            await wait_for(result, what="the sweep's result", timeout=240)
            crash = worker.app._crash_reason

    assert crash is None, crash
    (sweep,) = await result()
    trials = sweep.data["trials"]
    assert [t["state"] for t in trials] == ["completed", "completed"]
    best = sweep.data["best"]

    experiment = mlflow_rest.get(
        "mlflow/experiments/get-by-name", experiment_name=f"tuneloop/{rule}"
    )
    runs = mlflow_rest.post(
        "mlflow/runs/search",
        {"experiment_ids": [experiment["experiment"]["experiment_id"]], "max_results": 100},
    )["runs"]
    parents = [r for r in runs if "mlflow.parentRunId" not in tags_of(r)]
    children = [r for r in runs if "mlflow.parentRunId" in tags_of(r)]

    # One parent run: the sweep, named after it, with its spec as params.
    (parent,) = parents
    parent_id = parent["info"]["run_id"]
    assert parent["info"]["run_name"] == sweep.data["sweep"]
    assert parent["info"]["status"] == "FINISHED"
    assert tags_of(parent)["tuneloop.sweep"] == sweep.data["sweep"]
    params = params_of(parent)
    assert params["objective.metric"] == "eval_loss"
    assert params["objective.mode"] == "min"
    assert params["algorithm.name"] == "grid"
    assert params["parallel"] == "2"
    assert params["max_trials"] == "2"
    assert json.loads(params["parameters.training.learning_rate"]) == {"values": list(RATES)}

    # Its metrics: the best trial and its objective, as the sweep's result says.
    metrics = metrics_of(parent)
    assert metrics["best_trial"] == trials.index(next(t for t in trials if t["job"] == best["job"]))
    assert metrics["eval_loss"] == pytest.approx(best["metric"])
    assert metrics["trials_completed"] == 2

    # Each trial's run is its child, and holds the trial's own parameter and score.
    by_job = {tags_of(r)["tuneloop.job"]: r for r in children}
    assert sorted(by_job) == sorted(t["job"] for t in trials)
    for trial in trials:
        child = by_job[trial["job"]]
        assert tags_of(child)["mlflow.parentRunId"] == parent_id
        assert child["info"]["status"] == "FINISHED"
        assert float(params_of(child)["learning_rate"]) == pytest.approx(
            trial["parameters"]["training.learning_rate"]
        )
        assert metrics_of(child)["eval_loss"] == pytest.approx(trial["metric"])

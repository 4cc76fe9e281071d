"""The promotion gate with the champion in MLflow's registry, end to end: the real broker, the
worker wired by `build_worker` with `TUNELOOP_MLFLOW_TRACKING_URI` set, the local-process
backend running the real trainer on the tiny model, and a real `mlflow server`.

Two drift alarms for one model, each launching one job of a rule with `promote:`:

1. trained properly (30 steps): no champion yet, so it is promoted;
2. barely trained (one step at a learning rate of 1e-9, the base model in effect): it is
   compared with the champion the registry names, and loses.

The oracle is the construction, as in test_promotion_local.py: 30 real steps on the task beat
the base model on held-out rows of the same task. What MLflow holds is read back with the tests'
own HTTP calls (`tests/fixtures/mlflow.py`); the model's name is written out by hand.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devservices.mlflow_server import MlflowEndpoint
from orchestrator.events import CloudEvent
from orchestrator.settings import MlflowSettings
from runtimes.localprocess.backend import LocalProcessBackend
from tests.e2e.harness import COMPLETED
from tests.fixtures.events import DRIFT_DETECTED, THRESHOLD
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

FAILED = "io.tuneloop.finetune.failed.v1"
MODEL = "m1"

RULES = """
runtimes: [local]
rules:
  - name: {rule}
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 1
    launch:
      runtime: local
      base_model: tiny
      dataset: "{dataset}"
      training:
        max_steps: "${{ event.data.steps }}"
        learning_rate: "${{ event.data.lr }}"
        batch_size: 16
        max_seq_length: 64
      promote: {{metric: eval_loss, mode: min, min_delta: 0.0}}
"""


def drift(n: int, *, steps: int, lr: float) -> CloudEvent:
    """A drift alarm for MODEL whose job trains *steps* steps at learning rate *lr*."""
    return CloudEvent(
        id=f"mlflow-promotion-drift-{n}-{uuid.uuid4().hex[:6]}",
        source="/monitors/psi",
        type=DRIFT_DETECTED,
        time=datetime.now(UTC) - timedelta(minutes=10) + timedelta(seconds=n),
        datacontenttype="application/json",
        data={
            "model_id": MODEL,
            "metric": "psi",
            "value": 0.4,
            "threshold": THRESHOLD,
            "steps": steps,
            "lr": lr,
        },
    )


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "promotion-mlflow")


async def test_the_champion_alias_ends_on_the_promoted_version(
    kafka_bootstrap: str,
    topics: dict[str, str],
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
    mlflow_server: MlflowEndpoint,
    mlflow_rest: MlflowRest,
) -> None:
    rule = f"promote-mlflow-{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(rule=rule, dataset=reverse_dataset))
    jobs = tmp_path / "jobs"
    settings = dataclasses.replace(
        worker_settings(kafka_bootstrap, topics),
        mlflow=MlflowSettings(tracking_uri=mlflow_server.tracking_uri),
    )

    async def ended(count: int) -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        finished = [e for e in out if e.type in (COMPLETED, FAILED)]
        return finished if len(finished) >= count else []

    async def end_of_next_job(event: CloudEvent, count: int) -> CloudEvent:
        await send_events(kafka_bootstrap, topics["in"], [event])
        await wait_for(lambda: ended(count), what=f"job {count}'s end", timeout=150)
        return (await ended(count))[count - 1]

    async with LocalProcessBackend(
        jobs,
        poll_interval=0.2,
        trainer_overrides={"cpu_threads": 1, "save_steps": 0},
        tracking_uri=mlflow_server.tracking_uri,
    ) as backend:
        # No champion store is passed: the worker takes MLflow's, as `tuneloop run` does.
        worker = build_test_worker(settings, rules=rules, backend=backend)
        async with running(worker):
            first_drift, second_drift = drift(1, steps=30, lr=3e-3), drift(2, steps=1, lr=1e-9)
            first = await end_of_next_job(first_drift, 1)
            second = await end_of_next_job(second_drift, 2)
            assert worker.champions is not None
            champion = await worker.champions.current(rule, MODEL)
            crash = worker.app._crash_reason

    assert crash is None, crash
    assert first.type == COMPLETED, first.data
    assert second.type == COMPLETED, second.data
    assert first.data["promoted"] is True
    assert second.data["promoted"] is False
    assert second.data["promotion"]["verdict"] == "not-better"

    model = f"tuneloop.{rule}.m1"
    versions = mlflow_rest.versions(model)
    # A version per finished job, in the order they finished ...
    assert [tags_of(v)["tuneloop.job"] for v in versions] == [
        first.data["job"],
        second.data["job"],
    ]
    # ... and the alias on the promoted one only.
    assert mlflow_rest.champion_version(model) == versions[0]["version"]
    assert champion == first.data["adapter_uri"]
    # The second job was launched to beat the champion the registry named.
    config = json.loads((jobs / second.data["job"] / "config.json").read_text())
    assert config["champion_uri"] == first.data["adapter_uri"]
    scores = tags_of(
        mlflow_rest.get("mlflow/model-versions/get", name=model, version=versions[0]["version"])[
            "model_version"
        ]
    )
    assert float(scores["tuneloop.score.eval_loss"]) == pytest.approx(
        first.data["metrics"]["eval_loss"]
    )

    # Each job's run, with its provenance: the rule, the key and the event that caused it.
    for event, drift_event in ((first, first_drift), (second, second_drift)):
        run = mlflow_rest.run_of_job(f"tuneloop/{rule}", event.data["job"])
        assert run is not None
        assert run["info"]["status"] == "FINISHED"
        tags = tags_of(run)
        assert tags["tuneloop.rule"] == rule
        assert tags["tuneloop.key"] == MODEL
        assert json.loads(tags["tuneloop.causing_event_ids"]) == [drift_event.id]
        assert len(mlflow_rest.metric_history(run["info"]["run_id"], "train_loss")) >= 1

"""The wired worker with the local-process backend on the real broker: the whole loop, for real.

Drift events go in on Kafka; the rule counts them and launches; `LocalProcessBackend` runs the
LoRA trainer as a real subprocess on the tiny offline model (`make models` builds it); the
worker publishes one `finetune.completed` CloudEvent with the trainer's metrics, an adapter
that exists on disk, and the ids of the events that caused it. Nothing is faked: the only
difference from `tuneloop run --backend local` is that the worker runs in the test's process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.events import CloudEvent
from runtimes.localprocess.backend import LocalProcessBackend
from tests.e2e.harness import COMPLETED
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions, read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [pytest.mark.kafka, pytest.mark.training, pytest.mark.timeout(240)]

STARTED = "io.tuneloop.finetune.started.v1"
FAILED = "io.tuneloop.finetune.failed.v1"

RULES = """
runtimes: [local]
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
      where: "event.data.value > event.data.threshold"
    key: "event.data.model_id"
    window: 6h
    count: 2
    cooldown: 1h
    concurrency: forbid
    launch:
      runtime: local
      base_model: tiny
      dataset: "file://{dataset}"
      training: {{max_steps: 3, batch_size: 4, max_seq_length: 64}}
"""
"""Two alarms above threshold within 6 h launch a 3-step LoRA fine-tune of the tiny model."""


def drift(n: int, *, value: float) -> CloudEvent:
    return drift_alarm(f"local-drift-{n}", value=value, n=n)


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "local")


async def test_two_alarms_train_a_real_adapter_and_announce_it_once_with_its_causes(
    kafka_bootstrap: str,
    topics: dict[str, str],
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(dataset=reverse_dataset))
    jobs = tmp_path / "jobs"
    events = [
        drift(1, value=0.31),
        drift(2, value=0.05),  # below threshold: not counted
        drift(3, value=0.42),  # the second alarm: launches
        drift(4, value=0.5),  # a fresh window: counted again...
        drift(5, value=0.33),  # ...and its second alarm falls in the cooldown: suppressed
    ]

    async def announced() -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return [e for e in out if e.type in (COMPLETED, FAILED)]

    async def decided_last() -> bool:
        decisions = await read_decisions(kafka_bootstrap, topics["audit"])
        return events[-1].id in {i for d in decisions for i in d["event_ids"]}

    async with LocalProcessBackend(
        jobs, poll_interval=0.2, trainer_overrides={"cpu_threads": 1}
    ) as backend:
        worker = build_test_worker(
            worker_settings(kafka_bootstrap, topics), rules=rules, backend=backend
        )
        async with running(worker):
            await send_events(kafka_bootstrap, topics["in"], events)
            await wait_for(announced, what="the job's end on the output topic", timeout=180)
            await wait_for(decided_last, what="the last alarm's decision", timeout=30)
            crash = worker.app._crash_reason

    assert crash is None, crash
    out = await read_topic(kafka_bootstrap, topics["out"])
    decisions = await read_decisions(kafka_bootstrap, topics["audit"])
    outcomes = [d["outcome"] for d in decisions if d["outcome"] != "ignore"]
    assert outcomes == ["accumulate", "launch", "accumulate", "suppress"], outcomes
    # The alarm below threshold was not counted, and its why-not record says so.
    ignored = [(d["event_ids"], d["reason"]) for d in decisions if d["outcome"] == "ignore"]
    assert ignored == [(["local-drift-2"], "where-false")], ignored
    assert [e.type for e in out].count(STARTED) == 1
    assert [e.type for e in out].count(FAILED) == 0, [e.data for e in out if e.type == FAILED]
    (completed,) = [e for e in out if e.type == COMPLETED]
    data = completed.data
    assert data["backend"] == "local"
    assert data["key"] == "m1"
    assert data["causing_event_ids"] == ["local-drift-1", "local-drift-3"]
    assert completed.extensions["causationid"] == "local-drift-3"
    metrics = data["metrics"]
    assert isinstance(metrics["eval_loss_before"], float)
    assert isinstance(metrics["eval_loss_after"], float)
    assert str(data["adapter_uri"]).startswith("file://")
    adapter = Path(str(data["adapter_uri"]).removeprefix("file://"))
    assert adapter.is_relative_to(jobs), adapter
    assert (adapter / "adapter_model.safetensors").is_file()

"""The promotion gate end to end: the real broker, the wired worker, the local-process backend
running the real trainer on the tiny model, and the real S3 server (s3proxy) holding the
dataset and the adapters.

Three drift alarms for one model, each launching one job of a rule with `promote:`:

1. trained properly (30 steps): no champion yet, so it is promoted;
2. barely trained (one step at a learning rate of 1e-9, the base model in effect): the
   trainer scores it and the champion on the same held-out split, and it loses;
3. trained, then its upload fails halfway (the store "goes away" after the first file, a
   fault hook of the trainer's publish): no manifest, `finetune.failed`, champion unchanged.

The oracle is the construction: 30 real steps on the task beat the base model on held-out
rows of the same task, and a job that failed is never judged.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devservices.object_storage import ObjectStorageEndpoint
from orchestrator.events import CloudEvent
from runtimes.localprocess.backend import LocalProcessBackend
from runtimes.storage import StorageSettings, adapter_exists, parse_location
from runtimes.storage.filesystems import filesystem_for
from runtimes.trainer.publishing import FAULT_STORE_GONE_AFTER
from tests.e2e.harness import COMPLETED
from tests.fixtures.events import DRIFT_DETECTED, THRESHOLD
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions, read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.training,
    pytest.mark.storage,
    pytest.mark.timeout(300),
]

FAILED = "io.tuneloop.finetune.failed.v1"
RULE = "promote-on-drift"
MODEL = "m1"

RULES = """
runtimes: [local]
rules:
  - name: promote-on-drift
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 1
    launch:
      runtime: local
      base_model: tiny
      dataset: "{dataset}"
      output_uri: "{adapters}"
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
        id=f"promotion-drift-{n}",
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
    return worker_topics(new_topic, "promotion")


async def test_the_first_adapter_is_promoted_a_worse_one_declined_a_failed_upload_ignored(
    kafka_bootstrap: str,
    topics: dict[str, str],
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
    object_storage: ObjectStorageEndpoint,
    storage_settings: StorageSettings,
    s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dataset = f"{s3_prefix}/datasets/reverse.jsonl"
    location = parse_location(dataset)
    with filesystem_for(location, storage_settings).open(location.path, "wb") as handle:
        handle.write(reverse_dataset.read_bytes())
    adapters = f"{s3_prefix}/adapters"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(dataset=dataset, adapters=adapters))
    jobs = tmp_path / "jobs"
    store_environment = {
        "TUNELOOP_S3_ENDPOINT_URL": object_storage.endpoint_url,
        "AWS_REGION": object_storage.region,
        "AWS_ACCESS_KEY_ID": object_storage.access_key_id,
        "AWS_SECRET_ACCESS_KEY": object_storage.secret_access_key,
    }

    async def ended(count: int) -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        finished = [e for e in out if e.type in (COMPLETED, FAILED)]
        return finished if len(finished) >= count else []

    async def end_of_next_job(event: CloudEvent, count: int) -> CloudEvent:
        await send_events(kafka_bootstrap, topics["in"], [event])
        await wait_for(lambda: ended(count), what=f"job {count}'s end", timeout=150)
        return (await ended(count))[count - 1]

    def champion_given_to(job: str) -> str | None:
        config = json.loads((jobs / job / "config.json").read_text())
        return config.get("champion_uri")

    async with LocalProcessBackend(
        jobs,
        poll_interval=0.2,
        trainer_overrides={"cpu_threads": 1, "save_steps": 0},
        environment=store_environment,
    ) as backend:
        worker = build_test_worker(
            worker_settings(kafka_bootstrap, topics), rules=rules, backend=backend
        )
        async with running(worker):
            assert worker.champions is not None
            first = await end_of_next_job(drift(1, steps=30, lr=3e-3), 1)
            second = await end_of_next_job(drift(2, steps=1, lr=1e-9), 2)
            monkeypatch.setenv(FAULT_STORE_GONE_AFTER, "1")  # read when the trainer starts
            third = await end_of_next_job(drift(3, steps=2, lr=3e-3), 3)
            champion = await worker.champions.current(RULE, MODEL)
            crash = worker.app._crash_reason

    assert crash is None, crash
    # 1. No champion yet: the first adapter is promoted, and becomes the champion.
    assert first.type == COMPLETED, first.data
    champion_adapter = first.data["adapter_uri"]
    assert adapter_exists(champion_adapter, storage_settings)
    assert first.data["promoted"] is True
    assert first.data["promotion"]["verdict"] == "no-champion"
    assert first.data["promotion"]["champion"] is None
    assert first.data["promotion"]["candidate"] == first.data["metrics"]["eval_loss"]
    assert champion_given_to(first.data["job"]) is None

    # 2. The barely trained candidate was compared with that champion, and lost.
    assert second.type == COMPLETED, second.data
    assert champion_given_to(second.data["job"]) == champion_adapter
    promotion = second.data["promotion"]
    assert second.data["promoted"] is False
    assert promotion["verdict"] == "not-better"
    assert promotion["champion_uri"] == champion_adapter
    assert promotion["champion"] == second.data["metrics"]["champion_eval_loss"]
    assert promotion["candidate"] == second.data["metrics"]["eval_loss"]
    assert promotion["candidate"] > promotion["champion"]
    # The champion scored on job 2's split what it scored on its own (same data, same seed).
    assert promotion["champion"] == pytest.approx(first.data["metrics"]["eval_loss"], rel=1e-5)

    # 3. The upload failed halfway: no manifest, a failed job, nothing judged or moved.
    assert third.type == FAILED, third.data
    assert champion_given_to(third.data["job"]) == champion_adapter
    assert "no manifest was written" in third.data["message"]
    assert not adapter_exists(f"{adapters}/{third.data['job']}", storage_settings)
    assert "promoted" not in third.data
    assert champion == champion_adapter

    judged = [
        record
        for record in await read_decisions(kafka_bootstrap, topics["audit"])
        if record["outcome"] in ("promote", "decline")
    ]
    assert [(r["outcome"], r["reason"], r["job_name"]) for r in judged] == [
        ("promote", "no-champion", first.data["job"]),
        ("decline", "not-better", second.data["job"]),
    ]
    assert judged[1]["event_ids"] == ["promotion-drift-2"]

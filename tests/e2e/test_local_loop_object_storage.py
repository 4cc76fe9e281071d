"""The whole loop with its data and its adapter on object storage: the real broker, the wired
worker, the local-process backend running the real trainer, and the real S3 server (s3proxy).

The rule's dataset and output are `s3://` URIs. The trainer reads the dataset from the server,
publishes the adapter there (every file, then the manifest), and the single
`finetune.completed` event names that published location, whose manifest exists and lists
the adapter. The store's endpoint and keys reach the trainer from the backend's environment,
as a Secret would give them to a pod; the rule file names none of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devservices.object_storage import ObjectStorageEndpoint
from orchestrator.events import CloudEvent
from runtimes.localprocess.backend import LocalProcessBackend
from runtimes.storage import StorageSettings, adapter_exists, parse_location, read_manifest
from runtimes.storage.filesystems import filesystem_for
from tests.e2e.harness import COMPLETED
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.training,
    pytest.mark.storage,
    pytest.mark.timeout(240),
]

FAILED = "io.tuneloop.finetune.failed.v1"

RULES = """
runtimes: [local]
rules:
  - name: drift-retrain-s3
    on:
      type: io.tuneloop.drift.detected.v1
      where: "event.data.value > event.data.threshold"
    key: "event.data.model_id"
    window: 6h
    count: 2
    launch:
      runtime: local
      base_model: tiny
      dataset: "{dataset}"
      output_uri: "{adapters}"
      training: {{max_steps: 3, batch_size: 4, max_seq_length: 64}}
"""


def drift(n: int) -> CloudEvent:
    return drift_alarm(f"s3-drift-{n}", value=0.4, n=n)


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "local-s3")


async def test_an_adapter_trained_from_s3_is_published_there_and_announced_by_its_location(
    kafka_bootstrap: str,
    topics: dict[str, str],
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
    object_storage: ObjectStorageEndpoint,
    storage_settings: StorageSettings,
    s3_prefix: str,
) -> None:
    dataset = f"{s3_prefix}/datasets/reverse.jsonl"
    location = parse_location(dataset)
    with filesystem_for(location, storage_settings).open(location.path, "wb") as handle:
        handle.write(reverse_dataset.read_bytes())
    adapters = f"{s3_prefix}/adapters"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(dataset=dataset, adapters=adapters))
    store_environment = {
        "TUNELOOP_S3_ENDPOINT_URL": object_storage.endpoint_url,
        "AWS_REGION": object_storage.region,
        "AWS_ACCESS_KEY_ID": object_storage.access_key_id,
        "AWS_SECRET_ACCESS_KEY": object_storage.secret_access_key,
    }

    async def announced() -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return [e for e in out if e.type in (COMPLETED, FAILED)]

    async with LocalProcessBackend(
        tmp_path / "jobs",
        poll_interval=0.2,
        trainer_overrides={"cpu_threads": 1},
        environment=store_environment,
    ) as backend:
        worker = build_test_worker(
            worker_settings(kafka_bootstrap, topics), rules=rules, backend=backend
        )
        async with running(worker):
            await send_events(kafka_bootstrap, topics["in"], [drift(1), drift(2)])
            await wait_for(announced, what="the job's end on the output topic", timeout=180)
            crash = worker.app._crash_reason

    assert crash is None, crash
    out = await read_topic(kafka_bootstrap, topics["out"])
    assert [e.type for e in out].count(FAILED) == 0, [e.data for e in out if e.type == FAILED]
    (completed,) = [e for e in out if e.type == COMPLETED]
    adapter_uri = str(completed.data["adapter_uri"])
    assert adapter_uri.startswith(f"{adapters}/"), adapter_uri
    assert adapter_uri.removeprefix(f"{adapters}/").count("/") == 0, "one folder per job"
    assert adapter_exists(adapter_uri, storage_settings)
    listed = {entry.path for entry in read_manifest(adapter_uri, storage_settings).files}
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"} <= listed
    assert "result.json" in listed

"""The promotion gate on Kubernetes: the real broker, the wired worker, the local control plane
(the real Trainer, JobSet and Job controllers, the node agent running the pods: torchrun and
the LoRA trainer on the tiny model) and the real S3 server (s3proxy) holding the dataset and
the adapters. tests/e2e/test_promotion_local.py runs the same three jobs on the local backend.

Three drift alarms for one model, each launching one single-node TrainJob of a rule with
`promote:`; the pods get the store's endpoint and keys from a Secret (`storage_secret`):

1. trained properly (30 steps): no champion yet, so it is promoted;
2. barely trained (one step at a learning rate of 1e-9, the base model in effect): its TrainJob
   carries the champion (`--champion-uri`, annotation `tuneloop.io/champion`), the trainer in
   the pod fetches it from the store and scores both on the same held-out split, reports
   both in `status.trainerStatus`, and the candidate loses;
3. trained, then its upload fails halfway: it runs on a copy of the shipped runtime whose
   trainer container sets the trainer's fault hook `TUNELOOP_FAULT_STORE_GONE_AFTER=1` (the
   store "goes away" after the first file), as an operator's runtime sets a container's env,
   and whose Job does not retry it; no manifest, the Trainer marks the TrainJob Failed, one
   `finetune.failed`, champion unchanged.

The oracle is the construction: 30 real steps on the task beat the base model on held-out
rows of the same task, and a job that failed is never judged. What is read back from the
store is read with pyarrow's S3 client, not tuneloop's storage layer.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devservices.kubernetes import (
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    KubeEndpoint,
)
from devservices.object_storage import ObjectStorageEndpoint
from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from runtimes.kubernetes import manifests
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from runtimes.trainer.publishing import FAULT_STORE_GONE_AFTER
from tests.e2e.harness import COMPLETED
from tests.e2e.kubernetes_storage import ArrowStore, create_storage_secret
from tests.fixtures.events import DRIFT_DETECTED, THRESHOLD
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions, read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.runs_pods,
    pytest.mark.kafka,
    pytest.mark.training,
    pytest.mark.storage,
    pytest.mark.slow,
    pytest.mark.timeout(600),  # includes starting the control plane, Kafka and s3proxy
]

FAILED = "io.tuneloop.finetune.failed.v1"
RULE = "promote-on-drift"
MODEL = "m1"
SHIPPED_RUNTIME = "tuneloop-lora"
SHIPPED_RUNTIMES = Path(__file__).resolve().parents[2] / "deploy" / "runtimes"

RULES = """
runtimes: [{shipped}, {store_gone}]
rules:
  - name: promote-on-drift
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 1
    launch:
      runtime: "${{ event.data.runtime }}"
      base_model: "{model}"
      dataset: "{dataset}"
      output_uri: "{adapters}"
      training:
        max_steps: "${{ event.data.steps }}"
        learning_rate: "${{ event.data.lr }}"
        batch_size: 16
        max_seq_length: 64
      promote: {{metric: eval_loss, mode: min, min_delta: 0.0}}
"""
"""One rule, so all three jobs share one champion (it is per rule and key); the alarm names
the runtime, so only the third job runs on the runtime whose store goes away."""


def drift(n: int, *, steps: int, lr: float, runtime: str) -> CloudEvent:
    """A drift alarm for MODEL whose job trains *steps* steps at *lr* on *runtime*."""
    return CloudEvent(
        id=f"k8s-promotion-drift-{n}-{uuid.uuid4().hex[:6]}",
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
            "runtime": runtime,
        },
    )


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "k8s-promotion")


@pytest.fixture
def api(kube_api: KubeEndpoint) -> Iterator[client.ApiClient]:
    with kube_api.api_client() as api_client:
        yield api_client


@pytest.fixture
def store_gone_runtime(api: client.ApiClient) -> Iterator[str]:
    """A ClusterTrainingRuntime that is the shipped `tuneloop-lora` with the trainer's fault
    hook in its trainer container's env (not the default, so no other test picks it), whose
    Job does not retry a failed trainer (`backoffLimit: 0`): the shipped runtime leaves
    Kubernetes' default of 6 restarts, each of which would train again and fail the same way
    before the Job gives up."""
    (shipped,) = [
        doc
        for doc in yaml.safe_load_all((SHIPPED_RUNTIMES / f"{SHIPPED_RUNTIME}.yaml").read_text())
        if doc["metadata"]["name"] == SHIPPED_RUNTIME
    ]
    runtime = copy.deepcopy(shipped)
    name = f"{SHIPPED_RUNTIME}-store-gone-{uuid.uuid4().hex[:6]}"
    runtime["metadata"] = {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}}
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    job["template"]["spec"]["backoffLimit"] = 0
    (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
    container["env"].append({"name": FAULT_STORE_GONE_AFTER, "value": "1"})
    objects = client.CustomObjectsApi(api)
    objects.create_cluster_custom_object(
        TRAINER_GROUP, TRAINER_API_VERSION, "clustertrainingruntimes", runtime
    )
    yield name
    objects.delete_cluster_custom_object(
        TRAINER_GROUP, TRAINER_API_VERSION, "clustertrainingruntimes", name
    )


def trainer_of(trainjob: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the `tuneloop.io/champion` annotation, the trainer's `--champion-uri` argument)."""
    annotation = trainjob["metadata"].get("annotations", {}).get(manifests.CHAMPION)
    args = list(trainjob["spec"]["trainer"].get("args") or [])
    argument = args[args.index("--champion-uri") + 1] if "--champion-uri" in args else None
    return annotation, argument


def condition(trainjob: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in (trainjob.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == "True":
            return dict(found)
    return None


async def test_trainjobs_promote_the_first_adapter_decline_a_worse_one_and_ignore_a_failed_upload(
    kafka_bootstrap: str,
    topics: dict[str, str],
    kube_api: KubeEndpoint,
    api: client.ApiClient,
    k8s_namespace: str,
    store_gone_runtime: str,
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
    object_storage: ObjectStorageEndpoint,
    s3_prefix: str,
) -> None:
    store = ArrowStore(object_storage)
    dataset = f"{s3_prefix}/datasets/reverse.jsonl"
    store.put(dataset, reverse_dataset.read_bytes())
    adapters = f"{s3_prefix}/adapters"
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        RULES.format(
            shipped=SHIPPED_RUNTIME,
            store_gone=store_gone_runtime,
            model=tiny_model_dir,
            dataset=dataset,
            adapters=adapters,
        )
    )
    secret = create_storage_secret(api, k8s_namespace, object_storage)
    objects = client.CustomObjectsApi(api)
    on_timeout = kube_api.server.log_tail if kube_api.server is not None else None

    def trainjob(name: str) -> dict[str, Any]:
        found: dict[str, Any] = objects.get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_API_VERSION, k8s_namespace, "trainjobs", name
        )
        return found

    async def ended(count: int) -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        finished = [e for e in out if e.type in (COMPLETED, FAILED)]
        return finished if len(finished) >= count else []

    async def end_of_next_job(event: CloudEvent, count: int) -> CloudEvent:
        await send_events(kafka_bootstrap, topics["in"], [event])
        await wait_for(
            lambda: ended(count), what=f"job {count}'s end", timeout=240, on_timeout=on_timeout
        )
        return (await ended(count))[count - 1]

    backend = KubernetesBackend.from_api_client(
        kube_api.api_client(),
        clock=SystemClock(),
        settings=BackendSettings(
            namespace=k8s_namespace,
            watch_timeout=10,
            manifests=manifests.Settings(storage_secret=secret),
        ),
    )
    worker = build_test_worker(
        worker_settings(kafka_bootstrap, topics), rules=rules, backend=backend
    )
    async with running(worker):
        assert worker.champions is not None
        first = await end_of_next_job(drift(1, steps=30, lr=3e-3, runtime=SHIPPED_RUNTIME), 1)
        second = await end_of_next_job(drift(2, steps=1, lr=1e-9, runtime=SHIPPED_RUNTIME), 2)
        third = await end_of_next_job(drift(3, steps=2, lr=3e-3, runtime=store_gone_runtime), 3)
        champion = await worker.champions.current(RULE, MODEL)
        crash = worker.app._crash_reason
    out = await read_topic(kafka_bootstrap, topics["out"])

    assert crash is None, crash
    ends = [e for e in out if e.type in (COMPLETED, FAILED)]
    assert [e.data["job"] for e in ends] == [
        first.data["job"],
        second.data["job"],
        third.data["job"],
    ], "one end per job"

    # 1. No champion yet: the first adapter is promoted, and becomes the champion. Its
    # manifest is in the store, and the event names its folder.
    assert first.type == COMPLETED, first.data
    champion_adapter = str(first.data["adapter_uri"])
    assert champion_adapter.rstrip("/") == f"{adapters}/{first.data['job']}"
    assert store.manifest(champion_adapter) is not None, f"no manifest at {champion_adapter}"
    assert first.data["promoted"] is True
    assert first.data["promotion"]["verdict"] == "no-champion"
    assert first.data["promotion"]["champion"] is None
    assert first.data["promotion"]["candidate"] == first.data["metrics"]["eval_loss"]
    assert trainer_of(trainjob(first.data["job"])) == (None, None)

    # 2. The barely trained candidate's pod fetched that champion from the store, scored
    # both, and the candidate lost.
    assert second.type == COMPLETED, second.data
    second_job = trainjob(second.data["job"])
    assert condition(second_job, "Complete") is not None, second_job["status"]
    assert trainer_of(second_job) == (champion_adapter, champion_adapter)
    promotion = second.data["promotion"]
    assert second.data["promoted"] is False
    assert promotion["verdict"] == "not-better"
    assert promotion["champion_uri"] == champion_adapter
    assert promotion["champion"] == second.data["metrics"]["champion_eval_loss"]
    assert promotion["candidate"] == second.data["metrics"]["eval_loss"]
    assert promotion["candidate"] > promotion["champion"]
    # The champion scored on job 2's split what it scored on its own (same data, same seed).
    assert promotion["champion"] == pytest.approx(first.data["metrics"]["eval_loss"], rel=1e-5)
    # Both scores came through the Trainer's status, the worker reads no file.
    reported = {m["name"] for m in second_job["status"]["trainerStatus"]["metrics"]}
    assert {"eval_loss", "champion_eval_loss"} <= reported, reported

    # 3. The upload failed halfway: no manifest, the Trainer failed the job, nothing judged
    # or moved.
    assert third.type == FAILED, third.data
    third_job = trainjob(third.data["job"])
    failed = condition(third_job, "Failed")
    assert failed is not None, third_job["status"]
    assert third.data["reason"] == failed["reason"]
    assert trainer_of(third_job) == (champion_adapter, champion_adapter)
    assert "no manifest was written" in third.data["message"], third.data["message"]
    # Halfway: the store went away after the first file, so that one is all there is.
    left = store.files(f"{adapters}/{third.data['job']}")
    assert len(left) == 1, left
    assert "manifest.json" not in left
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

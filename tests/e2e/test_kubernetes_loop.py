"""The whole loop on the local control plane: the real Trainer, JobSet and Job controllers run
tuneloop's TrainJobs, and the node agent runs their pods (torchrun, the LoRA trainer).

Drift events go in on the real broker; the wired worker's rule launches a TrainJob on the
shipped `tuneloop-lora` runtime (deploy/runtimes); the Trainer creates the JobSet, the JobSet
controller the Jobs, the Job controller the pods; the trainer pods report to the Trainer's
status server and the Trainer marks the TrainJob `Complete` or `Failed`. Nothing in this file
writes a TrainJob's status. The worker mounts no volume: the completion's metrics come from
`status.trainerStatus`, and a failure's log tail from the pod's `terminated.message`.

The trained job's dataset and adapter are on the real S3 server (s3proxy): the rule names
`s3://` URIs, the pods get the store's endpoint and keys from a Secret
(`storage_secret`, as `TUNELOOP_KUBERNETES_STORAGE_SECRET` sets it), rank 0 publishes the
adapter there, manifest last, and the rule's `promote: {}` promotes it (there is no champion
yet). What the test reads as the cluster's user would: the TrainJob's status, the pods, and
the store, through pyarrow's S3 client rather than tuneloop's storage layer.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from faust.contrib.asgi import faust_app_running
from kubernetes import client

from devservices.control_plane import LocalControlPlane
from devservices.kubernetes import TRAINER_API_VERSION, TRAINER_GROUP, new_api_client
from devservices.object_storage import ObjectStorageEndpoint
from handlers.app import build_worker
from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from orchestrator.settings import KafkaSettings, Settings
from runtimes.kubernetes import manifests
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from tests.e2e.harness import COMPLETED, read_topic, send_events, wait_for
from tests.e2e.kubernetes_storage import ArrowStore, create_storage_secret

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.runs_pods,
    pytest.mark.kafka,
    pytest.mark.training,
    pytest.mark.storage,
    pytest.mark.slow,
    pytest.mark.timeout(600),  # includes starting the control plane and Kafka on a busy machine
]

FAILED = "io.tuneloop.finetune.failed.v1"
WORKSPACE_OUTPUT = "/workspace/output"
"""Where a trainer whose output is on object storage writes before it publishes
(`runtimes.kubernetes.manifests.WORKSPACE_OUTPUT`, restated: `--output` names the job there)."""

RULES = """
runtimes: [tuneloop-lora]
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    concurrency: replace
    launch:
      runtime: tuneloop-lora
      base_model: "{model}"
      dataset: "${{ event.data.uri }}"
      output_uri: "{adapters}"
      training: {{max_steps: "${{ event.data.steps }}", batch_size: 4, max_seq_length: 64}}
      resources: {{nodes: "${{ event.data.nodes }}"}}
      promote: {{}}
"""
"""Every alarm launches at once; a second alarm for a model whose job runs replaces it. The
first adapter of a key is promoted (`promote: {}`: no champion yet)."""


def drift(n: int, *, model: str, uri: str, steps: int, nodes: int) -> CloudEvent:
    return CloudEvent(
        id=f"k8s-drift-{n}-{uuid.uuid4().hex[:6]}",
        source="/monitors/psi",
        type="io.tuneloop.drift.detected.v1",
        time=datetime.now(UTC),
        datacontenttype="application/json",
        data={
            "model_id": model,
            "metric": "psi",
            "value": 0.5,
            "threshold": 0.2,
            "uri": uri,
            "steps": steps,
            "nodes": nodes,
        },
    )


@pytest.fixture
def api(control_plane: LocalControlPlane) -> Iterator[client.ApiClient]:
    with new_api_client(control_plane.kubeconfig) as api_client:
        yield api_client


@pytest.fixture
def namespace(api: client.ApiClient) -> str:
    """A fresh namespace whose default ServiceAccount exists (pods need it)."""
    core = client.CoreV1Api(api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    for _ in range(120):
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except client.ApiException:
            time.sleep(0.25)
    raise AssertionError(f"no default ServiceAccount in {name}")


@pytest.fixture
def topics(new_topic: Any) -> dict[str, str]:
    return {name: new_topic(f"k8s-{name}") for name in ("in", "out", "audit", "dlq")}


class Loop:
    """The worker under test and what the test reads back."""

    def __init__(self, api: client.ApiClient, plane: LocalControlPlane, namespace: str) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.plane = plane
        self.namespace = namespace

    def trainjobs(self) -> dict[str, dict[str, Any]]:
        listing = self.objects.list_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_API_VERSION, self.namespace, "trainjobs"
        )
        return {item["metadata"]["name"]: item for item in listing["items"]}

    def trainjob_of(self, key: str) -> dict[str, Any] | None:
        for obj in self.trainjobs().values():
            if obj["metadata"].get("annotations", {}).get("tuneloop.io/key") == key:
                return obj
        return None

    def pods_of(self, job: str) -> list[client.V1Pod]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={job}"
            ).items
        )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == "True":
            return dict(found)
    return None


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line mentions *text* (a job's name is in its trainer's
    `--output` argument, `/workspace/output/<job>`)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(proc.name))
    return found


async def test_trainjobs_run_on_the_real_controllers_and_each_ends_in_exactly_one_event(
    kafka_bootstrap: str,
    topics: dict[str, str],
    control_plane: LocalControlPlane,
    api: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    reverse_dataset: Path,
    object_storage: ObjectStorageEndpoint,
    s3_prefix: str,
) -> None:
    store = ArrowStore(object_storage)
    good = f"{s3_prefix}/datasets/reverse.jsonl"
    store.put(good, reverse_dataset.read_bytes())
    adapters = f"{s3_prefix}/adapters"
    # A long path on purpose: the kubelet keeps only a failed container's last 2 KiB of log,
    # and torchrun's own traceback after the trainer's line takes most of it (CI on 7fbf944
    # cut the trainer's line to "ain: dataset not found"). The reason must come whole from
    # the container's termination-message file, where the trainer writes it.
    missing = "file:///nonexistent/" + "deep/" * 200 + "no-such-dataset.jsonl"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(model=tiny_model_dir, adapters=adapters))
    loop = Loop(api, control_plane, namespace)
    secret = create_storage_secret(api, namespace, object_storage)
    settings = Settings(
        kafka=KafkaSettings(
            bootstrap=kafka_bootstrap,
            topics_in=(topics["in"],),
            topic_out=topics["out"],
            topic_audit=topics["audit"],
            topic_dlq=topics["dlq"],
            group_id=f"k8s-{uuid.uuid4().hex[:8]}",
            internal_partitions=2,
        )
    )
    backend = KubernetesBackend.from_api_client(
        new_api_client(control_plane.kubeconfig),
        clock=SystemClock(),
        settings=BackendSettings(
            namespace=namespace,
            watch_timeout=10,
            manifests=manifests.Settings(storage_secret=secret),
        ),
    )
    trained = drift(1, model="m-trained", uri=good, steps=3, nodes=2)
    broken = drift(2, model="m-broken", uri=missing, steps=3, nodes=1)
    replaced = drift(3, model="m-replaced", uri=good, steps=100_000, nodes=1)
    replacing = drift(4, model="m-replaced", uri=missing, steps=3, nodes=1)

    async def ends() -> dict[str, list[CloudEvent]]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        by_job: dict[str, list[CloudEvent]] = {}
        for event in out:
            if event.type in (COMPLETED, FAILED):
                by_job.setdefault(str(event.data["job"]), []).append(event)
        return by_job

    def running(key: str) -> bool:
        obj = loop.trainjob_of(key)
        if obj is None:
            return False
        pods = loop.pods_of(obj["metadata"]["name"])
        return bool(pods) and all(p.status.phase == "Running" for p in pods)

    worker = build_worker(
        settings,
        rule_paths=[rules],
        backend=backend,
        clock=SystemClock(),
        tick_interval=0.2,
        broker_commit_interval=0.2,
        topic_replication_factor=1,
    )
    async with faust_app_running(worker.app, stop_timeout=30):
        # One job at a time, so that each end is known to be that job's (the node agent gives
        # each TrainJob a torchrun master port of its own: two at once would not collide).
        for n, event in enumerate((trained, broken), start=1):
            await send_events(kafka_bootstrap, topics["in"], [event])

            async def ended(count: int = n) -> bool:
                return len(await ends()) == count

            await wait_for(
                ended,
                what=f"the end of {event.data['model_id']}",
                timeout=150,
                on_timeout=control_plane.log_tail,
            )
        await send_events(kafka_bootstrap, topics["in"], [replaced])
        await wait_for(
            lambda: running("m-replaced"),
            what="the job to be replaced running its pod",
            timeout=120,
            on_timeout=control_plane.log_tail,
        )
        old = loop.trainjob_of("m-replaced")
        assert old is not None
        old_name = old["metadata"]["name"]
        assert processes_naming(f"{WORKSPACE_OUTPUT}/{old_name}"), "its trainer runs"
        await send_events(kafka_bootstrap, topics["in"], [replacing])

        async def all_ended() -> bool:
            return len(await ends()) == 4

        await wait_for(
            all_ended, what="four jobs' ends", timeout=300, on_timeout=control_plane.log_tail
        )
        await wait_for(
            lambda: (
                not loop.pods_of(old_name)
                and not processes_naming(f"{WORKSPACE_OUTPUT}/{old_name}")
            ),
            what="the replaced job's pods and processes to be gone",
            timeout=60,
        )
        await asyncio.sleep(3)  # a duplicate would come right after the first
        crash = worker.app._crash_reason

    assert crash is None, crash
    by_job = await ends()
    assert all(len(events) == 1 for events in by_job.values()), {
        job: [e.type for e in events] for job, events in by_job.items()
    }
    by_key = {str(events[0].data["key"]): events[0] for events in by_job.values()}
    jobs = loop.trainjobs()

    # (a) Two nodes trained one adapter from the store's dataset; the Trainer said Complete;
    # metrics from trainerStatus.
    completed = by_key["m-trained"]
    assert completed.type == COMPLETED, completed.data
    trainjob = jobs[str(completed.data["job"])]
    assert condition(trainjob, "Complete") is not None, trainjob["status"]
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    assert len(loop.pods_of(trainjob["metadata"]["name"])) == 2
    reported = {
        m["name"]: m["value"]
        for m in trainjob["status"]["trainerStatus"]["metrics"]
        if not m["name"].startswith("adapter_uri")
    }
    assert reported, trainjob["status"]["trainerStatus"]
    metrics = completed.data["metrics"]
    # Every metric came from there (the worker reads no file), as numbers.
    assert metrics == {name: pytest.approx(float(value)) for name, value in reported.items()}
    # Rank 0 published it to <output_uri>/<job>/, manifest last; the event names that folder.
    adapter_uri = str(completed.data["adapter_uri"])
    assert adapter_uri.rstrip("/") == f"{adapters}/{completed.data['job']}", adapter_uri
    manifest = store.manifest(adapter_uri)
    assert manifest is not None, f"no manifest at {adapter_uri}"
    listed = {entry["path"]: entry for entry in manifest["files"]}
    weights = listed["adapter/adapter_model.safetensors"]
    stored = store.get(f"{adapter_uri.rstrip('/')}/adapter/adapter_model.safetensors")
    assert stored is not None
    assert (len(stored), hashlib.sha256(stored).hexdigest()) == (
        weights["size"],
        weights["sha256"],
    )
    # The first adapter of its key: no champion to beat, so it is promoted.
    assert completed.data["promoted"] is True
    assert completed.data["promotion"]["verdict"] == "no-champion"
    # Rank 0 worked in its container's own /workspace (a directory of its pod's), not on this
    # machine's, which no two pods share.
    job = str(completed.data["job"])
    pods = loop.plane.pods_dir / "pods"
    written = list(pods.glob(f"{namespace}_{job}-*/rootfs/*/output/{job}/result.json"))
    assert len(written) == 1, written
    assert not (Path(WORKSPACE_OUTPUT) / job).exists()

    # (b) A bad dataset: the Trainer said Failed; the event has the reason and the trainer's words.
    broken_end = by_key["m-broken"]
    assert broken_end.type == FAILED
    failed = condition(jobs[str(broken_end.data["job"])], "Failed")
    assert failed is not None
    assert broken_end.data["reason"] == failed["reason"]
    assert failed["message"] in broken_end.data["message"]
    # The trainer's own words, from its termination-message file by the kubelet (here the
    # node agent), whatever torchrun printed after them.
    told = str(broken_end.data["message"])
    assert "exited with code" in told, told
    assert "tuneloop-train: dataset not found" in told, told
    assert "deep/" * 200 + "no-such-dataset.jsonl" in told, told

    # (c) Replaced: its TrainJob is gone and its one event says it was cancelled.
    assert old_name not in jobs
    replaced_end = by_job[old_name][0]
    assert (replaced_end.type, replaced_end.data["reason"]) == (FAILED, "Cancelled")
    replacing_end = [
        e for job, (e,) in by_job.items() if e.data["key"] == "m-replaced" and job != old_name
    ]
    assert [e.type for e in replacing_end] == [FAILED]

"""A hyperparameter sweep on the local control plane: the real broker, the wired worker, the
real Trainer, JobSet and Job controllers, the node agent running each trial's pod (torchrun
and the LoRA trainer on the tiny model), and the real S3 server holding the dataset and the
adapters. tests/e2e/test_sweep_local.py runs the same sweep on the local backend.

One drift alarm fires a rule whose launch has a `sweep:` block: a grid of four learning rates,
two trials at a time, the median rule from step 40 on once two trials completed (a
trial's loss is one batch's, so earlier steps would compare noise). Every trial
is a single-node TrainJob. The trainer in each pod reports its training loss and step to the
Trainer's status server every few seconds, the Trainer writes them to the TrainJob's
`status.trainerStatus`, and that is the only way the worker learns of them (it mounts no
volume and reads no log). The grid's order makes the story known from the construction:

- trials 0 and 1 (1e-3, 2e-3) run first and complete: they are the median rule's reference;
- trial 2 (3e-3) learns at least as fast as they do, and completes;
- trial 3 (1e-9) does not train at all: its loss stays at the untrained model's, behind the
  median at a report past step 40, so its TrainJob is deleted before its steps are done.

The test watches the TrainJobs itself (a watch of its own, not the backend's): the step the
prune names is one the Trainer wrote into the pruned trial's `trainerStatus` before the worker
deleted it, and the loss it names is the best of the losses written there up to that step.
No champion exists yet, so the best trial's adapter is promoted: one `finetune.completed` for
it, and one `sweep.completed` for all four.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from devservices.kubernetes import TRAINER_API_VERSION, TRAINER_GROUP, KubeEndpoint
from devservices.object_storage import ObjectStorageEndpoint
from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from orchestrator.vocabulary.registry import SchemaRegistry
from runtimes.kubernetes import manifests
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from tests.e2e.harness import COMPLETED
from tests.e2e.kubernetes_storage import ArrowStore, create_storage_secret
from tests.fixtures.events import drift_alarm
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
    pytest.mark.timeout(900),  # includes starting the control plane, Kafka and s3proxy
]

SWEEP_COMPLETED = "io.tuneloop.finetune.sweep.completed.v1"
STEPS = 150
"""Enough steps that a trial reports several times (the trainer reports to the Trainer at
most every 5 s) even when the machine is idle; a loaded one takes minutes per trial."""
RATES = (1e-3, 2e-3, 3e-3, 1e-9)

RULES = """
runtimes: [tuneloop-lora]
rules:
  - name: sweep-on-drift
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    launch:
      runtime: tuneloop-lora
      base_model: "{model}"
      dataset: "{dataset}"
      output_uri: "{adapters}"
      training: {{max_steps: {steps}, batch_size: 16, max_seq_length: 64}}
      promote: {{metric: eval_loss}}
      sweep:
        objective: {{metric: eval_loss, mode: min}}
        algorithm: grid
        parameters:
          training.learning_rate: {{values: [{rates}]}}
        parallel: 2
        early_stopping: {{median: {{min_trials: 2, start_step: 40}}}}
"""


class TrainerStatuses:
    """Every `status.trainerStatus` each TrainJob of a namespace had, as a watch of the test's
    own saw it (the worker deletes a pruned trial's TrainJob, so it cannot be read after)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._objects = client.CustomObjectsApi(api)
        self._namespace = namespace
        self._watch = watch.Watch()
        self._seen: dict[str, list[dict[str, str]]] = {}
        self._deleted: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="trainer-statuses", daemon=True)
        self._stopping = threading.Event()

    def __enter__(self) -> TrainerStatuses:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self._watch.stop()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        version = ""
        while not self._stopping.is_set():
            try:
                version = self._follow(version)
            except Exception:  # a watch the server ended early: watch again
                self._stopping.wait(0.2)

    def _follow(self, version: str) -> str:
        """Record the events after *version* until the watch ends; the last version seen."""
        stream = self._watch.stream(
            self._objects.list_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_API_VERSION,
            self._namespace,
            "trainjobs",
            resource_version=version,
            timeout_seconds=5,
        )
        for event in stream:
            obj = event["object"]
            version = obj["metadata"]["resourceVersion"]
            name = obj["metadata"]["name"]
            metrics = ((obj.get("status") or {}).get("trainerStatus") or {}).get("metrics")
            with self._lock:
                if event["type"] == "DELETED":
                    self._deleted.add(name)
                if metrics:
                    values = {m["name"]: m["value"] for m in metrics}
                    reports = self._seen.setdefault(name, [])
                    if not reports or reports[-1] != values:
                        reports.append(values)
        return version

    def reports(self, job: str) -> list[dict[str, str]]:
        with self._lock:
            return list(self._seen.get(job, []))

    def deleted(self, job: str) -> bool:
        with self._lock:
            return job in self._deleted


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "k8s-sweep")


@pytest.fixture
def api(kube_api: KubeEndpoint) -> Iterator[client.ApiClient]:
    with kube_api.api_client() as api_client:
        yield api_client


def condition(trainjob: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in (trainjob.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == "True":
            return dict(found)
    return None


async def test_a_sweep_of_trainjobs_prunes_on_trainer_status_and_promotes_the_best(
    kafka_bootstrap: str,
    topics: dict[str, str],
    kube_api: KubeEndpoint,
    api: client.ApiClient,
    k8s_namespace: str,
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
    rates = ", ".join(f"{rate:.1e}" for rate in RATES)
    rules.write_text(
        RULES.format(
            model=tiny_model_dir, dataset=dataset, adapters=adapters, steps=STEPS, rates=rates
        )
    )
    secret = create_storage_secret(api, k8s_namespace, object_storage)
    objects = client.CustomObjectsApi(api)
    on_timeout = kube_api.server.log_tail if kube_api.server is not None else None

    def trainjobs() -> dict[str, dict[str, Any]]:
        listing = objects.list_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_API_VERSION, k8s_namespace, "trainjobs"
        )
        return {item["metadata"]["name"]: item for item in listing["items"]}

    async def result() -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return [e for e in out if e.type == SWEEP_COMPLETED]

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
    with TrainerStatuses(api, k8s_namespace) as statuses:
        async with running(worker):
            await send_events(kafka_bootstrap, topics["in"], [drift_alarm("k8s-sweep-drift-1")])
            await wait_for(result, what="the sweep's result", timeout=780, on_timeout=on_timeout)
            crash = worker.app._crash_reason
        jobs = trainjobs()

    assert crash is None, crash
    out = await read_topic(kafka_bootstrap, topics["out"])
    (sweep,) = [e for e in out if e.type == SWEEP_COMPLETED]
    SchemaRegistry.builtin().validate(sweep)
    data = sweep.data
    trials = data["trials"]
    assert [t["parameters"]["training.learning_rate"] for t in trials] == list(RATES)
    states = [t["state"] for t in trials]
    # Trials 0 and 1 end before two trials have completed, so nothing can judge them; the
    # 1e-9 trial does not learn and must be pruned. Trial 2 learns, but the rule judges it on
    # single-batch losses against the two before it: pruning it too is the rule working, not
    # a fault, so either state is accepted for it.
    story_of_trials = [
        (t["state"], t.get("reason"), statuses.reports(t["job"])[-3:]) for t in trials
    ]
    assert states[:2] == ["completed", "completed"], story_of_trials
    assert states[3] == "pruned", story_of_trials
    assert states[2] in ("completed", "pruned"), story_of_trials
    finished = [t for t in trials if t["state"] == "completed"]
    assert (data["status"], data["reason"]) == ("succeeded", "max-trials")

    # The completed trials are Complete TrainJobs whose final metrics came from trainerStatus.
    for trial in finished:
        trainjob = jobs[trial["job"]]
        assert condition(trainjob, "Complete") is not None, trainjob.get("status")
        assert trainjob["spec"]["trainer"]["numNodes"] == 1
        reported = {m["name"]: m["value"] for m in trainjob["status"]["trainerStatus"]["metrics"]}
        assert float(reported["eval_loss"]) == pytest.approx(trial["metric"])

    # The trial that does not learn was pruned on a report the Trainer wrote into its
    # TrainJob's status (the step and loss the reason names), then its TrainJob was deleted
    # before it finished.
    pruned = trials[3]
    match = re.search(
        r"best train_loss (\S+) by step (\d+) is worse than the median", pruned["reason"]
    )
    assert match is not None, pruned["reason"]
    loss, step = float(match.group(1)), int(match.group(2))
    reports = statuses.reports(pruned["job"])
    seen = [
        (int(float(r["step"])), float(r["train_loss"]))
        for r in reports
        if "step" in r and "train_loss" in r
    ]
    assert step in [s for s, _ in seen], (step, seen)
    # The median rule compares the best loss reported up to that step.
    assert min(value for s, value in seen if s <= step) == pytest.approx(loss, rel=1e-5), seen
    assert step < STEPS
    assert pruned["job"] not in jobs
    assert statuses.deleted(pruned["job"])
    assert all(int(float(r.get("step", "0"))) < STEPS for r in reports), "it never finished"

    # The best completed trial is promoted, and it alone is announced.
    best = data["best"]
    assert best["metric"] == min(t["metric"] for t in finished)
    assert data["promoted"] is True
    (completed,) = [e for e in out if e.type == COMPLETED]
    assert completed.data["job"] == best["job"]
    assert completed.data["promoted"] is True
    adapter_uri = str(completed.data["adapter_uri"])
    assert adapter_uri == best["adapter_uri"]
    assert adapter_uri.rstrip("/") == f"{adapters}/{best['job']}"
    assert store.manifest(adapter_uri) is not None, f"no manifest at {adapter_uri}"
    assert {e.type for e in out} == {SWEEP_COMPLETED, COMPLETED}, "no finetune.* per trial"

    decisions = await read_decisions(kafka_bootstrap, topics["audit"])
    story = [(d["outcome"], d["reason"]) for d in decisions if d["outcome"] != "ignore"]
    assert story.count(("launch", "trial")) == 4
    assert story.count(("cancel", "pruned")) == states.count("pruned")
    assert story[-2:] == [("conclude", "max-trials"), ("promote", "no-champion")]

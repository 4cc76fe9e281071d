"""docs/installation.md's Helm quick start, run for real on the local control plane and Kafka.

The commands are the page's own, read from its "Quick start" block and run in order:

- `KAFKA_BOOTSTRAP=...`: the test sets `KAFKA_BOOTSTRAP` to the local broker instead;
- `helm install ...`: as written (helm from `make services`), with `--set web.port=<free>`
  added, since the node agent's pods share this machine's network and 8080 may be taken;
- `tuneloop emit ...`, `tuneloop tail ...`: as written, with the project's `tuneloop`;
- `kubectl apply -f deploy/runtimes/` and `kubectl -n tuneloop wait trainjobs ...`: kubectl
  is not installed here, so the test does both through the API; the page's lines are held
  equal to `KUBECTL_LINES`, so that what it says and what the test does cannot drift apart.

What runs is the chart's: the worker is the Deployment's pod (the node agent maps the
orchestrator image to this project), with the chart's ServiceAccount (in-cluster config),
rules ConfigMap and adapters claim; its TrainJob runs the trainer image's torchrun on the
example dataset the image carries; the Trainer marks it Complete; one finetune.completed
comes out. Nothing here writes a status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devservices.control_plane import LocalControlPlane, shipped_runtime_files
from devservices.kubernetes import (
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    cache_root,
    create_cluster_runtimes,
    free_loopback_port,
    new_api_client,
)
from devservices.node_agent import ORCHESTRATOR_IMAGE_REPOSITORY
from orchestrator.events import CloudEvent
from tests.e2e.test_getting_started import bash_blocks
from tests.fixtures.topics import read_topic

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.kafka,
    pytest.mark.runs_pods,
    pytest.mark.training,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "installation.md"
NAMESPACE = "tuneloop"
"""The page's `--namespace tuneloop`: the release's, and the TrainJobs'."""
ADAPTERS_CLAIM = "tuneloop-adapters"
ADAPTERS_MOUNT = "/var/lib/tuneloop/adapters"
OUT_TOPIC = "tuneloop.finetune"
COMPLETED = "io.tuneloop.finetune.completed.v1"
FAILED = "io.tuneloop.finetune.failed.v1"
KUBECTL_LINES = (
    "kubectl apply -f deploy/runtimes/",
    "kubectl -n tuneloop wait trainjobs --all --for=condition=Complete --timeout=15m",
)


def quick_start_commands() -> list[str]:
    """The page's Quick start block, one command per item (continuation lines joined)."""
    markdown = PAGE.read_text(encoding="utf-8")
    section = markdown[markdown.index("### Quick start\n") :]
    block = bash_blocks(section)[0]
    commands: list[str] = []
    pending = ""
    for line in block.splitlines():
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            commands.append(re.sub(r" {2,}", " ", command))
    return commands


def find_helm() -> Path | None:
    for candidate in (
        os.environ.get("TUNELOOP_HELM"),
        shutil.which("helm"),
        cache_root() / "bin" / "helm",
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == "True":
            return dict(found)
    return None


class Cluster:
    """What the test reads back, as the cluster's user would (through the API), plus the
    node agent's files (the claim's directory, the worker's log)."""

    def __init__(self, api: client.ApiClient, plane: LocalControlPlane) -> None:
        self.core = client.CoreV1Api(api)
        self.objects = client.CustomObjectsApi(api)
        self.plane = plane

    def trainjobs(self) -> list[dict[str, Any]]:
        listing: Any = self.objects.list_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_API_VERSION, NAMESPACE, "trainjobs"
        )
        return list(listing["items"])

    def worker_pods(self) -> list[Any]:
        return list(
            self.core.list_namespaced_pod(
                NAMESPACE, label_selector="app.kubernetes.io/name=tuneloop"
            ).items
        )

    def namespace_exists(self) -> bool:
        try:
            self.core.read_namespace(NAMESPACE)
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def logs(self) -> str:
        """The end of every container log in the namespace, and the control plane's."""
        parts = []
        for log in sorted((self.plane.pods_dir / "pods").glob(f"{NAMESPACE}_*/logs/*.log")):
            lines = log.read_text(errors="replace").splitlines()
            parts.append(f"--- {log} (last 40 lines)\n" + "\n".join(lines[-40:]))
        return "\n".join([*parts, self.plane.log_tail()])


def eventually(probe: Any, *, timeout: float, what: str, cluster: Cluster) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(1.0)
    raise AssertionError(f"not within {timeout:.0f} s: {what}\n{cluster.logs()}")


@pytest.fixture
def cluster(control_plane: LocalControlPlane) -> Iterator[Cluster]:
    with new_api_client(control_plane.kubeconfig) as api:
        yield Cluster(api, control_plane)


def test_the_documented_helm_quick_start_trains_once_and_announces_it(
    control_plane: LocalControlPlane,
    cluster: Cluster,
    kafka_bootstrap: str,
    tiny_model_dir: Path,  # the image's `tiny` model, built into the cache the pods share
    tmp_path: Path,
) -> None:
    helm = find_helm()
    if helm is None:
        message = "helm is not built: run `make services` (python -m devservices prepare helm)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    assert not cluster.namespace_exists(), f"namespace {NAMESPACE} is left from another run"
    commands = quick_start_commands()
    assert commands[0].startswith("KAFKA_BOOTSTRAP="), commands[0]
    assert [c for c in commands if c.startswith("kubectl ")] == list(KUBECTL_LINES)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
    env |= {
        # The page's reader has the project's environment active, and helm on PATH.
        "PATH": f"{Path(sys.executable).parent}:{helm.parent}:{env.get('PATH', '')}",
        "KUBECONFIG": str(control_plane.kubeconfig),
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "HELM_CACHE_HOME": str(tmp_path / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm" / "config"),
        "HELM_DATA_HOME": str(tmp_path / "helm" / "data"),
    }
    outputs: dict[str, str] = {}
    finished: dict[str, Any] = {}

    def shell(command: str) -> str:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}\n{cluster.logs()}"
        return done.stdout

    def trainjob_complete() -> dict[str, Any] | None:
        jobs = cluster.trainjobs()
        failed = [job for job in jobs if condition(job, "Failed")]
        assert not failed, f"{failed}\n{cluster.logs()}"
        done = [job for job in jobs if condition(job, "Complete")]
        return done[0] if done and len(done) == len(jobs) else None

    try:
        for command in commands[1:]:
            if command == KUBECTL_LINES[0]:
                create_cluster_runtimes(
                    control_plane.kubeconfig, shipped_runtime_files(), timeout=60
                )
            elif command == KUBECTL_LINES[1]:
                finished = eventually(
                    trainjob_complete,
                    timeout=600,
                    what="the TrainJob marked Complete by the Trainer",
                    cluster=cluster,
                )
            elif command.startswith("helm install "):
                shell(f"{command} --set web.port={free_loopback_port()}")
            else:
                outputs[command.split()[1]] = shell(command)
        # Every completion and failure on the topic, a moment after the first completion.
        time.sleep(3)
        ends = [e for e in read_topic_now(kafka_bootstrap) if e.type in (COMPLETED, FAILED)]
        workers = cluster.worker_pods()
    finally:
        subprocess.run(
            [str(helm), "uninstall", "tuneloop", "--namespace", NAMESPACE],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        with contextlib.suppress(client.ApiException):
            cluster.core.delete_namespace(NAMESPACE, propagation_policy="Background")

    # The worker was the chart's Deployment, run as a pod from the orchestrator image.
    images = [container.image for pod in workers for container in pod.spec.containers]
    assert [image.split(":")[0] for image in images] == [ORCHESTRATOR_IMAGE_REPOSITORY]
    # One TrainJob, on the shipped runtime, marked Complete by the Trainer with the metrics
    # its pod reported to the status server.
    trainjob = finished
    name = trainjob["metadata"]["name"]
    assert trainjob["spec"]["runtimeRef"]["name"] == "tuneloop-lora"
    assert condition(trainjob, "Complete") is not None
    reported = {
        m["name"]: float(m["value"])
        for m in trainjob["status"]["trainerStatus"]["metrics"]
        if not m["name"].startswith("adapter_uri")
    }
    assert "train_loss" in reported, trainjob["status"]["trainerStatus"]
    # Exactly one end for it: a completion, which `tuneloop tail --until` printed too.
    assert [(e.type, e.data["job"]) for e in ends] == [(COMPLETED, name)]
    (completed,) = ends
    # `tail --until` printed the job's events up to its completion (its start before).
    tailed = [json.loads(line) for line in outputs["tail"].splitlines() if line.strip()]
    finetunes = [e for e in tailed if e["type"].startswith("io.tuneloop.finetune.")]
    assert {e["data"]["job"] for e in finetunes} == {name}
    assert (tailed[-1]["type"], tailed[-1]["id"]) == (COMPLETED, completed.id)
    assert completed.data["metrics"] == pytest.approx(reported)
    # The adapter is on the chart's claim (the node agent keeps a claim as a directory).
    adapter_uri = str(completed.data["adapter_uri"])
    assert adapter_uri.startswith(f"file://{ADAPTERS_MOUNT}/{name}"), adapter_uri
    on_claim = (
        control_plane.pods_dir
        / "claims"
        / NAMESPACE
        / ADAPTERS_CLAIM
        / adapter_uri.removeprefix(f"file://{ADAPTERS_MOUNT}/")
    )
    assert list(on_claim.rglob("adapter_model.safetensors")), sorted(on_claim.rglob("*"))


def read_topic_now(bootstrap: str) -> list[CloudEvent]:
    """Every CloudEvent on the chart's output topic, read to its end offsets."""
    return asyncio.run(read_topic(bootstrap, OUT_TOPIC))

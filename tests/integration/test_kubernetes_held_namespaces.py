"""The node agent holds the pods of namespaces labelled `tuneloop.io/node-agent=hold`.

Most Kubernetes suites need what the controllers make of a TrainJob (its JobSet, Jobs and
pods, the status the Trainer writes) but must not start a trainer for each one; `k8s_namespace`
gives them a held namespace. A test marked `runs_pods` gets one whose pods run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client

from devservices.kubernetes import TRAINER_API_VERSION, TRAINER_GROUP, KubeEndpoint
from devservices.node_agent import (
    HOLD_LABEL,
    HOLD_VALUE,
    TUNELOOP_IMAGE_REPOSITORY,
    ImageEnvironment,
    NodeAgent,
)

pytestmark = pytest.mark.kubernetes

T = TypeVar("T")


def eventually(probe: Callable[[], T | None], *, what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


@pytest.fixture
def api(kube_api: KubeEndpoint) -> Iterator[client.ApiClient]:
    if kube_api.server is None:
        pytest.skip("only the local node agent honours the hold label")
    with kube_api.api_client() as api_client:
        yield api_client


def trainjob(name: str) -> dict[str, Any]:
    """A TrainJob on tuneloop's default runtime, whose image the node agent would run."""
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_API_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "tuneloop-lora"},
            "trainer": {"args": ["--help"]},
        },
    }


def python_pass_pod(name: str) -> dict[str, Any]:
    """A pod of one container that runs `python -c pass` in tuneloop's image."""
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": f"{TUNELOOP_IMAGE_REPOSITORY}:0.1.0",
                    "command": ["python", "-c", "pass"],
                }
            ],
        },
    }


def test_a_held_namespaces_trainjob_gets_its_jobset_jobs_and_pods_but_no_pod_runs(
    api: client.ApiClient, k8s_namespace: str
) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    objects = client.CustomObjectsApi(api)
    labels = core.read_namespace(k8s_namespace).metadata.labels
    assert labels[HOLD_LABEL] == HOLD_VALUE

    objects.create_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_API_VERSION, k8s_namespace, "trainjobs", trainjob("held")
    )

    def node_job_active() -> list[dict[str, Any]] | None:
        status = (
            objects.get_namespaced_custom_object_status(
                TRAINER_GROUP, TRAINER_API_VERSION, k8s_namespace, "trainjobs", "held"
            ).get("status")
            or {}
        )
        jobs = status.get("jobsStatus") or []
        return jobs if any(j["name"] == "node" and j.get("active") for j in jobs) else None

    eventually(node_job_active, what="the Trainer to report the node job active")
    objects.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", k8s_namespace, "jobsets", "held"
    )
    assert [j.metadata.name for j in batch.list_namespaced_job(k8s_namespace).items] == [
        "held-node-0"
    ]
    (pod,) = core.list_namespaced_pod(k8s_namespace).items
    time.sleep(3 * 0.5)  # three of the node agent's passes (POLL_SECONDS) over this pod
    pod = core.read_namespaced_pod(pod.metadata.name, k8s_namespace)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"
    assert not pod.status.container_statuses


@pytest.mark.runs_pods
def test_a_namespace_of_a_test_marked_runs_pods_runs_its_pods(
    api: client.ApiClient, k8s_namespace: str
) -> None:
    core = client.CoreV1Api(api)
    assert HOLD_LABEL not in (core.read_namespace(k8s_namespace).metadata.labels or {})
    core.create_namespaced_pod(k8s_namespace, python_pass_pod("runs"))

    pod = eventually(
        lambda: (
            (p := core.read_namespaced_pod("runs", k8s_namespace)).status.phase == "Succeeded" and p
        ),
        what="the pod to run and succeed",
    )
    assert pod.spec.node_name == "tuneloop-local"


def test_the_node_agent_does_not_ask_for_the_pods_of_held_namespaces(
    api: client.ApiClient, k8s_namespace: str, tmp_path: Path
) -> None:
    # Its list of every pod, twice a second, also serialized and decoded the thousands of held
    # pods a benchmark leaves behind; held pods stay unbound, so there is nothing to do with
    # them. The real API server decides what the agent's query leaves out.
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(k8s_namespace, python_pass_pod("held"))
    agent = NodeAgent(
        api, root=tmp_path, node_name="looking-only", images=dict[str, ImageEnvironment]()
    )  # only asked what it would look at: it registers nothing and runs nothing

    def names() -> set[tuple[str, str]]:
        return {
            (p["metadata"]["namespace"], p["metadata"]["name"]) for p in agent.pods_to_look_at()
        }

    assert (k8s_namespace, "held") not in names()

    core.patch_namespace(k8s_namespace, {"metadata": {"labels": {HOLD_LABEL: None}}})

    assert (k8s_namespace, "held") in names()

"""The local control plane runs workloads the way a cluster does, with the real controllers.

Each test creates what a user would (a Job, a JobSet, a TrainJob, a pod) and waits for the
state the controllers and the node agent produce; nothing here writes a status itself.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client

from devservices.control_plane import LocalControlPlane
from devservices.kubernetes import TRAINER_API_VERSION, TRAINER_GROUP, new_api_client
from devservices.node_agent import TUNELOOP_IMAGE_REPOSITORY

pytestmark = [pytest.mark.kubernetes, pytest.mark.runs_pods]

IMAGE = f"{TUNELOOP_IMAGE_REPOSITORY}:0.1.0"
T = TypeVar("T")


def eventually(probe: Callable[[], T | None], *, timeout: float = 90.0, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


@pytest.fixture
def api(control_plane: LocalControlPlane) -> Iterator[client.ApiClient]:
    with new_api_client(control_plane.kubeconfig) as api_client:
        yield api_client


@pytest.fixture
def namespace(api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods need it)."""
    core = client.CoreV1Api(api)
    name = f"cp-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})

    def default_account() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except client.ApiException:
            return False
        return True

    eventually(default_account, what=f"the default ServiceAccount in {name}")
    yield name
    core.delete_namespace(name)


def python_container(code: str, **extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": IMAGE, "command": ["python", "-c", code], **extra}


def container_log(plane: LocalControlPlane, pod: client.V1Pod, container: str = "main") -> str:
    folder = f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid}"
    log = plane.pods_dir / "pods" / folder / "logs" / f"{container}.log"
    return log.read_text() if log.exists() else ""


def only_pod(core: client.CoreV1Api, namespace: str) -> client.V1Pod | None:
    pods = core.list_namespaced_pod(namespace).items
    return pods[0] if len(pods) == 1 else None


def test_a_jobs_pod_runs_its_command_and_the_job_controller_completes_the_job(
    api: client.ApiClient, namespace: str, control_plane: LocalControlPlane
) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    code = "import os; print('working in', os.getcwd(), 'as', os.environ['POD_NAME'])"
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "hello"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            python_container(
                                code,
                                env=env,
                                volumeMounts=[{"name": "work", "mountPath": "/workspace"}],
                            )
                        ],
                        "volumes": [{"name": "work", "emptyDir": {}}],
                    }
                },
            },
        },
    )

    job = eventually(
        lambda: (j := batch.read_namespaced_job_status("hello", namespace)).status.succeeded and j,
        what="the Job to succeed",
    )

    assert {(c.type, c.status) for c in job.status.conditions} >= {("Complete", "True")}
    pod = only_pod(core, namespace)
    assert pod is not None
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    assert container_log(control_plane, pod) == f"working in /workspace as {pod.metadata.name}\n"


def test_a_failing_command_fails_its_pod_with_its_exit_code_and_the_job(
    api: client.ApiClient, namespace: str
) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "broken"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [python_container("raise SystemExit(3)")],
                    }
                },
            },
        },
    )

    eventually(
        lambda: batch.read_namespaced_job_status("broken", namespace).status.failed,
        what="the Job to fail",
    )

    pod = only_pod(core, namespace)
    assert pod is not None
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")


@pytest.mark.parametrize("path", [None, "/tmp/why-it-stopped"])
def test_what_a_container_writes_to_its_termination_message_path_is_its_terminated_message(
    control_plane: LocalControlPlane, api: client.ApiClient, namespace: str, path: str | None
) -> None:
    # a reason, then more than the log tail's 2 KiB of traceback-like noise (as torchrun's)
    where = path or "/dev/termination-log"
    code = (
        f"open({where!r}, 'w').write('the reason\\n'); import sys; "
        "[print('noise ' * 20, file=sys.stderr) for _ in range(60)]; raise SystemExit(1)"
    )
    extra: dict[str, Any] = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    if path is not None:
        extra["terminationMessagePath"] = path
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "tells"},
            "spec": {"restartPolicy": "Never", "containers": [python_container(code, **extra)]},
        },
    )

    def failed() -> client.V1Pod | None:
        pod = only_pod(core, namespace)
        return pod if pod is not None and pod.status.phase == "Failed" else None

    pod = eventually(failed, what="the pod to fail")

    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.message) == (1, "the reason\n")
    assert "noise" in container_log(control_plane, pod)  # the log's tail would have said that


def test_a_jobset_completes_and_its_pods_resolve_their_names_to_loopback(
    api: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api)
    code = (
        "import os, socket\n"
        "name = os.environ['HOSTNAME'] + '.' + os.environ['SUBDOMAIN']\n"
        "assert socket.gethostbyname(name) == '127.0.0.1', name\n"
    )
    env = [{"name": "SUBDOMAIN", "value": "pairs"}]
    objects.create_namespaced_custom_object(
        "jobset.x-k8s.io",
        "v1alpha2",
        namespace,
        "jobsets",
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "pair"},
            "spec": {
                "network": {"subdomain": "pairs"},
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 2,
                        "template": {
                            "spec": {
                                "backoffLimit": 0,
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [python_container(code, env=env)],
                                    }
                                },
                            }
                        },
                    }
                ],
            },
        },
    )

    def completed() -> list[dict[str, Any]] | None:
        jobset = objects.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "pair"
        )
        conditions = (jobset.get("status") or {}).get("conditions") or []
        done = [c for c in conditions if c["status"] == "True"]
        return done if any(c["type"] in ("Completed", "Failed") for c in done) else None

    conditions = eventually(completed, what="the JobSet to finish")

    assert [c["type"] for c in conditions] == ["Completed"]


def test_a_trainjob_runs_and_the_trainer_controller_marks_it_complete_with_its_progress(
    api: client.ApiClient, namespace: str
) -> None:
    """The pod reports progress to the Trainer's status server with its projected token, as
    proposal 2779 describes; the Trainer writes it to status.trainerStatus."""
    objects = client.CustomObjectsApi(api)
    runtime = f"python-{namespace}"
    report = (
        "import json, os, ssl, time, urllib.request\n"
        "ca = os.environ['KUBEFLOW_TRAINER_SERVER_CA_CERT']\n"
        "context = ssl.create_default_context(cafile=ca)\n"
        "token = open(os.environ['KUBEFLOW_TRAINER_SERVER_TOKEN']).read()\n"
        "body = json.dumps({'trainerStatus': {'progressPercentage': 40,"
        " 'metrics': [{'name': 'train_loss', 'value': '0.5'}],"
        " 'lastUpdatedTime': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}}).encode()\n"
        "request = urllib.request.Request(os.environ['KUBEFLOW_TRAINER_SERVER_URL'], body,"
        " {'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'})\n"
        "print(urllib.request.urlopen(request, context=context).status)\n"
    )
    objects.create_cluster_custom_object(
        TRAINER_GROUP,
        TRAINER_API_VERSION,
        "clustertrainingruntimes",
        {
            "apiVersion": f"{TRAINER_GROUP}/{TRAINER_API_VERSION}",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": runtime, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {
                "mlPolicy": {"numNodes": 1, "torch": {}},
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "metadata": {
                                        "labels": {
                                            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
                                        }
                                    },
                                    "spec": {
                                        "template": {
                                            "spec": {
                                                "containers": [
                                                    {
                                                        "name": "node",
                                                        "image": IMAGE,
                                                        "command": ["python", "-c", report],
                                                    }
                                                ]
                                            }
                                        }
                                    },
                                },
                            }
                        ]
                    }
                },
            },
        },
    )
    try:
        objects.create_namespaced_custom_object(
            TRAINER_GROUP,
            TRAINER_API_VERSION,
            namespace,
            "trainjobs",
            {
                "apiVersion": f"{TRAINER_GROUP}/{TRAINER_API_VERSION}",
                "kind": "TrainJob",
                "metadata": {"name": "short"},
                "spec": {"runtimeRef": {"name": runtime}},
            },
        )

        def finished() -> dict[str, Any] | None:
            trainjob = objects.get_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_API_VERSION, namespace, "trainjobs", "short"
            )
            status: dict[str, Any] = trainjob.get("status") or {}
            conditions = status.get("conditions") or []
            done = any(
                c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions
            )
            return status if done else None

        status = eventually(finished, timeout=120, what="the TrainJob to finish")
    finally:
        objects.delete_cluster_custom_object(
            TRAINER_GROUP, TRAINER_API_VERSION, "clustertrainingruntimes", runtime
        )

    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions.get("Complete") == "True", status
    assert status["trainerStatus"]["progressPercentage"] == 40
    assert status["trainerStatus"]["metrics"] == [{"name": "train_loss", "value": "0.5"}]


def test_a_pod_whose_image_cannot_run_waits_with_err_image_pull(
    api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "elsewhere"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "docker.io/library/busybox:1.37"}],
            },
        },
    )

    def waiting() -> client.V1ContainerStateWaiting | None:
        pod = core.read_namespaced_pod_status("elsewhere", namespace)
        statuses = pod.status.container_statuses or []
        return statuses[0].state.waiting if statuses and statuses[0].state.waiting else None

    state = eventually(
        lambda: (w := waiting()) is not None and w.reason == "ErrImagePull" and w,
        what="the container to wait with ErrImagePull",
    )

    assert "docker.io/library/busybox:1.37" in state.message
    assert core.read_namespaced_pod_status("elsewhere", namespace).status.phase == "Pending"


def test_a_projected_token_for_an_audience_passes_a_token_review_for_that_audience(
    api: client.ApiClient, namespace: str, control_plane: LocalControlPlane
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "holder"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    python_container(
                        "print(open('/var/run/secrets/tokens/status').read())",
                        volumeMounts=[{"name": "tokens", "mountPath": "/var/run/secrets/tokens"}],
                    )
                ],
                "volumes": [
                    {
                        "name": "tokens",
                        "projected": {
                            "sources": [
                                {
                                    "serviceAccountToken": {
                                        "audience": "tuneloop-test",
                                        "expirationSeconds": 3600,
                                        "path": "status",
                                    }
                                }
                            ]
                        },
                    }
                ],
            },
        },
    )
    pod = eventually(
        lambda: (
            (p := core.read_namespaced_pod_status("holder", namespace)).status.phase == "Succeeded"
            and p
        ),
        what="the pod to succeed",
    )
    token = container_log(control_plane, pod).strip()

    review = client.AuthenticationV1Api(api).create_token_review(
        {"spec": {"token": token, "audiences": ["tuneloop-test"]}}
    )

    assert review.status.authenticated is True
    assert review.status.audiences == ["tuneloop-test"]
    assert review.status.user.username == f"system:serviceaccount:{namespace}:default"
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["kubernetes.io"]["pod"]["name"] == "holder"


def test_deleting_a_running_pod_stops_its_process_and_removes_the_pod(
    api: client.ApiClient, namespace: str, control_plane: LocalControlPlane
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "sleeper"},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    python_container(
                        "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
                    )
                ],
            },
        },
    )
    pod = eventually(
        lambda: (
            (p := core.read_namespaced_pod_status("sleeper", namespace)).status.phase == "Running"
            and container_log(control_plane, p)
            and p
        ),
        what="the pod to run and print its pid",
    )
    pid = int(container_log(control_plane, pod).split()[0])

    core.delete_namespaced_pod("sleeper", namespace)

    def removed() -> bool:
        return not core.list_namespaced_pod(namespace).items

    eventually(removed, timeout=30, what="the pod to be removed")
    assert not Path(f"/proc/{pid}").exists()

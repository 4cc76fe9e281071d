"""Two 2-node torchrun TrainJobs at once on the local control plane: both complete.

The node agent's pods share this machine's network, and the Trainer's torch plugin gives every
trainer container `PET_MASTER_PORT=29500`: two jobs at once would both try to host their
rendezvous there. The agent gives each TrainJob (its JobSet's pods) a port of its own. The
test reads which port each trainer process was really given from the process's environment
(`/proc/<pid>/environ`), while both jobs run, and waits for the Trainer to mark both TrainJobs
Complete. Nothing here writes a status.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devservices.control_plane import LocalControlPlane
from devservices.kubernetes import (
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    create_namespace,
    delete_namespace,
    new_api_client,
)
from runtimes.trainer.config import TrainerConfig

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.runs_pods,
    pytest.mark.training,
    pytest.mark.slow,
    pytest.mark.timeout(600),
]

ADAPTERS_CLAIM = "tuneloop-adapters"
"""The PVC the shipped `tuneloop-lora` runtime mounts at ADAPTERS_MOUNT."""
ADAPTERS_MOUNT = "/var/lib/tuneloop/adapters"
JOBS = ("para-a", "para-b")


def trainjob(name: str, *, model: Path, dataset: Path) -> dict[str, Any]:
    config = TrainerConfig(
        base_model=str(model),
        dataset=str(dataset),
        output_dir=f"{ADAPTERS_MOUNT}/{name}",
        max_steps=30,  # long enough that both jobs' pods run at the same time
        batch_size=4,
        max_seq_length=64,
        eval_fraction=0.0,
        save_steps=0,
        cpu_threads=1,
        job_name=name,
    )
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_API_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": "tuneloop-lora"},
            "trainer": {
                "numNodes": 2,
                "numProcPerNode": 1,
                "command": ["torchrun", "--module", "runtimes.trainer"],
                "args": list(config.to_args()),
            },
        },
    }


def master_ports_of_running_trainers(job: str) -> dict[int, str]:
    """pid -> PET_MASTER_PORT of the live processes started for *job* (its torchrun agents
    and their workers: their command line names the job's output directory)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if f"{ADAPTERS_MOUNT}/{job}".encode() not in cmdline:
                continue
            environ = dict(
                entry.split(b"=", 1)
                for entry in (proc / "environ").read_bytes().split(b"\0")
                if b"=" in entry
            )
            if b"PET_MASTER_PORT" in environ:
                found[int(proc.name)] = environ[b"PET_MASTER_PORT"].decode()
    return found


def finished(trainjob: dict[str, Any]) -> str | None:
    for condition in (trainjob.get("status") or {}).get("conditions") or []:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return str(condition["type"])
    return None


@pytest.fixture
def namespace(control_plane: LocalControlPlane) -> Iterator[str]:
    """A namespace whose pods the node agent runs (no hold label)."""
    name = f"para-{uuid.uuid4().hex[:8]}"
    with new_api_client(control_plane.kubeconfig) as api:
        create_namespace(api, name)
    yield name
    with new_api_client(control_plane.kubeconfig) as api:
        delete_namespace(api, name)


def test_two_two_node_trainjobs_at_once_each_get_their_own_master_port_and_complete(
    control_plane: LocalControlPlane,
    namespace: str,
    tiny_model_dir: Path,
    reverse_dataset: Path,
) -> None:
    with new_api_client(control_plane.kubeconfig) as api:
        objects = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        for name in JOBS:
            objects.create_namespaced_custom_object(
                TRAINER_GROUP,
                TRAINER_API_VERSION,
                namespace,
                "trainjobs",
                trainjob(name, model=tiny_model_dir, dataset=reverse_dataset),
            )

        ports: dict[str, set[str]] = {name: set() for name in JOBS}
        trainers_seen: dict[str, set[int]] = {name: set() for name in JOBS}
        all_running_at_once = False
        outcome: dict[str, str | None] = dict.fromkeys(JOBS)
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and not all(outcome.values()):
            for name in JOBS:
                running = master_ports_of_running_trainers(name)
                trainers_seen[name] |= set(running)
                ports[name] |= set(running.values())
            pods = core.list_namespaced_pod(namespace).items
            if len(pods) == 4 and all(pod.status.phase == "Running" for pod in pods):
                all_running_at_once = True
            for name in JOBS:
                outcome[name] = finished(
                    objects.get_namespaced_custom_object(
                        TRAINER_GROUP, TRAINER_API_VERSION, namespace, "trainjobs", name
                    )
                )
            time.sleep(0.5)

    assert outcome == dict.fromkeys(JOBS, "Complete"), control_plane.log_tail()
    assert all_running_at_once, "the two jobs' four pods never ran at the same time"
    # Each job's processes (both nodes) agreed on one port, and the two jobs' ports differ.
    for name in JOBS:
        assert len(trainers_seen[name]) >= 2, trainers_seen  # both nodes were seen running
        assert len(ports[name]) == 1, ports
    assert ports["para-a"] != ports["para-b"], ports
    assert "29500" not in ports["para-a"] | ports["para-b"]
    # Rank 0 of each wrote its own adapter on the shared claim.
    claim = control_plane.pods_dir / "claims" / namespace / ADAPTERS_CLAIM
    for name in JOBS:
        assert list((claim / name).rglob("adapter_model.safetensors")), sorted(claim.rglob("*"))

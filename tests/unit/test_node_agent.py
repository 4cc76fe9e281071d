"""The node agent's pure parts: `$(VAR)` expansion, the downward API, image references,
torchrun's master port per TrainJob, a container's own working directory, and the two images
it maps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devservices.node_agent import (
    JOBSET_NAME_LABEL,
    JOBSET_RESTART_LABEL,
    JOBSET_UID_LABEL,
    MasterPorts,
    Mount,
    expand,
    field_value,
    image_repository,
    orchestrator_image_environment,
    private_working_dir,
    rendezvous_group,
    tuneloop_image_environment,
)

POD = {
    "metadata": {
        "name": "trainer-node-0-0",
        "namespace": "team-a",
        "uid": "1234",
        "labels": {"jobset.sigs.k8s.io/job-index": "0"},
        "annotations": {"note": "x"},
    },
    "spec": {"nodeName": "tuneloop-local", "serviceAccountName": "default"},
}


def test_expansion_replaces_known_variables_and_keeps_unknown_references_as_written() -> None:
    assert expand("$(A)-$(B)", {"A": "1"}) == "1-$(B)"


def test_a_double_dollar_is_a_literal_dollar_and_is_not_expanded() -> None:
    assert expand("$$(A) costs $$5", {"A": "1"}) == "$(A) costs $5"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "trainer-node-0-0"),
        ("metadata.namespace", "team-a"),
        ("metadata.uid", "1234"),
        ("metadata.labels['jobset.sigs.k8s.io/job-index']", "0"),
        ("metadata.annotations['note']", "x"),
        ("spec.nodeName", "tuneloop-local"),
        ("spec.serviceAccountName", "default"),
        ("status.podIP", "127.0.0.1"),
    ],
)
def test_the_downward_api_gives_the_pods_own_fields(path: str, value: str) -> None:
    assert field_value(POD, path) == value


def test_an_unknown_field_path_is_refused_rather_than_given_an_empty_value() -> None:
    with pytest.raises(ValueError, match=r"status\.phase"):
        field_value(POD, "status.phase")


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("ghcr.io/tuneloop/lora-trainer:0.1.0", "ghcr.io/tuneloop/lora-trainer"),
        ("ghcr.io/tuneloop/lora-trainer", "ghcr.io/tuneloop/lora-trainer"),
        ("localhost:5000/trainer:dev", "localhost:5000/trainer"),
        ("localhost:5000/trainer", "localhost:5000/trainer"),
        ("ghcr.io/tuneloop/lora-trainer@sha256:abcd", "ghcr.io/tuneloop/lora-trainer"),
    ],
)
def test_an_images_repository_drops_its_tag_or_digest_but_not_a_registry_port(
    image: str, repository: str
) -> None:
    assert image_repository(image) == repository


def _jobset_pod(name: str, jobset_uid: str, *, attempt: str = "0", namespace: str = "team-a"):
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-of-{name}",
            "labels": {
                JOBSET_NAME_LABEL: name.rsplit("-node-", 1)[0],
                JOBSET_UID_LABEL: jobset_uid,
                JOBSET_RESTART_LABEL: attempt,
            },
        }
    }


def test_the_pods_of_one_jobset_are_one_rendezvous_group() -> None:
    assert rendezvous_group(_jobset_pod("job-a-node-0-0-x1", "u1")) == rendezvous_group(
        _jobset_pod("job-a-node-0-1-x2", "u1")
    )


@pytest.mark.parametrize(
    "other",
    [
        _jobset_pod("job-b-node-0-0-y1", "u2"),
        _jobset_pod("job-a-node-0-0-x3", "u1", attempt="1"),
        _jobset_pod("job-a-node-0-0-x1", "u1", namespace="team-b"),
        {"metadata": {"name": "lonely", "namespace": "team-a", "uid": "u9"}},
    ],
    ids=["another-jobset", "a-restart-of-it", "another-namespace", "a-pod-of-no-jobset"],
)
def test_pods_of_another_jobset_or_attempt_are_another_group(other) -> None:
    assert rendezvous_group(other) != rendezvous_group(_jobset_pod("job-a-node-0-0-x1", "u1"))


def test_a_pod_of_no_jobset_is_a_group_of_its_own() -> None:
    one = {"metadata": {"name": "p", "namespace": "n", "uid": "u1"}}
    two = {"metadata": {"name": "p", "namespace": "n", "uid": "u2"}}
    assert rendezvous_group(one) != rendezvous_group(two)


def scripted(*ports: int):
    """A stand-in for the OS's choice of a free port: these ports, in this order."""
    queue = list(ports)
    return lambda: queue.pop(0)


def test_every_pod_of_a_group_gets_the_groups_port_and_another_group_another() -> None:
    ports = MasterPorts(scripted(40001, 40001, 40002))
    first = ports.claim("job-a", "pod-a0")
    assert ports.claim("job-a", "pod-a1") == first == 40001
    # The OS may offer a port another group holds (nothing listens on it yet): not taken.
    assert ports.claim("job-b", "pod-b0") == 40002


def test_a_group_keeps_its_port_until_its_last_pod_is_gone() -> None:
    ports = MasterPorts(scripted(40001, 40002))
    ports.claim("job-a", "pod-a0")
    ports.claim("job-a", "pod-a1")
    ports.release("pod-a0")
    assert ports.claim("job-a", "pod-a2") == 40001
    ports.release("pod-a1")
    ports.release("pod-a2")
    assert ports.claim("job-a", "pod-a3") == 40002


REPO = Path(__file__).resolve().parents[2]


def test_the_trainer_images_files_the_agent_maps_are_the_ones_its_dockerfile_copies() -> None:
    environment = tuneloop_image_environment(Path(sys.executable), Path("/cache"))
    copies = [
        line.split()[1:]
        for line in (REPO / "deploy" / "trainer.Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    assert environment.files, "the trainer image has files the agent maps"
    for target, host in environment.files.items():
        (source,) = [
            src for *sources, dest in copies for src in sources if dest.rstrip("/") == target
        ]
        assert (REPO / source).parent == host
        assert list(host.glob(Path(source).name)), f"{source} copies nothing"


@pytest.mark.parametrize(
    "environment",
    [
        tuneloop_image_environment(Path(sys.executable), Path("/cache")),
        orchestrator_image_environment(Path(sys.executable)),
    ],
    ids=["trainer", "orchestrator"],
)
def test_both_images_run_from_the_project_and_this_interpreters_environment(environment) -> None:
    assert REPO in environment.host_paths
    assert Path(sys.prefix).resolve() in environment.host_paths
    assert environment.env["PATH"].startswith(f"{Path(sys.executable).parent}:")


def test_the_orchestrator_image_runs_the_tuneloop_command_as_its_dockerfile_says() -> None:
    dockerfile = (REPO / "deploy" / "orchestrator.Dockerfile").read_text()
    (entrypoint,) = [line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")]
    assert entrypoint == 'ENTRYPOINT ["tuneloop"]'
    assert orchestrator_image_environment(Path(sys.executable)).entrypoint == ("tuneloop",)


SCRATCH = Path("/agent/pods/ns_pod_uid/rootfs/node-0")


def test_a_containers_working_directory_is_its_own_and_not_the_hosts() -> None:
    assert private_working_dir("/workspace", [], SCRATCH) == Mount(SCRATCH, "/workspace")


def test_a_volume_below_the_working_directory_leaves_it_the_containers_own() -> None:
    below = [Mount(Path("/agent/volumes/out"), "/workspace/output")]
    assert private_working_dir("/workspace", below, SCRATCH) == Mount(SCRATCH, "/workspace")


@pytest.mark.parametrize("volume", ["/workspace", "/"], ids=["on-it", "above-it"])
def test_a_volume_on_or_above_the_working_directory_is_that_directory(volume: str) -> None:
    volumes = [Mount(Path("/agent/volumes/v"), volume)]
    assert private_working_dir("/workspace", volumes, SCRATCH) is None


def test_a_volume_whose_path_merely_starts_the_same_is_not_above_it() -> None:
    volumes = [Mount(Path("/agent/volumes/v"), "/work")]
    assert private_working_dir("/workspace", volumes, SCRATCH) == Mount(SCRATCH, "/workspace")


def test_the_root_working_directory_is_never_covered() -> None:
    assert private_working_dir("/", [], SCRATCH) is None

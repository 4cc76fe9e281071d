"""The real API server with the Kubeflow Trainer v2.3.0 CRDs treats TrainJobs as a cluster would.

These tests check what the API server and the Trainer's admission webhooks enforce (OpenAPI
schema and CEL rules of the CRD, the /status subresource, watches, restarts). They run against
whatever `kube_api` provides, in a held namespace (`tuneloop.io/node-agent=hold`): the
controllers act on the TrainJobs, no trainer runs.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from devservices.kubernetes import (
    TORCH_DISTRIBUTED_RUNTIME,
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    KubeEndpoint,
)

pytestmark = pytest.mark.kubernetes


@pytest.fixture
def objects(kube_api: KubeEndpoint) -> Iterator[client.CustomObjectsApi]:
    with kube_api.api_client() as api:
        yield client.CustomObjectsApi(api)


def trainjob(name: str, **spec_changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_API_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"tuneloop.dev/rule": "drift"}},
        "spec": {
            "runtimeRef": {"name": TORCH_DISTRIBUTED_RUNTIME},
            "trainer": {
                "image": "ghcr.io/tuneloop/trainer:dev",
                "command": ["tuneloop-train"],
                "args": ["--steps=2"],
                "numNodes": 1,
            },
        },
    }
    for path, value in spec_changes.items():
        target = body["spec"]
        *parents, leaf = path.split("__")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    return body


def create(
    objects: client.CustomObjectsApi, namespace: str, body: dict[str, Any], **options: Any
) -> dict[str, Any]:
    created = objects.create_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_API_VERSION, namespace, "trainjobs", body, **options
    )
    assert isinstance(created, dict)
    return created


def rejection(call: Any) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as caught:
        call()
    status = json.loads(caught.value.body or "{}")
    return caught.value.status, status["message"]


WEBHOOK_DECODE_ERROR = (
    'admission webhook "defaulter.trainjob.trainer.kubeflow.org" denied the request: '
    "json: cannot unmarshal string into Go struct field Trainer.spec.trainer.numNodes of type int32"
)
"""The Trainer's mutating webhook sees a wrongly typed field first (admission runs before
schema validation) and answers 400, as on any cluster with the Trainer installed."""


@pytest.mark.parametrize(
    ("changes", "expected_message"),
    [
        ({"trainer__numNodes": "two"}, WEBHOOK_DECODE_ERROR),
        (
            {"managedBy": "example.com/other-controller"},
            "ManagedBy must be trainer.kubeflow.org/trainjob-controller",
        ),
        (
            {"initializer__dataset__storageUri": "bucket/without/scheme"},
            "storageUri may be empty, or it must be a valid URI",
        ),
        ({"runtimeRef": {}}, "spec.runtimeRef.name: Required value"),
    ],
    ids=["wrong-type", "foreign-manager", "storage-uri-without-scheme", "runtime-without-name"],
)
def test_trainjob_with_a_wrong_field_is_rejected_with_the_crd_or_webhook_message(
    objects, k8s_namespace, changes, expected_message
):
    status, message = rejection(lambda: create(objects, k8s_namespace, trainjob("bad", **changes)))

    if expected_message == WEBHOOK_DECODE_ERROR:
        assert (status, message) == (400, WEBHOOK_DECODE_ERROR)
    else:
        assert status == 422
        assert expected_message in message


def test_trainjob_with_an_unknown_field_is_rejected_under_strict_validation(objects, k8s_namespace):
    body = trainjob("unknown-field", trainer__gpus=1)

    status, message = rejection(
        lambda: create(objects, k8s_namespace, body, field_validation="Strict")
    )

    assert status == 400  # strict field validation answers BadRequest, not Invalid
    assert 'unknown field "spec.trainer.gpus"' in message


def test_trainjob_name_longer_than_63_characters_is_rejected(objects, k8s_namespace):
    name = "a" * 64

    status, message = rejection(lambda: create(objects, k8s_namespace, trainjob(name)))

    assert status == 422
    assert "metadata.name must be no more than 63 characters" in message


def test_trainjob_spec_trainer_cannot_be_changed_after_creation(objects, k8s_namespace):
    create(objects, k8s_namespace, trainjob("immutable"))

    status, message = rejection(
        lambda: objects.patch_namespaced_custom_object(
            TRAINER_GROUP,
            TRAINER_API_VERSION,
            k8s_namespace,
            "trainjobs",
            "immutable",
            {"spec": {"trainer": {"image": "ghcr.io/tuneloop/trainer:other"}}},
        )
    )

    assert status == 422
    assert "field is immutable" in message


def complete_condition() -> dict[str, str]:
    """What the Trainer controller copies from a finished JobSet (kubeflow-trainer.md 1.5)."""
    return {
        "type": "Complete",
        "status": "True",
        "reason": "AllJobsCompleted",
        "message": "jobset completed successfully",
        "lastTransitionTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def test_status_patched_to_complete_through_the_status_subresource_is_seen_by_a_watch(
    objects, k8s_namespace
):
    created = create(objects, k8s_namespace, trainjob("lora-drift-1"))
    assert "status" not in created or not created["status"].get("conditions")

    # The test writes what the Trainer writes when a JobSet completes (no trainer runs here);
    # the Trainer keeps a Complete condition, and writes no condition of its own meanwhile.
    objects.patch_namespaced_custom_object_status(
        TRAINER_GROUP,
        TRAINER_API_VERSION,
        k8s_namespace,
        "trainjobs",
        "lora-drift-1",
        {"status": {"conditions": [complete_condition()]}},
    )

    seen: list[tuple[str, list[dict[str, Any]]]] = []
    stream = watch.Watch().stream(
        objects.list_namespaced_custom_object,
        TRAINER_GROUP,
        TRAINER_API_VERSION,
        k8s_namespace,
        "trainjobs",
        resource_version=created["metadata"]["resourceVersion"],
        timeout_seconds=10,
    )
    for event in stream:
        conditions = event["object"].get("status", {}).get("conditions", [])
        seen.append((event["type"], conditions))
        if conditions:
            break
    assert seen, "the watch saw nothing within 10 s"
    assert seen[-1][0] == "MODIFIED"
    assert [(c["type"], c["status"], c["reason"]) for c in seen[-1][1]] == [
        ("Complete", "True", "AllJobsCompleted")
    ]


def test_status_written_through_the_main_resource_is_ignored(objects, k8s_namespace):
    current = create(objects, k8s_namespace, trainjob("status-ignored"))
    for _ in range(5):
        sneaky = copy.deepcopy(current)
        sneaky["status"] = {"conditions": [complete_condition()]}
        try:
            replaced = objects.replace_namespaced_custom_object(
                TRAINER_GROUP,
                TRAINER_API_VERSION,
                k8s_namespace,
                "trainjobs",
                "status-ignored",
                sneaky,
            )
            break
        except client.ApiException as exc:
            # The Trainer controller wrote the TrainJob since we read it (seen once in CI):
            # a replace must carry the current resourceVersion, so read it again.
            if exc.status != 409:
                raise
            current = objects.get_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_API_VERSION, k8s_namespace, "trainjobs", "status-ignored"
            )
    else:
        pytest.fail("the TrainJob changed under every one of 5 replaces")

    # A Trainer controller may have written conditions of its own meanwhile; ours is not there.
    conditions = replaced.get("status", {}).get("conditions") or []
    assert complete_condition()["type"] not in [c["type"] for c in conditions]


def test_created_trainjob_gets_the_crd_defaults(objects, k8s_namespace):
    created = create(objects, k8s_namespace, trainjob("defaults"))

    assert created["spec"]["runtimeRef"] == {
        "name": TORCH_DISTRIBUTED_RUNTIME,
        "apiGroup": TRAINER_GROUP,
        "kind": "ClusterTrainingRuntime",
    }
    assert created["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
    assert created["spec"]["suspend"] is False


def test_torch_distributed_cluster_training_runtime_is_installed(objects):
    runtimes = objects.list_cluster_custom_object(
        TRAINER_GROUP, TRAINER_API_VERSION, "clustertrainingruntimes"
    )

    names = [item["metadata"]["name"] for item in runtimes["items"]]
    assert TORCH_DISTRIBUTED_RUNTIME in names
    runtime = next(i for i in runtimes["items"] if i["metadata"]["name"] == "torch-distributed")
    assert runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] == "node"


def test_local_api_restarted_on_the_same_address_keeps_its_trainjobs(
    kube_api, objects, k8s_namespace
):
    if kube_api.server is None:
        pytest.skip("only the local control plane's API server can be stopped by a test")
    create(objects, k8s_namespace, trainjob("survives-restart"))

    kube_api.server.stop_apiserver()
    assert not kube_api.server.healthy()
    kube_api.server.start()

    with kube_api.api_client() as api:  # a new connection, as a watcher would make
        kept = client.CustomObjectsApi(api).get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_API_VERSION, k8s_namespace, "trainjobs", "survives-restart"
        )
    assert isinstance(kept, dict)
    assert kept["spec"]["runtimeRef"]["name"] == TORCH_DISTRIBUTED_RUNTIME

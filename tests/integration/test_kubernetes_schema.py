"""What tuneloop sends the cluster is accepted by the real Trainer v2.3.0: its CRD schema and
its admission webhooks.

Every create here is a server-side dry run: the API server runs the full OpenAPI schema and
CEL validation and the webhooks (which check a TrainJob against the runtime it names: its
initializers, its replicated jobs) and then stores nothing, so the examples cost little and
leave nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from runtimes.kubernetes import manifests
from runtimes.kubernetes.catalog import GROUP, VERSION, RuntimeInfo, runtime_info
from tests.unit.kubernetes.strategies import requests

pytestmark = pytest.mark.kubernetes

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "unit" / "kubernetes" / "golden"
RUNTIMES_FILE = REPO / "deploy" / "runtimes" / "tuneloop-lora.yaml"


@pytest.fixture(scope="module")
def objects(kube_api):
    with kube_api.api_client() as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture(scope="module")
def installed_runtimes(objects) -> list[RuntimeInfo]:
    """The cluster's ClusterTrainingRuntimes as the catalog reads them: the Trainer's
    `torch-distributed` and tuneloop's own (deploy/runtimes)."""
    listing = objects.list_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes")
    found = sorted((runtime_info(item) for item in listing["items"]), key=lambda r: r.name)
    assert {"torch-distributed", "tuneloop-lora", "tuneloop-lora-hf"} <= {r.name for r in found}
    return found


def dry_run_create(objects, namespace, body):
    return objects.create_namespaced_custom_object(
        GROUP, VERSION, namespace, manifests.PLURAL, body, dry_run="All"
    )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests, data=st.data())
def test_every_trainjob_the_builder_can_produce_for_an_installed_runtime_is_accepted(
    objects, k8s_namespace, installed_runtimes, request, data
):
    # The catalog only ever hands the builder a runtime the cluster has; the webhook refuses
    # a TrainJob that asks for an initializer its runtime lacks.
    runtime = data.draw(st.sampled_from(installed_runtimes), label="runtime")
    request = dataclasses.replace(request, runtime=runtime.name)
    body = manifests.build_trainjob(
        request, namespace=k8s_namespace, runtime=runtime, settings=manifests.Settings()
    )
    created = dry_run_create(objects, k8s_namespace, body)
    assert created["metadata"]["name"] == request.name
    assert created["spec"]["trainer"]["args"] == body["spec"]["trainer"]["args"]


@pytest.mark.parametrize("golden", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_golden_trainjobs_are_accepted(objects, k8s_namespace, golden):
    body = json.loads((GOLDEN / golden).read_text())
    body["metadata"]["namespace"] = k8s_namespace
    created = dry_run_create(objects, k8s_namespace, body)
    assert created["spec"]["runtimePatches"][0]["manager"] == manifests.MANAGER


def test_shipped_runtimes_are_accepted_and_understood(objects):
    documents = list(yaml.safe_load_all(RUNTIMES_FILE.read_text()))
    assert [d["metadata"]["name"] for d in documents] == ["tuneloop-lora", "tuneloop-lora-hf"]
    for document in documents:
        # Under a name of its own: the cluster has these runtimes installed already.
        candidate = {**document, "metadata": {**document["metadata"], "name": "dry-run-check"}}
        created = objects.create_cluster_custom_object(
            GROUP, VERSION, "clustertrainingruntimes", candidate, dry_run="All"
        )
        assert created["metadata"]["name"] == "dry-run-check"
    default, with_initializers = (runtime_info(d) for d in documents)
    assert default.labels["tuneloop.io/default"] == "true"
    assert not default.has_gpus
    assert with_initializers.has_dataset_initializer
    assert with_initializers.has_model_initializer
    assert with_initializers.gpus_per_node == 1


def test_dry_run_does_validate_so_the_tests_above_mean_something(objects, k8s_namespace):
    body = json.loads((GOLDEN / "basic.json").read_text())
    body["metadata"]["namespace"] = k8s_namespace
    body["spec"]["activeDeadlineSeconds"] = 0  # the CRD says minimum 1
    with pytest.raises(client.ApiException) as rejected:
        dry_run_create(objects, k8s_namespace, body)
    assert rejected.value.status == 422
    assert "activeDeadlineSeconds" in rejected.value.body

"""What tuneloop sends the cluster is accepted by the real Trainer v2.3.0 CRD schema.

Every create here is a server-side dry run: the API server runs the full OpenAPI schema and
CEL validation and then stores nothing, so the examples cost little and leave nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from kubernetes import client

from runtimes.kubernetes import manifests
from runtimes.kubernetes.catalog import GROUP, VERSION, runtime_info
from tests.unit.kubernetes.strategies import requests, runtimes

pytestmark = pytest.mark.kubernetes

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "unit" / "kubernetes" / "golden"
RUNTIMES_FILE = REPO / "deploy" / "runtimes" / "tuneloop-lora.yaml"


@pytest.fixture(scope="module")
def objects(kube_api):
    with kube_api.api_client() as api:
        yield client.CustomObjectsApi(api)


def dry_run_create(objects, namespace, body):
    return objects.create_namespaced_custom_object(
        GROUP, VERSION, namespace, manifests.PLURAL, body, dry_run="All"
    )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests, runtime=runtimes)
def test_every_trainjob_the_builder_can_produce_is_accepted(
    objects, k8s_namespace, request, runtime
):
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
        created = objects.create_cluster_custom_object(
            GROUP, VERSION, "clustertrainingruntimes", document, dry_run="All"
        )
        assert created["metadata"]["name"] == document["metadata"]["name"]
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

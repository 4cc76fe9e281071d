"""The node agent's pure parts: `$(VAR)` expansion, the downward API, image references."""

from __future__ import annotations

import pytest

from devservices.node_agent import expand, field_value, image_repository

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

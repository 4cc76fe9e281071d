"""The TrainJob builder: golden files for the shapes we ship, hypothesis for the invariants.

The golden cases live in `golden_cases.py`. After an intended change, rewrite the golden files
with `.venv/bin/python -m tests.unit.kubernetes.update_golden` and review the diff; this test
only compares, so it fails until they are rewritten.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import JobRejectedError
from orchestrator.jobs.model import TrainingRequest
from runtimes.kubernetes import manifests
from tests.unit.kubernetes.golden_cases import (
    BASIC,
    CASES,
    TORCH,
    WITH_INITIALIZERS,
    golden_file,
    render,
)
from tests.unit.kubernetes.strategies import requests, runtimes


@pytest.mark.parametrize("case", sorted(CASES))
def test_trainjob_matches_its_golden_file(case):
    # Only compares: after an intended change, rewrite the files with
    # `python -m tests.unit.kubernetes.update_golden` and review the diff.
    assert render(case) == golden_file(case).read_text(), (
        f"{golden_file(case).name} differs from the builder's output; if the change is "
        "intended, run `python -m tests.unit.kubernetes.update_golden` and review the diff"
    )


def test_labels_and_annotations_reach_the_pods_through_runtime_patches():
    built = manifests.build_trainjob(
        BASIC, namespace="ml", runtime=WITH_INITIALIZERS, settings=manifests.Settings()
    )
    (patch,) = built["spec"]["runtimePatches"]
    assert patch["manager"] == "tuneloop.io/orchestrator"
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert [job["name"] for job in jobs] == ["dataset-initializer", "model-initializer", "node"]
    for job in jobs:
        pod = job["template"]["spec"]["template"]["metadata"]
        assert pod["labels"] == built["metadata"]["labels"]
        assert pod["annotations"] == built["metadata"]["annotations"]


def test_initializers_are_used_only_for_uris_they_understand():
    built = manifests.build_trainjob(
        BASIC, namespace="ml", runtime=WITH_INITIALIZERS, settings=manifests.Settings()
    )
    assert "initializer" not in built["spec"]  # a model name and a file:// dataset


def test_initializers_are_skipped_when_the_runtime_has_none():
    request, _, build_settings = CASES["gpu-initializers-deadline"]
    built = manifests.build_trainjob(
        request, namespace="ml", runtime=TORCH, settings=build_settings
    )
    assert "initializer" not in built["spec"]
    args = built["spec"]["trainer"]["args"]
    assert args[args.index("--dataset") + 1] == "s3://datasets/model-b/"


@pytest.mark.parametrize(
    "name",
    ["Ft-upper", "ft_underscore", "9starts-with-digit", "ends-with-dash-", "x" * 34, ""],
    ids=["upper", "underscore", "digit", "dash", "too-long", "empty"],
)
def test_a_name_that_cannot_be_a_trainjob_is_rejected(name):
    request = TrainingRequest(**{**_fields(BASIC), "name": name})
    with pytest.raises(JobRejectedError) as error:
        manifests.build_trainjob(
            request, namespace="ml", runtime=TORCH, settings=manifests.Settings()
        )
    assert error.value.reason == "InvalidName"


def _fields(request):
    return {f: getattr(request, f) for f in request.__dataclass_fields__}


def test_causing_ids_keep_the_newest_and_count_the_rest():
    text, omitted = manifests.causing_ids_annotation(("a" * 10, "b" * 10, "c" * 10), 30)
    assert json.loads(text) == ["b" * 10, "c" * 10]
    assert omitted == 1


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@given(st.text(max_size=200))
def test_label_values_are_always_valid_and_stable(text):
    value = manifests.label_value(text)
    assert len(value) <= 63
    assert _LABEL_VALUE.match(value)
    assert manifests.label_value(text) == value


@settings(max_examples=60, deadline=None)
@given(requests, runtimes)
def test_every_trainjob_keeps_the_trainer_api_rules(request, runtime):
    built = manifests.build_trainjob(
        request, namespace="ns", runtime=runtime, settings=manifests.Settings()
    )
    again = manifests.build_trainjob(
        request, namespace="ns", runtime=runtime, settings=manifests.Settings()
    )
    assert built == again  # deterministic
    assert built["metadata"]["name"] == request.name
    trainer = built["spec"]["trainer"]
    assert not [e for e in trainer["env"] if e["name"].startswith("PET_")]
    assert len(trainer["args"]) <= 128
    names = trainer["args"][::2]  # `--name value` argv items, never a shell string
    assert all(name.startswith("--") for name in names)
    assert len(trainer["args"]) == 2 * len(names)
    for value in built["metadata"]["labels"].values():
        assert len(value) <= 63
        assert _LABEL_VALUE.match(value)
    annotations = built["metadata"]["annotations"]
    assert sum(len(k) + len(v.encode()) for k, v in annotations.items()) < 256 * 1024
    kept = json.loads(annotations[manifests.CAUSING_EVENT_IDS])
    omitted = int(annotations.get(manifests.CAUSING_EVENT_IDS_OMITTED, "0"))
    assert len(kept) + omitted == len(request.causing_event_ids)
    assert tuple(kept) == request.causing_event_ids[len(request.causing_event_ids) - len(kept) :]

"""A TrainJob of a rule with `promote:` hands the trainer its champion and carries the policy
and the champion as annotations, from which a worker with no record of the job reads them back."""

from __future__ import annotations

import dataclasses
import json

from orchestrator.jobs.promotion import Mode, PromotionPolicy
from runtimes.kubernetes import manifests, results
from tests.unit.kubernetes.golden_cases import BASIC, TORCH

POLICY = PromotionPolicy(metric="token_accuracy", mode=Mode.MAX, min_delta=0.02)
CHAMPION = "s3://adapters/ft-drift-model-a-1111aaaa"


def build(request):
    return manifests.build_trainjob(
        request, namespace="ml", runtime=TORCH, settings=manifests.Settings()
    )


def argument(trainjob, name):
    args = trainjob["spec"]["trainer"]["args"]
    return args[args.index(name) + 1] if name in args else None


def test_the_trainer_is_given_the_champion_to_compare_with():
    built = build(dataclasses.replace(BASIC, promotion=POLICY, champion_uri=CHAMPION))

    assert argument(built, "--champion-uri") == CHAMPION
    annotations = built["metadata"]["annotations"]
    assert json.loads(annotations["tuneloop.io/promotion"]) == {
        "metric": "token_accuracy",
        "mode": "max",
        "min_delta": 0.02,
    }
    assert annotations["tuneloop.io/champion"] == CHAMPION


def test_the_first_job_of_a_gated_rule_has_a_policy_but_no_champion():
    built = build(dataclasses.replace(BASIC, promotion=POLICY))

    assert argument(built, "--champion-uri") is None
    assert "tuneloop.io/promotion" in built["metadata"]["annotations"]
    assert "tuneloop.io/champion" not in built["metadata"]["annotations"]


def test_a_rule_without_promote_adds_nothing():
    built = build(BASIC)

    assert argument(built, "--champion-uri") is None
    assert not {"tuneloop.io/promotion", "tuneloop.io/champion"} & set(
        built["metadata"]["annotations"]
    )


def test_the_policy_and_the_champion_are_read_back_from_the_trainjob():
    built = build(dataclasses.replace(BASIC, promotion=POLICY, champion_uri=CHAMPION))

    context = results.context_of_trainjob(built)

    assert context is not None
    assert context.promotion == POLICY
    assert context.champion_uri == CHAMPION


def test_an_unreadable_policy_annotation_reads_as_no_policy():
    built = build(dataclasses.replace(BASIC, promotion=POLICY))
    built["metadata"]["annotations"]["tuneloop.io/promotion"] = "{not json"

    context = results.context_of_trainjob(built)

    assert context is not None
    assert context.promotion is None

"""A TrainJob of a rule with `promote:` hands the trainer its champion and carries the policy
and the champion as annotations, from which a worker with no record of the job reads them back."""

from __future__ import annotations

import dataclasses
import json

from orchestrator.jobs.promotion import Mode, PromotionPolicy, Verdict, decide
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


def finished_with(trainer_metrics):
    built = build(dataclasses.replace(BASIC, promotion=POLICY, champion_uri=CHAMPION))
    built["status"] = {"trainerStatus": {"progressPercentage": 100, "metrics": trainer_metrics}}
    return built


def test_the_scores_in_trainer_status_come_back_as_numbers_for_the_gate():
    obj = finished_with(
        [
            {"name": "adapter_uri", "value": "s3://adapters/ft-drift-model-a-3f9c2e1b"},
            {"name": "token_accuracy", "value": "0.75"},
            {"name": "champion_token_accuracy", "value": "0.5"},
        ]
    )

    result = results.result_of(obj)
    context = results.context_of_trainjob(obj)
    assert context is not None
    assert context.promotion is not None
    decision = decide(
        context.promotion,
        adapter_uri=result.adapter_uri,
        metrics=result.metrics,
        evaluated_champion=context.champion_uri,
        current_champion=CHAMPION,
    )

    assert (decision.candidate, decision.champion) == (0.75, 0.5)
    assert decision.verdict is Verdict.BETTER


def test_why_the_champion_could_not_be_scored_comes_back_as_text_and_keeps_it():
    obj = finished_with(
        [
            {"name": "adapter_uri", "value": "s3://adapters/ft-drift-model-a-3f9c2e1b"},
            {"name": "token_accuracy", "value": "0.75"},
            {"name": "champion_error", "value": "no complete published adapter at s3://adap"},
        ]
    )

    result = results.result_of(obj)
    decision = decide(
        POLICY,
        adapter_uri=result.adapter_uri,
        metrics=result.metrics,
        evaluated_champion=CHAMPION,
        current_champion=CHAMPION,
    )

    assert result.metrics["champion_error"] == "no complete published adapter at s3://adap"
    assert decision.verdict is Verdict.CHAMPION_ERROR

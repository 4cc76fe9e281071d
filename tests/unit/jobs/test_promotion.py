"""The promotion gate decides from a hand-written table of cases: scores, champions, deltas."""

from __future__ import annotations

import math

import pytest

from orchestrator.jobs.promotion import (
    METRICS,
    Mode,
    PromotionDecision,
    PromotionPolicy,
    Verdict,
    decide,
    scores,
)

CANDIDATE = "s3://adapters/ft-new"
CHAMPION = "s3://adapters/ft-old"
OTHER = "s3://adapters/ft-other"

LOSS = PromotionPolicy()
LOSS_BY_A_HUNDREDTH = PromotionPolicy(min_delta=0.01)
ACCURACY = PromotionPolicy(metric="token_accuracy", mode=Mode.MAX, min_delta=0.05)
PERPLEXITY = PromotionPolicy(metric="perplexity", mode=Mode.MIN)

# (case, policy, adapter, metrics, champion at launch, champion now) -> (verdict, cand, champ)
CASES = [
    (
        "the first adapter, with no champion, is promoted",
        LOSS,
        CANDIDATE,
        {"eval_loss": 1.5},
        None,
        None,
        (Verdict.NO_CHAMPION, 1.5, None),
    ),
    (
        "a lower loss than the champion's is promoted",
        LOSS,
        CANDIDATE,
        {"eval_loss": 1.25, "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.BETTER, 1.25, 1.5),
    ),
    (
        "a higher loss than the champion's is declined",
        LOSS,
        CANDIDATE,
        {"eval_loss": 1.75, "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.NOT_BETTER, 1.75, 1.5),
    ),
    (
        "an equal loss is a tie, which keeps the champion",
        LOSS,
        CANDIDATE,
        {"eval_loss": 1.5, "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.TIE, 1.5, 1.5),
    ),
    (
        "a gain smaller than min_delta is declined",
        LOSS_BY_A_HUNDREDTH,
        CANDIDATE,
        {"eval_loss": 1.495, "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.NOT_BETTER, 1.495, 1.5),
    ),
    (
        "a gain of exactly min_delta is not more than it: declined",
        PromotionPolicy(min_delta=0.25),
        CANDIDATE,
        {"eval_loss": 1.25, "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.NOT_BETTER, 1.25, 1.5),
    ),
    (
        "a gain larger than min_delta is promoted",
        LOSS_BY_A_HUNDREDTH,
        CANDIDATE,
        {"eval_loss": 1.25, "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.BETTER, 1.25, 1.5),
    ),
    (
        "with mode max, a higher accuracy by more than min_delta is promoted",
        ACCURACY,
        CANDIDATE,
        {"token_accuracy": 0.75, "champion_token_accuracy": 0.5},
        CHAMPION,
        CHAMPION,
        (Verdict.BETTER, 0.75, 0.5),
    ),
    (
        "with mode max, a lower accuracy is declined",
        ACCURACY,
        CANDIDATE,
        {"token_accuracy": 0.5, "champion_token_accuracy": 0.75},
        CHAMPION,
        CHAMPION,
        (Verdict.NOT_BETTER, 0.5, 0.75),
    ),
    (
        "the gate reads only its own metric (here perplexity, not the loss)",
        PERPLEXITY,
        CANDIDATE,
        {
            "eval_loss": 9.0,
            "perplexity": 4.0,
            "champion_eval_loss": 1.0,
            "champion_perplexity": 8.0,
        },
        CHAMPION,
        CHAMPION,
        (Verdict.BETTER, 4.0, 8.0),
    ),
    (
        "a candidate without the metric is declined, even with no champion",
        LOSS,
        CANDIDATE,
        {"train_loss_last": 0.5},
        None,
        None,
        (Verdict.METRIC_MISSING, None, None),
    ),
    (
        "a candidate whose metric is not a number is declined",
        LOSS,
        CANDIDATE,
        {"eval_loss": "0.5", "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.METRIC_MISSING, None, 1.5),
    ),
    (
        "a candidate whose metric is NaN is declined",
        LOSS,
        CANDIDATE,
        {"eval_loss": math.nan, "champion_eval_loss": 1.5},
        CHAMPION,
        CHAMPION,
        (Verdict.METRIC_MISSING, None, 1.5),
    ),
    (
        "a champion without the metric is kept",
        LOSS,
        CANDIDATE,
        {"eval_loss": 0.1},
        CHAMPION,
        CHAMPION,
        (Verdict.METRIC_MISSING, 0.1, None),
    ),
    (
        "a champion the trainer could not evaluate is kept",
        LOSS,
        CANDIDATE,
        {"eval_loss": 0.1, "champion_error": "no adapter_config.json at s3://adapters/ft-old"},
        CHAMPION,
        CHAMPION,
        (Verdict.CHAMPION_ERROR, 0.1, None),
    ),
    (
        "a champion that changed while the job ran voids the comparison",
        LOSS,
        CANDIDATE,
        {"eval_loss": 0.1, "champion_eval_loss": 1.5},
        CHAMPION,
        OTHER,
        (Verdict.CHAMPION_CHANGED, 0.1, 1.5),
    ),
    (
        "a champion that appeared while the first job ran voids its promotion",
        LOSS,
        CANDIDATE,
        {"eval_loss": 0.1},
        None,
        OTHER,
        (Verdict.CHAMPION_CHANGED, 0.1, None),
    ),
    (
        "a job that reported no adapter has nothing to promote",
        LOSS,
        None,
        {"eval_loss": 0.1},
        None,
        None,
        (Verdict.NO_ADAPTER, None, None),
    ),
]


@pytest.mark.parametrize(
    ("policy", "adapter", "metrics", "at_launch", "now", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_gate_decides_each_case_of_the_table(
    policy, adapter, metrics, at_launch, now, expected
):
    verdict = expected[0]
    decision = decide(
        policy,
        adapter_uri=adapter,
        metrics=metrics,
        evaluated_champion=at_launch,
        current_champion=now,
    )
    assert (decision.verdict, decision.candidate, decision.champion) == expected
    assert decision.promoted is (verdict in (Verdict.NO_CHAMPION, Verdict.BETTER))
    assert decision.champion_uri == at_launch
    assert decision.candidate_uri == adapter
    assert decision.policy == policy


def test_the_reasons_name_the_scores_and_the_rule_applied():
    better = decide(
        LOSS_BY_A_HUNDREDTH,
        adapter_uri=CANDIDATE,
        metrics={"eval_loss": 1.25, "champion_eval_loss": 1.5},
        evaluated_champion=CHAMPION,
        current_champion=CHAMPION,
    )
    assert better.reason == (
        "eval_loss 1.25 against the champion's 1.5: better by 0.25, more than min_delta 0.01"
    )
    first = decide(
        LOSS,
        adapter_uri=CANDIDATE,
        metrics={"eval_loss": 2.0},
        evaluated_champion=None,
        current_champion=None,
    )
    assert first.reason == "no champion yet: the first adapter is promoted (eval_loss 2)"
    broken = decide(
        LOSS,
        adapter_uri=CANDIDATE,
        metrics={"eval_loss": 0.1, "champion_error": "HTTP 403"},
        evaluated_champion=CHAMPION,
        current_champion=CHAMPION,
    )
    assert "could not be evaluated (HTTP 403)" in broken.reason


def test_a_policy_for_a_metric_takes_its_usual_direction():
    assert PromotionPolicy.for_metric("token_accuracy").mode is Mode.MAX
    assert PromotionPolicy.for_metric("perplexity").mode is Mode.MIN
    assert PromotionPolicy.for_metric().metric == "eval_loss"
    assert set(METRICS) == {"eval_loss", "perplexity", "token_accuracy"}


@pytest.mark.parametrize(
    "bad",
    [
        ({"metric": "bleu"}, "unknown promotion metric 'bleu'"),
        ({"min_delta": -0.1}, "min_delta must be a finite number >= 0"),
        ({"min_delta": math.inf}, "min_delta must be a finite number >= 0"),
    ],
)
def test_a_policy_refuses_what_no_rule_file_can_say(bad):
    fields, message = bad
    with pytest.raises(ValueError, match=message):
        PromotionPolicy(**fields)


def test_a_decision_reads_back_from_its_json_as_it_was():
    decision = PromotionDecision(
        policy=ACCURACY,
        verdict=Verdict.NOT_BETTER,
        reason="token_accuracy 0.5 against the champion's 0.75: worse",
        candidate=0.5,
        champion=0.75,
        champion_uri=CHAMPION,
        candidate_uri=CANDIDATE,
    )
    written = decision.to_json()
    assert written == {
        "metric": "token_accuracy",
        "mode": "max",
        "min_delta": 0.05,
        "candidate": 0.5,
        "champion": 0.75,
        "champion_uri": CHAMPION,
        "candidate_uri": CANDIDATE,
        "verdict": "not-better",
        "reason": "token_accuracy 0.5 against the champion's 0.75: worse",
    }
    assert PromotionDecision.from_json(written) == decision


def test_the_scores_kept_with_a_champion_are_its_finite_gate_metrics():
    metrics = {"eval_loss": 1.5, "perplexity": math.inf, "token_accuracy": 1, "steps": 3}
    assert scores(metrics) == {"eval_loss": 1.5, "token_accuracy": 1.0}


def test_every_verdict_is_a_reason_an_audit_record_can_carry():
    from orchestrator.ledger import Reason

    assert {verdict.value for verdict in Verdict} <= {reason.value for reason in Reason}

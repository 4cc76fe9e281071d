"""A rule's `promote:` block: what it means, its defaults, and the problems `check` reports."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.jobs.promotion import Mode, PromotionPolicy
from orchestrator.rules.parsing import RuleFileError, Source, parse_files

RULE = """\
rules:
  - name: r
    on: {{type: io.tuneloop.drift.detected.v1}}
    key: event.data.model_id
    launch:
      runtime: rt
      base_model: m
      dataset: d
{launch}
"""


def parse(launch: str):
    text = RULE.format(launch=textwrap.indent(textwrap.dedent(launch), "      "))
    return parse_files([Source("f.yaml", text)]).rules[0]


def problems(launch: str) -> list[str]:
    with pytest.raises(RuleFileError) as caught:
        parse(launch)
    return [str(problem) for problem in caught.value.problems]


def test_a_rule_without_promote_has_no_promotion_step():
    assert parse("").launch.promote is None


def test_an_empty_promote_block_takes_the_defaults():
    assert parse("promote: {}").launch.promote == PromotionPolicy(
        metric="eval_loss", mode=Mode.MIN, min_delta=0.0
    )


def test_every_field_of_promote_is_read():
    policy = parse("promote: {metric: perplexity, mode: min, min_delta: 0.01}").launch.promote
    assert policy == PromotionPolicy(metric="perplexity", mode=Mode.MIN, min_delta=0.01)


def test_a_metric_without_a_mode_is_judged_in_its_usual_direction():
    assert parse("promote: {metric: token_accuracy}").launch.promote.mode is Mode.MAX
    assert parse("promote: {metric: token_accuracy, mode: min}").launch.promote.mode is Mode.MIN


def test_a_whole_number_delta_is_a_float():
    assert parse("promote: {min_delta: 1}").launch.promote.min_delta == 1.0


def test_defaults_can_turn_promotion_on_for_every_rule():
    text = """\
defaults:
  launch:
    promote: {min_delta: 0.05}
rules:
  - name: r
    on: {type: io.tuneloop.drift.detected.v1}
    launch: {runtime: rt, base_model: m, dataset: d, promote: {metric: perplexity}}
  - name: s
    on: {type: io.tuneloop.drift.detected.v1}
    launch: {runtime: rt, base_model: m, dataset: d}
"""
    first, second = parse_files([Source("f.yaml", text)]).rules
    assert first.launch.promote == PromotionPolicy(metric="perplexity", min_delta=0.05)
    assert second.launch.promote == PromotionPolicy(min_delta=0.05)


def test_adding_promote_changes_the_rule_version():
    assert parse("").version != parse("promote: {}").version


@pytest.mark.parametrize(
    ("launch", "expected"),
    [
        (
            "promote: {metric: bleu}",
            "f.yaml:9:25: promote.metric must be one of eval_loss, perplexity, token_accuracy, "
            "got 'bleu'",
        ),
        (
            "promote: {metric: eval_los}",
            "f.yaml:9:25: promote.metric must be one of eval_loss, perplexity, token_accuracy, "
            "got 'eval_los' (did you mean 'eval_loss'?)",
        ),
        (
            "promote: {mode: lowest}",
            "f.yaml:9:23: promote.mode must be min or max, got 'lowest'",
        ),
        (
            "promote: {min_delta: -0.1}",
            "f.yaml:9:28: promote.min_delta must be a number ≥ 0 (how much better than the "
            "champion a candidate must be), got -0.1",
        ),
        (
            "promote: {min_delta: a lot}",
            "f.yaml:9:28: promote.min_delta must be a number ≥ 0 (how much better than the "
            "champion a candidate must be), got 'a lot'",
        ),
        (
            "promote: {metric: eval_loss, margin: 0.1}",
            "f.yaml:9:36: unknown key 'margin' in promote",
        ),
        (
            "promote: true",
            "f.yaml:9:16: promote must be a mapping such as {metric: eval_loss, mode: min, "
            "min_delta: 0.01} ({} takes the defaults)",
        ),
        (
            "training: {eval_fraction: 0}\npromote: {}",
            "f.yaml:10:16: promote needs evaluation, but training.eval_fraction 0 holds no "
            "example out: raise it, or drop promote",
        ),
    ],
)
def test_a_bad_promote_block_is_reported_where_it_is(launch, expected):
    assert problems(launch) == [expected]

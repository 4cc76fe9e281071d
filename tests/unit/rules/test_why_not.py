"""Why-not records: a rule that names an event's type says why it did not consider the event,
and a noisy producer cannot make one rule write more than its limit per minute."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from orchestrator.jobs.model import TraceContext
from orchestrator.ledger import Outcome, Reason
from orchestrator.rules import engine, matching, why_not
from tests.unit.rules.builders import DATA, DRIFT, LAUNCH, arrived, at, drift, rules_from

RULES = rules_from(
    f"""
    rules:
      - name: from-monitors
        on: {{type: {DRIFT}, source: "/monitors/*"}}
        key: event.data.model_id
        {LAUNCH.strip().replace(chr(10), chr(10) + "        ")}
      - name: big-drift
        on: {{type: {DRIFT}, where: "event.data.value > 0.9"}}
        key: event.data.model_id
        {LAUNCH.strip().replace(chr(10), chr(10) + "        ")}
      - name: by-region
        on: {{type: {DRIFT}}}
        key: event.data.region
        {LAUNCH.strip().replace(chr(10), chr(10) + "        ")}
    """
)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def outcomes(records):
    return [(r.rule, r.outcome, r.reason) for r in records]


def test_each_rule_that_names_the_type_says_why_it_did_not_consider_the_event():
    event = replace(drift(1, 0, value=0.5), source="/elsewhere")
    records = engine.why_not(RULES, event, now=at(1))
    assert outcomes(records) == [
        ("by-region", Outcome.ERROR, Reason.EXPRESSION_ERROR),
        ("from-monitors", Outcome.IGNORE, Reason.SOURCE_MISMATCH),
        ("big-drift", Outcome.IGNORE, Reason.WHERE_FALSE),
    ]
    by_rule = {r.rule: r for r in records}
    assert "'/elsewhere'" in by_rule["from-monitors"].message
    assert "'/monitors/*'" in by_rule["from-monitors"].message
    assert "event.data.value > 0.9" in by_rule["big-drift"].message
    assert all(r.key == "" and r.event_ids == ("d1",) for r in records)


def test_a_rule_that_considered_the_event_writes_no_why_not_record():
    event = drift(1, 0, value=0.95, region="eu")
    assert engine.why_not(RULES, event, now=at(1)) == ()


def test_an_event_of_a_type_no_rule_names_has_no_why_not_records():
    event = replace(drift(1, 0), type="io.example.unrelated.v1")
    assert engine.why_not(RULES, event, now=at(1)) == ()


def test_why_not_records_carry_the_events_trace_context():
    event = replace(drift(1, 0, region="eu"), extensions={"traceparent": TRACEPARENT})
    (record,) = engine.why_not(RULES, event, now=at(1))
    assert record.trace == TraceContext(TRACEPARENT)


def takes(
    state: why_not.WhyNotLimit, rules_and_seconds: list[tuple[str, float]]
) -> tuple[why_not.WhyNotLimit, list[int | None]]:
    """What `take` answers for records of these rules at these seconds, in order."""
    answers = []
    for rule, second in rules_and_seconds:
        state, left_out = why_not.take(state, rule, at(0) + timedelta(seconds=second))
        answers.append(left_out)
    return state, answers


def test_a_rule_writes_at_most_its_limit_per_minute_and_the_next_record_counts_the_rest():
    state, first = takes(why_not.WhyNotLimit(per_minute=2), [("r", n) for n in range(5)])
    # None: left out; a number: written, with how many were left out before it
    assert first == [0, 0, None, None, None]
    _, later = takes(state, [("r", 61)])
    assert later == [3]


def test_each_rule_has_its_own_limit():
    _, answers = takes(why_not.WhyNotLimit(per_minute=1), [("a", 1), ("b", 2), ("a", 3)])
    assert answers == [0, 0, None]


def test_an_event_older_than_the_minute_being_counted_counts_against_that_minute():
    state, _ = takes(why_not.WhyNotLimit(per_minute=1), [("r", 70)])
    _, answers = takes(state, [("r", 5)])
    assert answers == [None]


@pytest.mark.parametrize("per_minute", [1, 3], ids=["one", "three"])
def test_the_same_records_in_the_same_order_are_limited_the_same_way(per_minute):
    records = [("r", n * 7) for n in range(24)]
    once = takes(why_not.WhyNotLimit(per_minute=per_minute), records)
    again = takes(why_not.WhyNotLimit(per_minute=per_minute), records)
    assert once == again
    written = [answer for answer in once[1] if answer is not None]
    assert len(written) == 3 * per_minute  # seconds 0..161: three minutes of event time


def test_the_worker_builds_only_the_records_the_limit_lets_through():
    def turned_away(n: int, minute: float):  # by big-drift's `where` only (value <= 0.9)
        return drift(n, minute, value=0.5, region="eu")

    limit = why_not.WhyNotLimit(per_minute=1)
    limit, first = engine.why_not_written(RULES, limit, turned_away(1, 0), now=at(0))
    limit, second = engine.why_not_written(RULES, limit, turned_away(2, 0.2), now=at(0.2))
    limit, third = engine.why_not_written(RULES, limit, turned_away(3, 0.4), now=at(0.4))
    _, next_minute = engine.why_not_written(RULES, limit, turned_away(4, 1.2), now=at(1.2))
    assert [(r.rule, r.event_ids) for r in first] == [("big-drift", ("d1",))]
    assert (second, third) == ((), ())
    assert [(r.event_ids, r.suppressed) for r in next_minute] == [(("d4",), 2)]
    # a written record is the one `why_not` writes out, with its count of the left out
    (unlimited,) = engine.why_not(RULES, turned_away(4, 1.2), now=at(1.2))
    assert next_minute == (replace(unlimited, suppressed=2),)


JOINED = rules_from(
    f"""
    rules:
      - name: drift-and-data
        on: {{type: {DRIFT}, sources: ["/monitors/*", "/canary/*"]}}
        key: event.data.model_id
        join:
          - {{type: {DATA}, key: event.data.model_id, within: 1h, source: "/ingest"}}
        {LAUNCH.strip().replace(chr(10), chr(10) + "        ")}
    """
)


def test_an_event_a_join_takes_leaves_no_why_not_record():
    assert engine.route(JOINED, arrived(1, 0))  # from /ingest: the join takes it
    assert engine.why_not(JOINED, arrived(1, 0), now=at(1)) == ()


def test_a_join_that_refuses_the_source_says_so_with_its_own_glob():
    (record,) = engine.why_not(JOINED, replace(arrived(1, 0), source="/x"), now=at(1))
    assert (record.outcome, record.reason) == (Outcome.IGNORE, Reason.SOURCE_MISMATCH)
    assert record.message == "source '/x' matches none of the rule's sources ('/ingest')"


def test_a_source_mismatch_names_every_glob_of_the_way_in():
    (record,) = engine.why_not(JOINED, replace(drift(1, 0), source="/x"), now=at(1))
    assert record.message == (
        "source '/x' matches none of the rule's sources ('/monitors/*', '/canary/*')"
    )


@pytest.mark.parametrize(
    "event",
    [
        replace(drift(1, 0, value=0.5), source="/elsewhere"),
        drift(2, 0, value=0.95, region="eu"),
        drift(3, 0, value=0.95),
    ],
    ids=["turned-away", "considered-by-all", "unkeyable"],
)
def test_the_why_not_pass_finds_the_same_matches_as_routing(event):
    found, _ = matching.examine(RULES, event, time=at(0))
    assert found == matching.matches(RULES, event, time=at(0))


def test_take_tells_before_a_record_is_built_whether_it_is_written_and_what_it_counts():
    state = why_not.WhyNotLimit(per_minute=2)
    answers = []
    for second in (0, 1, 2, 3, 61, 62, 63):
        state, left_out = why_not.take(state, "r", at(0) + timedelta(seconds=second))
        answers.append(left_out)
    # None: left out; a number: written, with how many were left out before it
    assert answers == [0, 0, None, None, 2, 0, None]


def test_the_reasons_are_the_records_not_yet_built():
    event = replace(drift(1, 0, value=0.5), source="/elsewhere")
    reasons = engine.why_not_reasons(RULES, event, now=at(1))
    assert [(w.rule.name, w.outcome, w.reason) for w in reasons] == [
        ("by-region", Outcome.ERROR, Reason.EXPRESSION_ERROR),
        ("from-monitors", Outcome.IGNORE, Reason.SOURCE_MISMATCH),
        ("big-drift", Outcome.IGNORE, Reason.WHERE_FALSE),
    ]
    record = engine.why_not_record(RULES, event, reasons[2], now=at(1), suppressed=4)
    assert (record.rule, record.key, record.event_ids, record.suppressed) == (
        "big-drift",
        "",
        ("d1",),
        4,
    )
    assert "event.data.value > 0.9" in record.message

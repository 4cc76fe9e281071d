"""Behaviour of the rule engine, one semantic at a time, through its public functions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.events import CloudEvent
from orchestrator.jobs.naming import is_valid_job_name
from orchestrator.ledger import DecisionRecord, Outcome, Reason
from orchestrator.rules import engine
from orchestrator.rules.engine import JobFinished, KeyState, Route
from orchestrator.rules.model import RuleSet
from orchestrator.rules.simulation import simulate
from tests.unit.rules.builders import DATA, arrived, at, drift, one_rule, rules_from


def feed(
    rules: RuleSet,
    events: list[CloudEvent],
    *,
    state: KeyState | None = None,
    key: str = "m1",
    lag: float = 0.0,
) -> tuple[KeyState, list[DecisionRecord]]:
    """Evaluate each event at its own time (+ lag minutes) for *key*."""
    records: list[DecisionRecord] = []
    for event in events:
        assert event.time is not None
        state, out = engine.evaluate(
            rules, state, event, key=key, now=event.time + timedelta(minutes=lag)
        )
        records += out
    assert state is not None
    return state, records


def outcomes(records: list[DecisionRecord]) -> list[tuple[str, str | None]]:
    return [(r.outcome.value, r.reason.value if r.reason else None) for r in records]


def test_events_below_the_count_accumulate_and_the_last_one_launches():
    rules = one_rule("count: 3\nwindow: 1h\n")
    _, records = feed(rules, [drift(1, 0), drift(2, 10), drift(3, 20)])
    assert outcomes(records) == [("accumulate", None), ("accumulate", None), ("launch", None)]
    launch = records[-1]
    assert launch.event_ids == ("d1", "d2", "d3")
    assert launch.job is not None
    assert launch.job.dataset == "s3://data/m1.jsonl"
    assert launch.job.model_id == "m1"
    assert launch.job.name == launch.job_name
    assert is_valid_job_name(launch.job.name)
    assert launch.job.decision_id == launch.decision_id


def test_rule_outside_window_does_not_match():
    rules = one_rule("count: 2\nwindow: 30m\n")
    _, records = feed(rules, [drift(1, 0), drift(2, 31)])
    assert outcomes(records) == [("accumulate", None), ("accumulate", None)]
    assert records[-1].window_count == 1


def test_launch_consumes_the_window_so_the_next_launch_needs_fresh_events():
    rules = one_rule("count: 2\nwindow: 1h\nconcurrency: replace\n")
    _, records = feed(rules, [drift(1, 0), drift(2, 1), drift(3, 2), drift(4, 3)])
    launches = [r for r in records if r.outcome is Outcome.LAUNCH]
    assert [r.event_ids for r in launches] == [("d1", "d2"), ("d3", "d4")]
    assert launches[0].job_name != launches[1].job_name


def test_where_filters_events_and_source_glob_keeps_out_strangers():
    rules = rules_from("""
        rules:
          - name: r
            on:
              type: io.tuneloop.drift.detected.v1
              source: "/monitors/*"
              where: "event.data.value > event.data.threshold"
            key: event.data.model_id
            launch: {runtime: rt, base_model: m, dataset: d}
    """)
    low = drift(1, 0, value=0.1)
    stranger = CloudEvent(
        id="x",
        source="/laptop",
        type=drift(2, 0).type,
        time=at(0),
        data={"model_id": "m1", "value": 1, "threshold": 0},
    )
    assert engine.route(rules, low) == ()
    assert engine.route(rules, stranger) == ()
    assert engine.route(rules, drift(3, 0)) == (Route("r", "m1"),)


def test_a_missing_field_in_where_is_an_error_record_not_a_silent_drop():
    rules = one_rule("count: 1\n", header="")
    rules = rules_from("""
        rules:
          - name: r
            on: {type: io.tuneloop.drift.detected.v1, where: "event.data.score > 1"}
            key: event.data.model_id
            launch: {runtime: rt, base_model: m, dataset: d}
    """)
    event = drift(1, 0)
    assert engine.route(rules, event) == ()
    [record] = engine.routing_errors(rules, event, now=at(0))
    assert record.outcome is Outcome.ERROR
    assert record.reason is Reason.EXPRESSION_ERROR
    assert "score" in record.message


def test_join_waits_for_the_other_event_type_and_fires_when_it_arrives():
    rules = one_rule(
        "count: 2\nwindow: 1h\njoin:\n  - {type: "
        + DATA
        + ", key: event.data.model_id, within: 2h}\n",
        launch="""
launch:
  runtime: rt
  base_model: m
  dataset: "${ joined['io.tuneloop.data.arrived.v1'].data.uri }"
""",
    )
    _, records = feed(rules, [drift(1, 0), drift(2, 5), arrived(1, 10)])
    assert outcomes(records) == [
        ("accumulate", None),
        ("accumulate", "join-missing"),
        ("launch", None),
    ]
    assert records[-1].job is not None
    assert records[-1].job.dataset == "s3://data/m1/1.jsonl"
    assert records[-1].event_ids == ("d1", "d2", "a1")


def test_join_older_than_within_does_not_count():
    rules = one_rule("count: 1\nwindow: 1d\njoin:\n  - {type: " + DATA + ", within: 1h}\n")
    _, records = feed(rules, [arrived(1, 0), drift(1, 61)])
    assert outcomes(records) == [("accumulate", "joined"), ("accumulate", "join-missing")]


def test_cooldown_suppresses_and_keeps_the_window():
    rules = one_rule("count: 1\ncooldown: 1h\nconcurrency: replace\n")
    _, records = feed(rules, [drift(1, 0), drift(2, 30), drift(3, 61)])
    assert outcomes(records) == [
        ("launch", None),
        ("suppress", "cooldown"),
        ("cancel", "replaced"),
        ("launch", None),
    ]
    assert records[-1].event_ids == ("d2", "d3")


def test_forbid_suppresses_while_a_job_runs_and_releases_when_it_finishes():
    rules = one_rule("count: 1\n")
    state, records = feed(rules, [drift(1, 0), drift(2, 10)])
    assert outcomes(records) == [("launch", None), ("suppress", "concurrency")]
    finished = JobFinished("r", "m1", records[0].job_name or "", True, at(20))
    state, after = engine.observe(rules, state, finished, key="m1", now=at(20))
    assert after == ()
    _, records = feed(rules, [drift(3, 30)], state=state)
    assert outcomes(records) == [("launch", None)]
    assert records[0].event_ids == ("d2", "d3")


def test_queue_coalesces_and_starts_when_the_job_finishes():
    rules = one_rule("count: 1\nconcurrency: queue\n")
    state, records = feed(rules, [drift(1, 0), drift(2, 10), drift(3, 15)])
    assert outcomes(records) == [("launch", None), ("defer", "queued"), ("defer", "queued")]
    finished = JobFinished("r", "m1", records[0].job_name or "", True, at(20))
    _, after = engine.observe(rules, state, finished, key="m1", now=at(20))
    assert outcomes(list(after)) == [("launch", None)]
    assert after[0].event_ids == ("d2", "d3")
    assert after[0].time == at(20)


def test_replace_cancels_the_running_job_then_launches():
    rules = one_rule("count: 1\nconcurrency: replace\n")
    _, records = feed(rules, [drift(1, 0), drift(2, 10)])
    assert outcomes(records) == [("launch", None), ("cancel", "replaced"), ("launch", None)]
    assert records[1].job_name == records[0].job_name


def test_a_finish_of_an_unknown_job_changes_nothing():
    rules = one_rule("count: 1\n")
    state, records = feed(rules, [drift(1, 0)])
    stale = JobFinished("r", "m1", "some-other-job", False, at(5))
    new_state, after = engine.observe(rules, state, stale, key="m1", now=at(5))
    assert after == ()
    assert new_state.rule("r").running == records[0].job_name


def test_debounce_launches_once_the_burst_settles():
    rules = one_rule("count: 1\ndebounce: {quiet: 10m, max_wait: 1h}\n")
    state, records = feed(rules, [drift(1, 0), drift(2, 5), drift(3, 12)])
    assert outcomes(records) == [("suppress", "debounce-pending")] * 3
    assert engine.next_wakeup(state) == at(22)
    state, early = engine.tick(rules, state, key="m1", now=at(21))
    assert early == ()
    _, fired = engine.tick(rules, state, key="m1", now=at(22))
    assert outcomes(list(fired)) == [("launch", None)]
    assert fired[0].event_ids == ("d1", "d2", "d3")
    assert fired[0].time == at(22)


def test_debounce_max_wait_bounds_a_burst_that_never_settles():
    rules = one_rule("count: 1\nwindow: 2h\ndebounce: {quiet: 10m, max_wait: 30m}\n")
    events = [drift(i, i * 5) for i in range(10)]
    _, records = feed(rules, events)
    launches = [r for r in records if r.outcome is Outcome.LAUNCH]
    assert [r.time for r in launches] == [at(30)]


def test_daily_budget_defers_instead_of_dropping_and_retries():
    rules = one_rule("count: 1\nmax_launches_per_day: 1\nconcurrency: replace\n")
    state, records = feed(rules, [drift(1, 0), drift(2, 60)])
    assert outcomes(records)[-1] == ("defer", "budget")
    assert engine.next_wakeup(state) == at(24 * 60)
    _, retried = engine.tick(rules, state, key="m1", now=at(24 * 60))
    assert [r.outcome for r in retried if r.outcome is Outcome.LAUNCH] == [Outcome.LAUNCH]
    assert retried[-1].event_ids == ("d2",)


def test_shadow_mode_records_the_job_it_would_launch_but_launches_nothing():
    rules = one_rule("count: 1\nmode: shadow\n")
    state, records = feed(rules, [drift(1, 0), drift(2, 1)])
    assert outcomes(records) == [("suppress", "shadow"), ("suppress", "shadow")]
    assert records[0].job is not None
    assert state.rule("r").running is None


def test_sum_condition_counts_rows_over_the_window():
    rules = one_rule("window: 1d\nsum: {of: event.data.rows, at_least: 250}\n")
    _, records = feed(rules, [drift(1, 0, rows=100), drift(2, 5, rows=100), drift(3, 9, rows=60)])
    assert outcomes(records) == [("accumulate", None), ("accumulate", None), ("launch", None)]
    assert records[-1].window_sum == 260


def test_a_redelivered_event_is_a_duplicate_and_not_counted_twice():
    rules = one_rule("count: 2\nwindow: 1h\n")
    _, records = feed(rules, [drift(1, 0), drift(1, 0), drift(2, 5)])
    assert outcomes(records) == [("accumulate", None), ("suppress", "duplicate"), ("launch", None)]


def test_an_event_older_than_the_allowed_lateness_is_late_and_not_counted():
    rules = one_rule("count: 2\nwindow: 1h\n", header="allowed_lateness: 5m\n")
    state, _ = feed(rules, [drift(1, 30)], lag=5)
    _, late = feed(rules, [drift(2, 20)], state=state, lag=15)
    assert outcomes(late) == [("late", None)]


def test_out_of_order_events_within_lateness_are_counted_in_event_time_order():
    rules = one_rule("count: 2\nwindow: 1h\n", header="allowed_lateness: 10m\n")
    state, first = feed(rules, [drift(2, 5)], lag=0)
    assert first == []  # held until its lateness has passed
    state, second = feed(rules, [drift(1, 0)], state=state, lag=5)
    assert second == []
    _, released = engine.tick(rules, state, key="m1", now=at(15))
    assert outcomes(list(released)) == [("accumulate", None), ("launch", None)]
    assert released[0].event_ids == ("d1",)


def test_template_errors_are_recorded_and_keep_the_window():
    rules = one_rule(
        "count: 1\n",
        launch="""
launch:
  runtime: rt
  base_model: m
  dataset: "${ event.data.uri }"
""",
    )
    state, records = feed(rules, [drift(1, 0)])
    assert outcomes(records) == [("error", "template-error")]
    assert state.rule("r").entries


def test_templated_runtime_outside_the_allowlist_is_refused_at_launch():
    rules = one_rule(
        "count: 1\n",
        header="runtimes: [a, b]\n",
        launch="""
launch:
  runtime: "${ event.data.runtime }"
  base_model: m
  dataset: d
""",
    )
    _, records = feed(rules, [drift(1, 0, runtime="evil")])
    assert outcomes(records) == [("error", "template-error")]
    assert "allowlist" in records[0].message
    _, records = feed(rules, [drift(2, 0, runtime="b")])
    assert records[0].job is not None
    assert records[0].job.runtime == "b"


def test_typed_template_values_become_typed_job_settings():
    rules = one_rule(
        "count: 1\n",
        launch="""
launch:
  runtime: rt
  base_model: m
  dataset: d
  lora: {r: "${ event.data.rank }", target_modules: [q_proj]}
  training: {max_steps: 10, learning_rate: 1e-3}
  resources: {gpus_per_node: 0}
  deadline: 2h
""",
    )
    _, records = feed(rules, [drift(1, 0, rank=8)])
    job = records[0].job
    assert job is not None
    assert (job.lora.r, job.lora.target_modules) == (8, ("q_proj",))
    assert (job.training.max_steps, job.training.learning_rate) == (10, 1e-3)
    assert job.deadline_seconds == 7200
    _, bad = feed(rules, [drift(2, 0, rank="eight")])
    assert outcomes(bad) == [("error", "template-error")]


def test_state_survives_a_json_round_trip_mid_window():
    rules = one_rule(
        "count: 3\nwindow: 1h\njoin:\n  - {type: " + DATA + "}\ndebounce: {quiet: 5m}\n"
    )
    state, _ = feed(rules, [drift(1, 0), arrived(1, 1), drift(2, 2)])
    restored = KeyState.from_json(state.to_json())
    assert restored == state
    _, direct = feed(rules, [drift(3, 3)], state=state)
    _, via_json = feed(rules, [drift(3, 3)], state=restored)
    assert direct == via_json


def test_expired_state_is_dropped():
    rules = one_rule("count: 5\nwindow: 1h\n")
    state, _ = feed(rules, [drift(1, 0)])
    assert engine.next_wakeup(state) == at(60)
    state, records = engine.tick(rules, state, key="m1", now=at(61))
    assert records == ()
    assert state.rules == {}
    assert engine.next_wakeup(state) is None


def test_route_gives_each_key_once_per_rule_including_joins():
    rules = rules_from("""
        rules:
          - name: a
            on: {type: io.tuneloop.drift.detected.v1}
            key: event.data.model_id
            join: [{type: io.tuneloop.data.arrived.v1}]
            launch: {runtime: rt, base_model: m, dataset: d}
          - name: b
            on: {type: io.tuneloop.data.arrived.v1}
            key: "'all'"
            launch: {runtime: rt, base_model: m, dataset: d}
    """)
    assert engine.route(rules, arrived(1, 0)) == (Route("a", "m1"), Route("b", "all"))


def test_global_limit_is_a_check_for_the_wiring():
    rules = one_rule("count: 1\n", header="limits: {max_concurrent_jobs: 2}\n")
    assert engine.may_launch(rules, running=1)
    assert not engine.may_launch(rules, running=2)


def test_simulate_finishes_jobs_after_the_assumed_duration():
    rules = one_rule("count: 1\n")
    records = simulate(
        rules, [drift(1, 0), drift(2, 30), drift(3, 90)], assume_duration=timedelta(hours=1)
    )
    assert outcomes(list(records)) == [
        ("launch", None),
        ("suppress", "concurrency"),
        ("launch", None),
    ]


def test_a_key_state_from_elsewhere_is_refused_with_a_clear_error():
    for bad in ({"format": 99}, {"format": 1, "rules": {"r": {"entries": [[1]]}}}, []):
        with pytest.raises(ValueError, match="key state"):
            KeyState.from_json(bad)


def test_a_key_cannot_walk_a_templated_dataset_out_of_its_directory():
    rules = rules_from("""
        rules:
          - name: r
            on: {type: io.tuneloop.drift.detected.v1}
            key: event.data.model_id
            launch: {runtime: rt, base_model: m, dataset: "file:///data/${ key }.jsonl"}
    """)
    _, records = feed(rules, [drift(1, 0, model="..%2F..%2Fetc")], key="..%2F..%2Fetc")
    assert outcomes(records) == [("error", "template-error")]
    assert "'..' path segment" in records[0].message

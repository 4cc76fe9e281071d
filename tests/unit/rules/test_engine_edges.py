"""The engine's answers at its edges: keys and sums that cannot be read, and rules removed by a
reload while they still wait for a timer or a job."""

from __future__ import annotations

from orchestrator.ledger import Outcome, Reason
from orchestrator.rules import engine
from orchestrator.rules.engine import JobFinished
from tests.unit.rules.builders import at, drift, one_rule, rules_from


def test_a_key_that_is_not_a_string_is_a_routing_error_and_routes_nowhere():
    rules = rules_from("""
        rules:
          - name: r
            on: {type: io.tuneloop.drift.detected.v1}
            key: event.data.value
            launch: {runtime: rt, base_model: m, dataset: d}
    """)
    event = drift(1, 0)
    assert engine.route(rules, event) == ()
    (error,) = engine.routing_errors(rules, event, now=at(0))
    assert (error.outcome, error.reason) == (Outcome.ERROR, Reason.EXPRESSION_ERROR)
    assert error.message == "key gave 0.5, not a non-empty string"
    assert error.event_ids == ("d1",)


def test_a_key_field_the_event_lacks_is_a_routing_error_naming_the_key():
    rules = one_rule("count: 1\n")
    event = drift(1, 0)
    del event.data["model_id"]
    (error,) = engine.routing_errors(rules, event, now=at(0))
    assert error.message.startswith("key: ")
    assert "model_id" in error.message


def test_a_where_that_gives_no_bool_is_a_routing_error():
    rules = rules_from("""
        rules:
          - name: r
            on: {type: io.tuneloop.drift.detected.v1, where: event.data.model_id}
            key: event.data.model_id
            launch: {runtime: rt, base_model: m, dataset: d}
    """)
    (error,) = engine.routing_errors(rules, drift(1, 0), now=at(0))
    assert error.message == "where gave 'm1', not a bool"
    assert engine.route(rules, drift(1, 0)) == ()


def test_a_sum_of_something_not_a_number_is_an_error_and_counts_nothing():
    rules = one_rule("count: 1\nsum: {of: event.data.value, at_least: 1}\n")
    state, records = engine.evaluate(rules, None, drift(1, 0, value="high"), key="m1", now=at(0))
    (error,) = records
    assert (error.outcome, error.reason) == (Outcome.ERROR, Reason.EXPRESSION_ERROR)
    assert error.message == "sum.of gave 'high', not a number"
    _, records = engine.evaluate(rules, state, drift(2, 1, value=0.5), key="m1", now=at(1))
    assert [(r.outcome, r.window_count, r.window_sum) for r in records] == [
        (Outcome.ACCUMULATE, 1, 0.5)
    ]


def test_a_waiting_launch_of_a_removed_rule_goes_with_it_when_its_timer_falls_due():
    debounced = one_rule("count: 1\ndebounce: {quiet: 10m, max_wait: 1h}\n")
    state, records = engine.evaluate(debounced, None, drift(1, 0), key="m1", now=at(0))
    assert [r.reason for r in records] == [Reason.DEBOUNCE_PENDING]
    reloaded = rules_from("""
        rules:
          - name: other
            on: {type: io.tuneloop.data.arrived.v1}
            key: event.data.model_id
            launch: {runtime: rt, base_model: m, dataset: d}
    """)
    state, records = engine.tick(reloaded, state, key="m1", now=at(10))
    assert records == ()
    assert "r" not in state.rules
    assert engine.next_wakeup(state) is None


def test_a_removed_rule_is_remembered_while_its_job_runs_and_forgotten_after():
    rules = one_rule("count: 1\n")
    state, records = engine.evaluate(rules, None, drift(1, 0), key="m1", now=at(0))
    (launch,) = records
    assert launch.job_name is not None
    reloaded = rules_from("""
        rules:
          - name: other
            on: {type: io.tuneloop.data.arrived.v1}
            key: event.data.model_id
            launch: {runtime: rt, base_model: m, dataset: d}
    """)
    state, _ = engine.tick(reloaded, state, key="m1", now=at(2 * 24 * 60))
    assert state.rule("r").running == launch.job_name
    finished = JobFinished("r", "m1", launch.job_name, True, at(2 * 24 * 60))
    state, records = engine.observe(reloaded, state, finished, key="m1", now=at(2 * 24 * 60))
    assert records == ()
    assert "r" not in state.rules

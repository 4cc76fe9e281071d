"""The records the engine returns are plain immutable values.

A record's decision id is derived from its own fields when the engine leaves it out; it must
be the hash of those fields, and a record must compare, copy, pickle and print as a value.
"""

from __future__ import annotations

import copy
import pickle

import pytest

from orchestrator.ledger import DecisionRecord, decision_id
from orchestrator.rules import engine
from tests.unit.rules.builders import drift, one_rule

RULES = one_rule("count: 3\nwindow: 1h\nsum: {of: event.data.value, at_least: 1}\n")


def accumulated() -> DecisionRecord:
    event = drift(1, 0)
    assert event.time is not None
    _, records = engine.evaluate(RULES, None, event, key="m1", now=event.time)
    (record,) = records
    return record


def test_a_derived_decision_id_is_the_hash_of_the_record_fields():
    record = accumulated()
    expected = decision_id(
        rule_version=record.rule_version,
        key=record.key,
        outcome=record.outcome,
        reason=record.reason,
        event_ids=record.event_ids,
        time=record.time,
    )
    assert record.decision_id == expected
    assert record.decision_id == expected  # the second read gives the same


def test_an_accumulate_message_says_how_far_the_window_is():
    record = accumulated()
    assert record.message == "1 of 3 events in the 1h window, sum 0.5 of 1 in the 1h window"
    assert (record.window_count, record.window_sum) == (1, 0.5)


def test_a_record_equals_its_json_round_trip_and_its_copies():
    record = accumulated()
    restored = DecisionRecord.from_json(record.to_json())
    assert restored == record
    assert hash(restored) == hash(record)
    assert copy.copy(record) == record
    assert pickle.loads(pickle.dumps(accumulated())) == record
    assert "message='1 of 3 events" in repr(record)


def test_a_record_cannot_be_changed():
    record = accumulated()
    with pytest.raises(AttributeError):
        record.message = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        record.outcome = record.outcome  # type: ignore[misc]

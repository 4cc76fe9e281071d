"""The worker's rule-state store: a timer index, and the decoded states of busy keys."""

from __future__ import annotations

import json

from handlers.app import TableKeyStates
from orchestrator.rules import engine, state_encoding
from orchestrator.rules.engine import KeyState
from tests.unit.rules.builders import at, drift, one_rule

DEBOUNCED = one_rule("count: 1\ndebounce: {quiet: 10m, max_wait: 1h}\n")


def debounced_state(model: str) -> KeyState:
    """A key whose debounce timer falls due 10 minutes after minute 0."""
    state, _ = engine.evaluate(
        DEBOUNCED, None, drift(1, 0, model=model), key=model, now=at(0), arrived_at=at(0)
    )
    return state


def test_a_saved_key_with_a_timer_is_due_once_its_time_comes() -> None:
    states = TableKeyStates({})
    states.due(at(0))  # the first call builds the index from the (empty) table
    states.save("m1", debounced_state("m1"))
    assert states.due(at(9)) == []
    assert states.due(at(10)) == [("m1", at(10))]


def test_keys_already_in_the_table_are_found_after_a_rebalance() -> None:
    table: dict[str, object] = {"m1": state_encoding.encode(debounced_state("m1"))}
    states = TableKeyStates(table)
    assert states.due(at(10)) == [("m1", at(10))]
    table["m2"] = state_encoding.encode(debounced_state("m2"))  # recovered from the changelog
    del table["m1"]  # its partition went to another worker
    states.forget_wakeups()
    assert states.due(at(10)) == [("m2", at(10))]


def test_a_key_whose_timer_fired_and_has_none_left_is_no_longer_due() -> None:
    states = TableKeyStates({})
    states.save("m1", debounced_state("m1"))
    fired, _ = engine.tick(DEBOUNCED, debounced_state("m1"), key="m1", now=at(10))
    states.save("m1", fired)
    assert all(key != "m1" or due > at(10) for key, due in states.due(at(10)))


def test_a_key_saved_last_loads_without_decoding_its_state_again() -> None:
    states = TableKeyStates({})
    saved = debounced_state("m1")
    states.save("m1", saved)
    assert states.load("m1") is saved


def test_a_state_recovered_from_the_changelog_is_decoded_not_taken_from_memory() -> None:
    table: dict[str, object] = {}
    states = TableKeyStates(table)
    states.save("m1", debounced_state("m1"))
    fired, _ = engine.tick(DEBOUNCED, debounced_state("m1"), key="m1", now=at(10))
    table["m1"] = state_encoding.encode(fired)  # another worker's newer state, from the changelog
    assert states.load("m1") == fired


def test_only_the_most_recently_saved_keys_are_remembered() -> None:
    states = TableKeyStates({}, remembered_keys=2)
    first = debounced_state("m1")
    states.save("m1", first)
    states.save("m2", debounced_state("m2"))
    states.save("m3", debounced_state("m3"))
    assert states.load("m1") == first
    assert states.load("m1") is not first


def test_the_table_holds_each_key_s_state_as_its_compact_bytes() -> None:
    table: dict[str, object] = {}
    states = TableKeyStates(table)
    states.save("m1", debounced_state("m1"))
    assert table["m1"] == state_encoding.encode(debounced_state("m1"))


def test_a_state_an_earlier_worker_wrote_loads_and_its_timer_is_found() -> None:
    # `KeyState.to_json()` as faust's json codec wrote it, read back by the raw codec.
    written = json.dumps(debounced_state("m1").to_json(), separators=(",", ":")).encode()
    states = TableKeyStates({"m1": written})
    assert states.load("m1") == debounced_state("m1")
    assert states.due(at(10)) == [("m1", at(10))]

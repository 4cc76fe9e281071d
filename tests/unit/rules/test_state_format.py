"""Key states written by an older engine load, and go on deciding, as they did then.

The worker keeps every key's state in a changelog-backed table (`KeyState.to_json`), so a
new version reads states an old one wrote. The fixture was written by the engine before it
was split by concern (the single `engine.py`): a key with counted, summed, debounced, queued
and budgeted rules, a launch behind it, an event still held, and a second key with a join.
It holds what that engine decided next from the state (a timer, a job finishing, an event),
so a change in how the state is read shows as a changed decision.

The events a state holds (held, joined, waiting to launch) are written in the CloudEvents JSON
event format, the one the codec's structured mode writes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from orchestrator import event_json
from orchestrator.ledger import Reason
from orchestrator.rules import engine
from orchestrator.rules.engine import InputPosition, JobFinished, KeyState
from orchestrator.rules.parsing import Source, parse_files
from tests.unit.rules.builders import DRIFT, at, drift, one_rule

FIXTURE = Path(__file__).parent / "fixtures" / "key_state_written_before_the_split.json"


@pytest.fixture(scope="module")
def written() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE.read_text())
    return loaded


def test_an_old_state_loads_with_what_it_held(written: dict[str, Any]) -> None:
    state = KeyState.from_json(written["state"])
    assert state.sequence == 20
    assert state.positions == (InputPosition("drift/0", 103), InputPosition("drift/1", 7))
    assert [held.identity for held in state.buffer] == ["/monitors/eval\nd4"]
    assert [entry.event_id for entry in state.rule("counting").entries] == ["d1", "d2", "d3"]
    assert [entry.amount for entry in state.rule("counting").entries] == [2.5, 1.0, 3.0]
    debounce = state.rule("debounced").pending
    assert debounce is not None
    assert debounce.reason is Reason.DEBOUNCE_PENDING
    assert debounce.event_ids == ("d1", "d2", "d3")
    assert state.rule("queued").running is not None
    assert state.rule("queued").pending is not None
    assert "/ingest\na1" in state.rule("joining").seen
    joined = KeyState.from_json(written["joined_state"]).rule("joining").joined
    assert list(joined) == ["io.tuneloop.data.arrived.v1"]


@pytest.mark.parametrize("name", ["state", "joined_state", "final_state"])
def test_an_old_state_writes_back_exactly_as_it_was_written(
    written: dict[str, Any], name: str
) -> None:
    assert KeyState.from_json(written[name]).to_json() == written[name]


def test_an_old_state_goes_on_deciding_as_the_old_engine_did(written: dict[str, Any]) -> None:
    rules = parse_files([Source("rules.yaml", written["rules"])])
    state = KeyState.from_json(written["state"])
    state, ticked = engine.tick(rules, state, key="m1", now=at(20))
    running = state.rule("queued").running
    assert running is not None
    finished = JobFinished("queued", "m1", running, True, at(21))
    state, observed = engine.observe(rules, state, finished, key="m1", now=at(21))
    state, evaluated = engine.evaluate(
        rules,
        state,
        drift(5, 22, value=9),
        key="m1",
        now=at(30),
        sequence=21,
        position=InputPosition("drift/0", 200),
    )
    decided = [
        [record.to_json() for record in records] for records in (ticked, observed, evaluated)
    ]
    assert decided == written["after_tick_observe_evaluate"]
    assert state.to_json() == written["final_state"]


def test_a_held_event_is_stored_in_the_cloudevents_json_format() -> None:
    rules = one_rule("count: 2\nwindow: 1h\n", header="allowed_lateness: 5m\n")
    event = replace(drift(1, 0), extensions=MappingProxyType({"partitionkey": "m1"}))
    state, _ = engine.evaluate(rules, None, event, key="m1", now=at(1))
    stored = state.to_json()["buffer"][0]["event"]
    assert stored == {
        "specversion": "1.0",
        "id": "d1",
        "source": "/monitors/eval",
        "type": DRIFT,
        "time": "2026-03-01T08:00:00Z",
        "partitionkey": "m1",
        "data": {"model_id": "m1", "value": 0.5, "threshold": 0.2},
    }
    (held,) = KeyState.from_json(state.to_json()).buffer
    assert event_json.from_json(held.event) == event

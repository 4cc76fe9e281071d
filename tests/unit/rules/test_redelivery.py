"""An event the transport re-delivers behind later ones still counts; a producer's late one
does not. The delivery sequence (the keyed topic's offset) and the input position (where the
producer's record sits on the input topic) tell the two apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.events import CloudEvent
from orchestrator.ledger import Outcome
from orchestrator.rules import engine
from orchestrator.rules.engine import InputPosition, KeyState
from orchestrator.rules.parsing import Source, parse_files
from orchestrator.rules.state import KeyState as StoredKeyState

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
RULES = parse_files(
    [
        Source(
            "rules.yaml",
            """
runtimes: [torch-distributed]
rules:
  - name: drift
    on: {type: io.tuneloop.drift.detected.v1}
    key: "event.data.model_id"
    window: 1h
    count: 3
    launch: {runtime: torch-distributed, base_model: tiny, dataset: "file:///d.jsonl"}
""",
        )
    ]
)


def drift(n: int) -> CloudEvent:
    return CloudEvent(
        id=f"d{n}",
        source="/m",
        type="io.tuneloop.drift.detected.v1",
        time=T0 + timedelta(minutes=n),
        datacontenttype="application/json",
        data={"model_id": "m", "metric": "psi", "value": 1.0, "threshold": 0.5},
    )


def feed(
    state: KeyState | None,
    n: int,
    sequence: int | None,
    position: InputPosition | None = None,
) -> tuple[KeyState, list[Outcome]]:
    state, records = engine.evaluate(
        RULES,
        state,
        drift(n),
        key="m",
        now=T0 + timedelta(hours=1),
        sequence=sequence,
        position=position,
    )
    return state, [r.outcome for r in records]


def at(offset: int, partition: str = "drift/0") -> InputPosition:
    return InputPosition(partition, offset)


def test_an_event_redelivered_behind_a_later_one_is_counted_and_completes_the_window():
    state, _ = feed(None, 1, sequence=10)
    state, _ = feed(state, 3, sequence=12)
    state, outcomes = feed(state, 2, sequence=11)  # sent before d3, delivered after it
    assert outcomes == [Outcome.LAUNCH]


def test_a_late_event_from_the_producer_is_still_late():
    state, _ = feed(None, 1, sequence=10)
    state, _ = feed(state, 3, sequence=11)
    state, outcomes = feed(state, 2, sequence=12)  # sent after d3, but older
    assert outcomes == [Outcome.LATE]


def test_without_a_sequence_event_time_alone_decides():
    state, _ = feed(None, 1, sequence=None)
    state, _ = feed(state, 3, sequence=None)
    state, outcomes = feed(state, 2, sequence=None)
    assert outcomes == [Outcome.LATE]


def test_a_redelivered_event_older_than_the_launch_that_consumed_its_window_does_not_count():
    state, _ = feed(None, 1, sequence=10)
    state, _ = feed(state, 2, sequence=11)
    state, outcomes = feed(state, 4, sequence=13)
    assert outcomes == [Outcome.LAUNCH]
    state, outcomes = feed(state, 3, sequence=12)  # its place was in the window that launched
    assert outcomes == [Outcome.LATE]


def test_the_delivery_sequence_survives_a_restart():
    state, _ = feed(None, 1, sequence=10)
    restored = StoredKeyState.from_json(state.to_json())
    assert restored.sequence == 10


def alarm_2_delivered_last(
    first: InputPosition, third: InputPosition, second: InputPosition
) -> list[Outcome]:
    """The outcome of d2 when the keyed topic delivers d1, d3, then d2 (keyed offsets 10, 11,
    12), with their producer's records at *first*, *third* and *second* on the input topic."""
    state, _ = feed(None, 1, sequence=10, position=first)
    state, _ = feed(state, 3, sequence=11, position=third)
    _, outcomes = feed(state, 2, sequence=12, position=second)
    return outcomes


@pytest.mark.parametrize(
    ("first", "third", "second", "outcome"),
    [
        # faust skipped d2's input record around a rebalance and read it again after d3's,
        # so the keyed topic holds d3 first: only the input offsets show d2 was sent first.
        pytest.param(at(500), at(502), at(501), Outcome.LAUNCH, id="re-read-by-the-intake"),
        pytest.param(at(500), at(501), at(502), Outcome.LATE, id="sent-late-by-its-producer"),
        # Two partitions have no order between them: event time decides.
        pytest.param(at(500), at(502), at(10, "drift/1"), Outcome.LATE, id="other-partition"),
    ],
)
def test_the_input_position_tells_an_event_read_again_from_one_sent_late(
    first: InputPosition, third: InputPosition, second: InputPosition, outcome: Outcome
):
    assert alarm_2_delivered_last(first, third, second) == [outcome]


def test_the_key_keeps_the_highest_position_per_input_partition():
    state, _ = feed(None, 1, sequence=None, position=at(7, "drift/0"))
    state, _ = feed(state, 3, sequence=None, position=at(4, "drift/1"))
    state, _ = feed(state, 2, sequence=None, position=at(5, "drift/0"))
    assert state.positions == (at(7, "drift/0"), at(4, "drift/1"))


def test_input_positions_survive_a_restart():
    state, _ = feed(None, 1, sequence=10, position=at(500))
    restored = StoredKeyState.from_json(state.to_json())
    assert restored.positions == (at(500),)


def test_a_state_saved_before_positions_were_kept_still_loads():
    state, _ = feed(None, 1, sequence=10)
    saved = state.to_json()
    del saved["positions"]
    assert StoredKeyState.from_json(saved).positions == ()

"""A key's state is stored as compact bytes (format 2), and what earlier versions stored loads.

The expected bytes are written out by hand: times are microseconds since the Unix epoch
(2026-03-01T08:00:00Z is 1772352000 s, from `date -u -d ... +%s`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.ledger import Reason
from orchestrator.rules import state_encoding
from orchestrator.rules.state import (
    Buffered,
    Entry,
    InputPosition,
    Joined,
    KeyState,
    Pending,
    RuleState,
)
from orchestrator.sweeps.state import SweepState, Trial, TrialState
from tests.unit.rules.builders import DATA, DRIFT, at
from tests.unit.sweeps.builders import BASE, SWEEP, grid_spec

FIXTURE = Path(__file__).parent / "fixtures" / "key_state_written_before_the_split.json"

COUNTED = KeyState(
    horizon=at(0),
    rules={"r": RuleState(entries=(Entry("d1", "/monitors/eval\nd1", at(0)),))},
    wakeups=(at(360),),
)
"""What one counted event leaves: a window of one entry, and the window's end as a timer."""

ARRIVED = {"specversion": "1.0", "id": "a1", "source": "/ingest", "type": DATA}
HELD = {"specversion": "1.0", "id": "d3", "source": "/monitors/eval", "type": DRIFT}
WAITING = {"specversion": "1.0", "id": "d2", "source": "/monitors/eval", "type": DRIFT}


def compact(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


EVERYTHING = (
    b'[2,1772352600000000,{"r":['
    b'[["d1","/monitors/eval",1772352000000000,2.5],["d2",["not-from-d2"],1772352300000000]],'
    b'{"' + DATA.encode() + b'":[' + compact(ARRIVED) + b",null,1772352300000000]},"
    b'{"/ingest\\na0":1772352000000000},'
    b"1772352000000000,[1772352000000000],"
    b'"job-1",'
    b'["queued",1772352300000000,null,' + compact(WAITING) + b',["d1","d2"]]'
    b"]},"
    b"[1772355600000000],20,"
    b'[["drift/0",103],["drift/1",7]],'
    b"[[" + compact(HELD) + b',"held-elsewhere",1772352600000000,1772352900000000]]'
    b"]"
)
"""Every field of a key state, written by hand in format 2."""


def test_one_counted_event_is_stored_in_about_a_hundred_bytes() -> None:
    assert state_encoding.encode(COUNTED) == (
        b'[2,1772352000000000,{"r":[[["d1","/monitors/eval",1772352000000000]]]},'
        b"[1772373600000000]]"
    )


def test_every_field_of_a_hand_written_state_is_read() -> None:
    assert state_encoding.decode(EVERYTHING) == KeyState(
        horizon=at(10),
        rules={
            "r": RuleState(
                entries=(
                    Entry("d1", "/monitors/eval\nd1", at(0), amount=2.5),
                    Entry("d2", "not-from-d2", at(5)),
                ),
                joined={DATA: Joined(event=ARRIVED, identity="/ingest\na1", time=at(5))},
                seen={"/ingest\na0": at(0)},
                last_launch=at(0),
                launches=(at(0),),
                running="job-1",
                pending=Pending(
                    reason=Reason.QUEUED,
                    since=at(5),
                    due=None,
                    event=WAITING,
                    event_ids=("d1", "d2"),
                ),
            )
        },
        wakeups=(at(60),),
        sequence=20,
        positions=(InputPosition("drift/0", 103), InputPosition("drift/1", 7)),
        buffer=(Buffered(event=HELD, identity="held-elsewhere", time=at(10), release_at=at(15)),),
    )


def test_a_state_is_written_back_as_it_was_read() -> None:
    assert state_encoding.encode(state_encoding.decode(EVERYTHING)) == EVERYTHING


def test_defaults_before_a_field_that_is_set_are_written_empty() -> None:
    cooling = KeyState(rules={"r": RuleState(last_launch=at(0))}, sequence=0)
    encoded = b'[2,null,{"r":[[],{},{},1772352000000000]},[],0]'
    assert state_encoding.encode(cooling) == encoded
    assert state_encoding.decode(encoded) == cooling


def test_an_idle_state_is_only_its_format() -> None:
    assert state_encoding.encode(KeyState()) == b"[2]"
    assert state_encoding.decode(b"[2]") == KeyState()


OLD_COUNTED = (
    b'{"format":1,"horizon":"2026-03-01T08:00:00Z","buffer":[],"rules":{"r":{"entries":'
    b'[["d1","/monitors/eval\\nd1","2026-03-01T08:00:00Z",0.0]],"joined":{},"seen":{},'
    b'"last_launch":null,"launches":[],"running":null,"pending":null}},'
    b'"wakeups":["2026-03-01T14:00:00Z"],"sequence":7,"positions":[["drift/0",41]]}'
)
"""A changelog value as the worker wrote it before format 2: `KeyState.to_json()` through
faust's json codec."""


def test_a_changelog_value_written_before_format_2_loads() -> None:
    expected = KeyState(
        horizon=at(0),
        rules={"r": RuleState(entries=(Entry("d1", "/monitors/eval\nd1", at(0)),))},
        wakeups=(at(360),),
        sequence=7,
        positions=(InputPosition("drift/0", 41),),
    )
    assert state_encoding.decode(OLD_COUNTED) == expected
    assert state_encoding.decode(json.loads(OLD_COUNTED)) == expected  # as the object


def test_a_state_written_before_format_2_is_rewritten_smaller_and_unchanged() -> None:
    state = state_encoding.decode(OLD_COUNTED)
    rewritten = state_encoding.encode(state)
    assert rewritten.startswith(b"[2,")
    assert len(rewritten) < len(OLD_COUNTED) / 2
    assert state_encoding.decode(rewritten) == state


@pytest.mark.parametrize("name", ["state", "joined_state", "final_state"])
def test_the_old_engine_s_states_survive_format_2_whole(name: str) -> None:
    written = json.loads(FIXTURE.read_text())[name]
    as_the_changelog_held_it = json.dumps(written, separators=(",", ":")).encode()
    state = state_encoding.decode(as_the_changelog_held_it)
    again = state_encoding.decode(state_encoding.encode(state))
    assert again.to_json() == written


def test_a_sweep_is_stored_with_its_key() -> None:
    sweep = SweepState(
        name=SWEEP,
        spec=grid_spec(),
        base=BASE,
        started_at=at(0),
        trials=(
            Trial(
                index=0,
                job=f"{SWEEP}-0",
                parameters={"training.learning_rate": 1e-3},
                launched_at=at(0),
                state=TrialState.RUNNING,
                losses=((10, 2.5), (20, 1.5)),
                step=20,
            ),
        ),
    )
    state = KeyState(rules={"sweep": RuleState(running=SWEEP)}, sweeps={SWEEP: sweep})
    assert state_encoding.decode(state_encoding.encode(state)) == state


def test_an_event_with_a_lone_surrogate_is_stored_in_ascii() -> None:
    event = {**HELD, "data": {"note": "caf\u00e9 \ud800"}}
    state = KeyState(
        buffer=(Buffered(event=event, identity="/monitors/eval\nd3", time=at(0), release_at=at(1)),)
    )
    encoded = state_encoding.encode(state)
    assert encoded.isascii()
    assert state_encoding.decode(encoded) == state


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[3]", id="a later format"),
        pytest.param(b'{"format":3}', id="an unknown object format"),
        pytest.param(b'[2,"noon"]', id="a time that is not microseconds"),
        pytest.param(b"[2,null,{},[],null,[],[],{},1]", id="too many fields"),
        pytest.param(b'[2,null,{"r":[[["d1"]]]}]', id="an entry without its time"),
        pytest.param(b"\xff\xfe", id="not text"),
        pytest.param(b"[2", id="not JSON"),
        pytest.param(b"7", id="a number"),
    ],
)
def test_what_no_version_wrote_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="key state"):
        state_encoding.decode(raw)


# Drawn states: every field, with identities that are and are not their event's own.

times = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
texts = st.text(max_size=12)


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    return {"specversion": "1.0", "id": draw(texts), "source": draw(texts), "type": DRIFT}


@st.composite
def identities(draw: st.DrawFn, source: str, event_id: str) -> str:
    return draw(st.sampled_from([f"{source}\n{event_id}", draw(texts)]))


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    event_id, source = draw(texts), draw(texts)
    amount = draw(st.one_of(st.just(0.0), st.floats(allow_nan=False)))
    return Entry(event_id, draw(identities(source, event_id)), draw(times), amount)


@st.composite
def joins(draw: st.DrawFn) -> Joined:
    event = draw(events())
    return Joined(event, draw(identities(event["source"], event["id"])), draw(times))


@st.composite
def held(draw: st.DrawFn) -> Buffered:
    event = draw(events())
    identity = draw(identities(event["source"], event["id"]))
    return Buffered(event, identity, draw(times), draw(times))


pendings = st.builds(
    Pending,
    reason=st.sampled_from(Reason),
    since=times,
    due=st.none() | times,
    event=st.one_of(st.just({}), events()),
    event_ids=st.lists(texts, max_size=3).map(tuple),
)
rule_states = st.builds(
    RuleState,
    entries=st.lists(entries(), max_size=3).map(tuple),
    joined=st.dictionaries(texts, joins(), max_size=2),
    seen=st.dictionaries(texts, times, max_size=3),
    last_launch=st.none() | times,
    launches=st.lists(times, max_size=3).map(tuple),
    running=st.none() | texts,
    pending=st.none() | pendings,
)
key_states = st.builds(
    KeyState,
    horizon=st.none() | times,
    buffer=st.lists(held(), max_size=2).map(tuple),
    rules=st.dictionaries(texts, rule_states, max_size=3),
    wakeups=st.lists(times, max_size=3).map(tuple),
    sequence=st.none() | st.integers(min_value=0, max_value=2**63),
    positions=st.lists(
        st.builds(InputPosition, partition=texts, offset=st.integers(min_value=0)), max_size=3
    ).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(key_states)
def test_any_state_reads_back_equal(state: KeyState) -> None:
    assert state_encoding.decode(state_encoding.encode(state)) == state


@settings(max_examples=100, deadline=None)
@given(key_states)
def test_any_state_reads_back_as_the_readable_form_does(state: KeyState) -> None:
    assert state_encoding.decode(state_encoding.encode(state)).to_json() == state.to_json()


def test_a_time_in_another_zone_is_stored_as_the_same_instant() -> None:
    ten_in_paris = datetime(2026, 3, 1, 10, 0, tzinfo=timezone(timedelta(hours=1)))
    state = KeyState(horizon=ten_in_paris)
    assert state_encoding.decode(state_encoding.encode(state)).horizon == at(60)

"""Properties the engine must keep whatever the events: hypothesis generates the events."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.events import CloudEvent
from orchestrator.ledger import Outcome
from orchestrator.rules import engine
from orchestrator.rules.engine import KeyState
from orchestrator.rules.simulation import simulate
from tests.unit.rules.builders import drift, one_rule

RULES = one_rule(
    "count: 2\nwindow: 30m\ncooldown: 45m\nconcurrency: replace\nmax_launches_per_day: 20\n",
    header="allowed_lateness: 10m\n",
)
DURATION = timedelta(minutes=20)

minutes = st.lists(st.integers(min_value=0, max_value=600), min_size=1, max_size=25, unique=True)


def events_at(values: list[int], models: list[str] | None = None) -> list[CloudEvent]:
    models = models or ["m1"] * len(values)
    return [drift(f"{m}-{v}", v, model=m) for v, m in zip(values, models, strict=True)]


@settings(max_examples=60, deadline=None)
@given(minutes, st.lists(st.sampled_from(["m1", "m2"]), min_size=25, max_size=25))
def test_same_input_gives_the_same_output(values, models):
    events = events_at(values, models[: len(values)])
    assert simulate(RULES, events, assume_duration=DURATION) == simulate(
        RULES, events, assume_duration=DURATION
    )


@settings(max_examples=60, deadline=None)
@given(minutes, st.data())
def test_a_window_never_counts_an_event_twice(values, data):
    events = events_at(values)
    # Redeliver some events, anywhere later in the stream.
    for event in data.draw(st.lists(st.sampled_from(events), max_size=10)):
        events.insert(data.draw(st.integers(events.index(event) + 1, len(events))), event)
    records = simulate(RULES, events, assume_duration=DURATION)
    launched = [i for r in records if r.outcome is Outcome.LAUNCH for i in r.event_ids]
    assert len(launched) == len(set(launched))


@settings(max_examples=60, deadline=None)
@given(minutes)
def test_cooldown_is_never_violated(values):
    records = simulate(RULES, events_at(sorted(values)), assume_duration=DURATION)
    times = [r.time for r in records if r.outcome is Outcome.LAUNCH]
    assert all(b - a >= timedelta(minutes=45) for a, b in itertools.pairwise(times))


@settings(max_examples=60, deadline=None)
@given(minutes, st.randoms(use_true_random=False))
def test_shuffled_arrival_within_lateness_gives_the_same_launches(values, random):
    ordered = sorted(values)
    # Shuffle, but only swap events whose times are within the allowed lateness (10m) of
    # everything that arrived before them: that is what "within lateness" means.
    shuffled = list(ordered)
    for i in range(len(shuffled) - 1):
        j = i + 1
        if shuffled[j] - max(shuffled[: i + 1]) <= 10 and random.random() < 0.5:
            shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    assume_ok = all(v >= max(shuffled[: i + 1]) - 10 for i, v in enumerate(shuffled))
    if not assume_ok:
        return

    def launches(order):
        records = simulate(RULES, events_at(order), assume_duration=DURATION)
        return [(r.time, r.event_ids) for r in records if r.outcome is Outcome.LAUNCH]

    assert launches(shuffled) == launches(ordered)


@settings(max_examples=40, deadline=None)
@given(minutes, st.integers(min_value=0, max_value=24))
def test_a_restart_from_the_stored_state_changes_no_decision(values, cut):
    """State goes through JSON (the faust changelog) at an arbitrary point: same records."""
    events = events_at(sorted(values))
    cut = min(cut, len(events))

    def run(restart: bool) -> list[object]:
        state, records = None, []
        for index, event in enumerate(events):
            if restart and index == cut and state is not None:
                state = KeyState.from_json(json.loads(json.dumps(state.to_json())))
            assert event.time is not None
            state, out = engine.evaluate(RULES, state, event, key="m1", now=event.time)
            records += out
        return records

    assert run(restart=True) == run(restart=False)


@settings(max_examples=40, deadline=None)
@given(minutes)
def test_state_is_bounded_once_time_moves_on(values):
    state = None
    for event in events_at(sorted(values)):
        assert event.time is not None
        state, _ = engine.evaluate(RULES, state, event, key="m1", now=event.time)
    assert state is not None
    later = drift(0, max(values) + 2 * 24 * 60).time or datetime.min
    state, _ = engine.tick(RULES, state, key="m1", now=later)
    # What is left is at most the job still running (its end has not been observed).
    for rule_state in state.rules.values():
        assert rule_state.running is not None
        assert not rule_state.entries
        assert not rule_state.joined
        assert not rule_state.seen
        assert not rule_state.pending
        assert not rule_state.launches
        finished = engine.JobFinished("r", "m1", rule_state.running, True, later)
        state, _ = engine.observe(RULES, state, finished, key="m1", now=later)
    state, _ = engine.tick(RULES, state, key="m1", now=later + timedelta(minutes=1))
    assert state.rules == {}
    assert state.buffer == ()

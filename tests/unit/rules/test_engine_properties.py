"""Properties the engine must keep whatever the events: hypothesis generates the events."""

from __future__ import annotations

import itertools
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.events import CloudEvent
from orchestrator.ledger import Outcome
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

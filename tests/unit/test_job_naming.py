"""Job names: valid RFC 1035 labels, short enough for Kubeflow, the same for the same window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.jobs.naming import MAX_LENGTH, is_valid_job_name, job_name


def test_same_inputs_give_the_same_name():
    first = job_name(rule="chat-drift-retrain", key="chat-model-7", window_event_ids=["a", "b"])
    again = job_name(rule="chat-drift-retrain", key="chat-model-7", window_event_ids=["b", "a"])
    assert first == again
    assert first.startswith("chat-drift-")


def test_a_different_window_gives_a_different_name():
    one = job_name(rule="r", key="k", window_event_ids=["a"])
    other = job_name(rule="r", key="k", window_event_ids=["b"])
    assert one != other


def test_names_cut_to_the_same_prefix_stay_distinct():
    long_rule = "x" * 40
    one = job_name(rule=long_rule, key="model-" + "a" * 50 + "1", window_event_ids=["e"])
    other = job_name(rule=long_rule, key="model-" + "a" * 50 + "2", window_event_ids=["e"])
    assert one != other


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=60), st.text(max_size=80), st.lists(st.text(), max_size=5))
def test_every_name_is_a_valid_short_rfc1035_label(rule, key, ids):
    name = job_name(rule=rule, key=key, window_event_ids=ids)
    assert len(name) <= MAX_LENGTH
    assert is_valid_job_name(name), name

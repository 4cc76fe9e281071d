"""Which phase changes count: the rule every backend and the completion publisher share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.jobs.model import JobPhase
from orchestrator.jobs.tracking import Milestone, Transition, next_transition

P = JobPhase


def test_first_sighting_is_always_news():
    assert next_transition(None, P.SUCCEEDED) == Transition(None, P.SUCCEEDED)


def test_repeated_phase_collapses():
    assert next_transition(P.RUNNING, P.RUNNING) is None


@pytest.mark.parametrize(
    ("before", "after"),
    [(P.PENDING, P.RUNNING), (P.RUNNING, P.SUCCEEDED), (P.PENDING, P.FAILED)],
    ids=["pending-to-running", "running-to-succeeded", "pending-to-failed"],
)
def test_forward_moves_count(before, after):
    assert next_transition(before, after) == Transition(before, after)


def test_running_job_never_goes_back_to_pending():
    assert next_transition(P.RUNNING, P.PENDING) is None


@pytest.mark.parametrize("final", [P.SUCCEEDED, P.FAILED])
@pytest.mark.parametrize("observed", list(JobPhase))
def test_final_phases_never_change(final, observed):
    assert next_transition(final, observed) is None


def test_live_job_can_be_suspended_and_resumed():
    assert next_transition(P.RUNNING, P.SUSPENDED) == Transition(P.RUNNING, P.SUSPENDED)
    assert next_transition(P.SUSPENDED, P.PENDING) == Transition(P.SUSPENDED, P.PENDING)
    assert next_transition(P.SUSPENDED, P.RUNNING) == Transition(P.SUSPENDED, P.RUNNING)


def test_milestones_are_started_completed_failed():
    assert Transition(P.PENDING, P.RUNNING).milestone is Milestone.STARTED
    assert Transition(P.RUNNING, P.SUCCEEDED).milestone is Milestone.COMPLETED
    assert Transition(P.RUNNING, P.FAILED).milestone is Milestone.FAILED
    assert Transition(P.RUNNING, P.SUSPENDED).milestone is None


@given(st.lists(st.sampled_from(list(JobPhase)), max_size=30))
def test_any_sequence_reaches_at_most_one_final_phase(observed):
    phase = None
    finals = 0
    for seen in observed:
        transition = next_transition(phase, seen)
        if transition is not None:
            phase = transition.after
            finals += transition.after.is_final
    assert finals <= 1

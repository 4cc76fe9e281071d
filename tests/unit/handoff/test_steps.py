"""The calls that hand a version to a target, what a refusal undoes, and the backoff."""

from __future__ import annotations

import pytest

from orchestrator.handoff.errors import FailureReason
from orchestrator.handoff.ledger import Slot, SlotState
from orchestrator.handoff.steps import (
    Action,
    RetryPolicy,
    Step,
    listing_problem,
    reason_for,
    rollback_for,
    served_anyway,
    steps_for,
)
from orchestrator.handoff.versions import Version

V2 = Version(
    lora_name="v2",
    job="v2",
    rule="rule",
    key="chat",
    model="chat-model",
    adapter_uri="file:///adapters/v2/adapter",
    lora_path="/adapters/v2/adapter",
    completion_id="v2.completed",
)


def test_the_first_version_is_loaded_checked_and_tried():
    slot = Slot(state=SlotState.PENDING, desired=V2, seen=("v2",))

    assert steps_for(slot) == (
        Step(Action.LOAD, "v2", "/adapters/v2/adapter"),
        Step(Action.CHECK, "v2", "/adapters/v2/adapter"),
        Step(Action.SMOKE, "v2"),
    )


def test_the_version_it_replaces_is_unloaded_last():
    slot = Slot(state=SlotState.PENDING, desired=V2, served="v1", seen=("v1", "v2"))

    assert steps_for(slot)[-1] == Step(Action.UNLOAD, "v1")
    assert len(steps_for(slot)) == 4


@pytest.mark.parametrize(
    "slot",
    [
        Slot(state=SlotState.SERVED, desired=V2, served="v2"),
        Slot(state=SlotState.FAILED, desired=V2, served="v1"),
        Slot(state=SlotState.PENDING, desired=None),
    ],
    ids=["served", "refused", "nothing desired"],
)
def test_a_slot_that_is_not_pending_needs_no_call(slot):
    assert steps_for(slot) == ()


@pytest.mark.parametrize(
    ("refused", "undo", "reason"),
    [
        (Step(Action.LOAD, "v2", "/p"), (), FailureReason.ADAPTER_REJECTED),
        (Step(Action.CHECK, "v2", "/p"), (Step(Action.UNLOAD, "v2"),), FailureReason.NOT_LISTED),
        (Step(Action.SMOKE, "v2"), (Step(Action.UNLOAD, "v2"),), FailureReason.SMOKE_TEST_FAILED),
    ],
    ids=["a refused load loaded nothing", "not listed: unload it", "no answer: unload it"],
)
def test_a_refusal_undoes_a_load_that_does_not_work(refused, undo, reason):
    assert rollback_for(refused, V2) == undo
    assert reason_for(refused) is reason
    assert not served_anyway(refused)


def test_a_refused_unload_of_the_old_version_leaves_the_new_one_served():
    refused = Step(Action.UNLOAD, "v1")

    assert served_anyway(refused)
    assert rollback_for(refused, V2) == ()


CHECK = Step(Action.CHECK, "v2", "/adapters/v2/adapter")


def test_a_listing_with_the_name_from_its_path_is_right():
    listed = {"/models/base": None, "v2": "/adapters/v2/adapter"}

    assert listing_problem(listed, CHECK) is None


@pytest.mark.parametrize(
    ("listed", "words"),
    [
        ({"/models/base": None}, "does not list 'v2'"),
        ({"v2": "/somebody/else"}, "another adapter holds the name"),
    ],
    ids=["missing", "the name from another path"],
)
def test_a_listing_without_our_adapter_is_a_problem(listed, words):
    problem = listing_problem(listed, CHECK)

    assert problem is not None
    assert words in problem


@pytest.mark.parametrize(
    ("failed", "delay"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (500, 60.0)],
)
def test_the_wait_doubles_up_to_its_cap(failed, delay):
    assert RetryPolicy(first_delay=1.0, max_delay=60.0).delay(failed) == delay


def test_the_failure_is_reported_once_after_the_set_number_of_tries():
    policy = RetryPolicy(report_after=3)

    assert [policy.reports(n) for n in range(1, 6)] == [False, False, True, False, False]


@pytest.mark.parametrize(
    "arguments",
    [{"first_delay": 0}, {"first_delay": 2, "max_delay": 1}, {"report_after": 0}],
    ids=["no first delay", "a cap below the first delay", "reporting before any try"],
)
def test_a_policy_that_makes_no_sense_is_refused(arguments):
    with pytest.raises(ValueError, match="must be"):
        RetryPolicy(**arguments)

"""The ledger: a version is asked of each target once, the newest wins, refusals keep the old."""

from __future__ import annotations

import pytest

from orchestrator.handoff.errors import FailureReason
from orchestrator.handoff.ledger import (
    HISTORY,
    Outcome,
    Slot,
    SlotKey,
    SlotState,
    accept,
    loaded,
    pending,
    rejected,
)
from orchestrator.handoff.versions import Version

A = "http://vllm-a:8000"
B = "http://vllm-b:8000"


def version(name: str, *, rule: str = "rule", key: str = "chat", path: str | None = "") -> Version:
    return Version(
        lora_name=name,
        job=name,
        rule=rule,
        key=key,
        model="chat-model",
        adapter_uri=f"file:///adapters/{name}/adapter" if path is not None else None,
        lora_path=(path or f"/adapters/{name}/adapter") if path is not None else None,
        completion_id=f"{name}.completed",
    )


V1, V2, V3 = version("v1"), version("v2"), version("v3")
KEY_A = SlotKey(target=A, rule="rule", key="chat")
KEY_B = SlotKey(target=B, rule="rule", key="chat")


def test_a_new_version_is_pending_on_every_target_of_its_model():
    intake = accept({}, V1, (A, B))

    assert intake.outcomes == {KEY_A: Outcome.PENDING, KEY_B: Outcome.PENDING}
    assert intake.changed[KEY_A] == Slot(state=SlotState.PENDING, desired=V1, seen=("v1",))
    assert pending(intake.changed, A) == (KEY_A,)


def test_the_same_version_again_changes_nothing():
    ledger = dict(accept({}, V1, (A,)).changed)
    ledger[KEY_A] = loaded(ledger[KEY_A], V1)

    again = accept(ledger, V1, (A,))

    assert again.outcomes == {KEY_A: Outcome.DUPLICATE}
    assert again.changed == {}


def test_a_version_that_was_replaced_is_not_asked_for_again():
    ledger = dict(accept({}, V1, (A,)).changed)
    ledger.update(accept(ledger, V2, (A,)).changed)

    assert accept(ledger, V1, (A,)).outcomes == {KEY_A: Outcome.DUPLICATE}


def test_a_target_added_later_is_asked_for_a_version_the_others_already_have():
    ledger = dict(accept({}, V1, (A,)).changed)

    intake = accept(ledger, V1, (A, B))

    assert intake.outcomes == {KEY_A: Outcome.DUPLICATE, KEY_B: Outcome.PENDING}


def test_a_newer_version_replaces_one_still_pending_and_keeps_what_is_served():
    ledger = dict(accept({}, V1, (A,)).changed)
    ledger[KEY_A] = loaded(ledger[KEY_A], V1)
    ledger.update(accept(ledger, V2, (A,)).changed)

    ledger.update(accept(ledger, V3, (A,)).changed)

    assert ledger[KEY_A] == Slot(
        state=SlotState.PENDING, desired=V3, served="v1", seen=("v1", "v2", "v3")
    )


def test_lineages_of_other_rules_and_keys_have_slots_of_their_own():
    other_rule = version("o1", rule="other")
    other_key = version("k1", key="summaries")

    ledger = dict(accept({}, V1, (A,)).changed)
    ledger.update(accept(ledger, other_rule, (A,)).changed)
    ledger.update(accept(ledger, other_key, (A,)).changed)

    assert pending(ledger, A) == (
        SlotKey(A, "other", "chat"),
        SlotKey(A, "rule", "chat"),
        SlotKey(A, "rule", "summaries"),
    )
    assert pending(ledger, B) == ()


@pytest.mark.parametrize(
    ("refused", "reason"),
    [
        (version("v1", path=None), FailureReason.NO_ADAPTER),
        (
            Version(
                lora_name="v1",
                job="v1",
                rule="rule",
                key="chat",
                model="chat-model",
                adapter_uri="s3://adapters/v1",
                lora_path=None,
                completion_id="v1.completed",
            ),
            FailureReason.ADAPTER_NOT_REACHABLE,
        ),
    ],
    ids=["no adapter", "an adapter no server can read"],
)
def test_a_version_no_server_can_read_is_refused_without_a_call(refused, reason):
    ledger = {KEY_A: Slot(served="v0", seen=("v0",))}

    intake = accept(ledger, refused, (A,))

    assert intake.outcomes == {KEY_A: Outcome.REFUSED}
    slot = intake.changed[KEY_A]
    assert (slot.state, slot.reason, slot.served) == (SlotState.FAILED, reason, "v0")
    assert pending(intake.changed, A) == ()


def test_loaded_serves_the_version_and_ends_the_work():
    slot = Slot(state=SlotState.PENDING, desired=V2, served="v1", seen=("v1", "v2"))

    assert loaded(slot, V2) == Slot(
        state=SlotState.SERVED, desired=V2, served="v2", seen=("v1", "v2")
    )


def test_loading_a_version_after_a_newer_one_arrived_leaves_the_newer_pending():
    slot = Slot(state=SlotState.PENDING, desired=V3, served="v1", seen=("v1", "v2", "v3"))

    after = loaded(slot, V2)

    assert (after.state, after.desired, after.served) == (SlotState.PENDING, V3, "v2")


def test_a_refusal_keeps_the_version_served_before():
    slot = Slot(state=SlotState.PENDING, desired=V2, served="v1", seen=("v1", "v2"))

    after = rejected(slot, V2, reason=FailureReason.SMOKE_TEST_FAILED, message="500")

    assert after == Slot(
        state=SlotState.FAILED,
        desired=V2,
        served="v1",
        seen=("v1", "v2"),
        reason=FailureReason.SMOKE_TEST_FAILED,
        message="500",
    )


def test_a_refusal_of_a_version_already_replaced_changes_nothing():
    slot = Slot(state=SlotState.PENDING, desired=V3, served="v1", seen=("v1", "v2", "v3"))

    assert rejected(slot, V2, reason=FailureReason.ADAPTER_REJECTED, message="404") == slot


def test_a_slot_remembers_a_bounded_number_of_names():
    ledger: dict[SlotKey, Slot] = {}
    for number in range(HISTORY + 5):
        ledger.update(accept(ledger, version(f"v{number}"), (A,)).changed)

    seen = ledger[KEY_A].seen
    assert len(seen) == HISTORY
    assert seen[-1] == f"v{HISTORY + 4}"
    assert seen[0] == "v5"


def test_slots_and_keys_survive_their_json_form():
    slot = Slot(
        state=SlotState.FAILED,
        desired=V2,
        served="v1",
        seen=("v1", "v2"),
        reason=FailureReason.NOT_LISTED,
        message="not listed",
    )

    assert Slot.from_json(slot.to_json()) == slot
    assert SlotKey.from_json(KEY_A.to_json()) == KEY_A


@pytest.mark.parametrize(
    "data",
    [{"desired": None}, {"state": "gone", "desired": None}, {"state": "served", "seen": "v1"}],
    ids=["no state", "an unknown state", "seen is not a list"],
)
def test_a_slot_record_that_does_not_parse_is_refused(data):
    with pytest.raises(ValueError, match=r"slot|seen|gone"):
        Slot.from_json(data)

"""The hand-off's events: their ids, links and data, valid for their schemas."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.handoff.announcing import adapter_served, handoff_failed
from orchestrator.handoff.errors import FailureReason
from orchestrator.handoff.steps import Action
from orchestrator.handoff.versions import Version
from orchestrator.vocabulary import SchemaRegistry

REGISTRY = SchemaRegistry.builtin()
AT = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
TARGET = "http://vllm-a:8000"
TARGET_ID = hashlib.sha256(b"http://vllm-a:8000").hexdigest()[:12]
V2 = Version(
    lora_name="rule-chat-2b",
    job="rule-chat-2b",
    rule="rule",
    key="chat",
    model="chat-model",
    adapter_uri="s3://adapters/rule-chat-2b",
    lora_path="/mnt/adapters/rule-chat-2b/adapter",
    completion_id="rule-chat-2b.completed",
    decision_id="decision-7",
)


def test_a_served_adapter_is_announced_with_what_it_replaced():
    event = adapter_served(V2, target=TARGET, replaced="rule-chat-1a", smoke_text="x" * 300, at=AT)

    assert (event.id, event.source, event.type, event.subject, event.time) == (
        f"rule-chat-2b.served.{TARGET_ID}",
        "/tuneloop/handoff",
        "io.tuneloop.adapter.served.v1",
        "rule-chat-2b",
        AT,
    )
    assert dict(event.extensions) == {
        "causationid": "rule-chat-2b.completed",
        "correlationid": "decision-7",
        "partitionkey": "chat",
    }
    assert event.data == {
        "lora_name": "rule-chat-2b",
        "target": TARGET,
        "model": "chat-model",
        "rule": "rule",
        "key": "chat",
        "job": "rule-chat-2b",
        "adapter_uri": "s3://adapters/rule-chat-2b",
        "lora_path": "/mnt/adapters/rule-chat-2b/adapter",
        "completion_id": "rule-chat-2b.completed",
        "replaced": "rule-chat-1a",
        "smoke_text": "x" * 200,
    }
    REGISTRY.validate(event)


def test_a_refusal_and_a_target_that_does_not_answer_are_two_events():
    refused = handoff_failed(
        V2,
        target=TARGET,
        reason=FailureReason.SMOKE_TEST_FAILED,
        message="a completion with model 'rule-chat-2b': 500 boom",
        will_retry=False,
        attempts=1,
        step=Action.SMOKE,
        still_served="rule-chat-1a",
        at=AT,
    )
    retrying = handoff_failed(
        V2,
        target=TARGET,
        reason=FailureReason.TARGET_UNAVAILABLE,
        message="ConnectError",
        will_retry=True,
        attempts=5,
        step=None,
        still_served=None,
        at=AT,
    )

    assert refused.id == f"rule-chat-2b.handoff-failed.{TARGET_ID}"
    assert retrying.id == f"rule-chat-2b.handoff-failed.{TARGET_ID}.retrying"
    assert {
        key: refused.data[key]
        for key in ("reason", "will_retry", "attempts", "step", "still_served")
    } == {
        "reason": "smoke-test-failed",
        "will_retry": False,
        "attempts": 1,
        "step": "smoke",
        "still_served": "rule-chat-1a",
    }
    REGISTRY.validate(refused)
    REGISTRY.validate(retrying)


def test_every_failure_reason_is_one_the_schema_allows():
    for reason in FailureReason:
        REGISTRY.validate(
            handoff_failed(
                V2,
                target=TARGET,
                reason=reason,
                message="",
                will_retry=False,
                attempts=0,
                step=None,
                still_served=None,
                at=AT,
            )
        )


def test_a_failure_without_its_reason_is_not_a_valid_event():
    with pytest.raises(InvalidEventError):
        REGISTRY.validate(
            CloudEvent(
                id="x",
                source="/tuneloop/handoff",
                type="io.tuneloop.adapter.handoff_failed.v1",
                data={"lora_name": "a", "target": TARGET, "job": "a", "will_retry": True},
            )
        )

"""The hand-off's own CloudEvents: `io.tuneloop.adapter.served.v1` and `.handoff_failed.v1`.

Built by the hand-off's per-target loop (`handlers/handoff/service.py`) once per outcome of
one version on one target; every event validates against its schema in
`orchestrator/vocabulary/schemas/`.

Identity is derived, as for the completion events (`orchestrator/vocabulary/output.py`):
`<job>.served.<target id>`, `<job>.handoff-failed.<target id>` for a refusal and
`<job>.handoff-failed.<target id>.retrying` for a target that does not answer, where the
target id is the first 12 hex digits of the SHA-256 of its URL. A hand-off that publishes an
outcome again after a restart publishes the *same* event, which consumers dedupe on (source,
id). Links: `causationid` is the completion's id, `correlationid` the decision id,
`partitionkey` the rule key (one lineage's events stay in order).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from types import MappingProxyType
from typing import Any

from orchestrator.events import CloudEvent, ExtensionValue
from orchestrator.handoff.errors import FailureReason
from orchestrator.handoff.steps import Action
from orchestrator.handoff.versions import Version
from orchestrator.vocabulary.output import EventType

SOURCE = "/tuneloop/handoff"
"""`source` of the hand-off's events."""

SMOKE_TEXT_LIMIT = 200
"""Characters of the smoke test's answer carried in `adapter.served`."""


def target_id(target: str) -> str:
    """A short, stable name of *target* for event ids: 12 hex digits of its URL's SHA-256."""
    return hashlib.sha256(target.encode()).hexdigest()[:12]


def adapter_served(
    version: Version,
    *,
    target: str,
    replaced: str | None,
    smoke_text: str,
    at: datetime,
) -> CloudEvent:
    """*version* is served on *target*; *replaced* (a name) was unloaded there."""
    data = _common(version, target)
    data["replaced"] = replaced
    data["smoke_text"] = smoke_text[:SMOKE_TEXT_LIMIT]
    return _event(
        EventType.ADAPTER_SERVED, f"{version.job}.served.{target_id(target)}", version, at, data
    )


def handoff_failed(
    version: Version,
    *,
    target: str,
    reason: FailureReason,
    message: str,
    will_retry: bool,
    attempts: int,
    step: Action | None,
    still_served: str | None,
    at: datetime,
) -> CloudEvent:
    """*version* could not be served on *target*, for *reason*.

    Args:
        will_retry: the target did not answer and the hand-off keeps trying.
        attempts: calls of the failing kind made so far (0: refused before any call).
        step: the call that failed; None when none was made.
        still_served: the name of this lineage the target still serves, if any.
    """
    data = _common(version, target)
    data.update(
        {
            "reason": reason.value,
            "message": message,
            "will_retry": will_retry,
            "attempts": attempts,
            "step": step.value if step is not None else None,
            "still_served": still_served,
        }
    )
    event_id = f"{version.job}.handoff-failed.{target_id(target)}"
    if will_retry:
        event_id += ".retrying"
    return _event(EventType.ADAPTER_HANDOFF_FAILED, event_id, version, at, data)


def _common(version: Version, target: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "lora_name": version.lora_name,
        "target": target,
        "model": version.model,
        "rule": version.rule,
        "key": version.key,
        "job": version.job,
        "adapter_uri": version.adapter_uri,
        "lora_path": version.lora_path,
        "completion_id": version.completion_id,
    }
    return data


def _event(
    event_type: EventType, event_id: str, version: Version, at: datetime, data: dict[str, Any]
) -> CloudEvent:
    extensions: dict[str, ExtensionValue] = {
        "causationid": version.completion_id,
        "partitionkey": version.key,
    }
    if version.decision_id is not None:
        extensions["correlationid"] = version.decision_id
    return CloudEvent(
        id=event_id,
        source=SOURCE,
        type=event_type.value,
        subject=version.lora_name,
        time=at,
        datacontenttype="application/json",
        data=data,
        extensions=MappingProxyType(extensions),
    )

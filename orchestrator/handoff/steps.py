"""The calls that hand one version to one target, what a refusal of each means, and backoff.

For a `PENDING` slot the hand-off's per-target loop (`handlers/handoff/service.py`) makes
the calls of `steps_for` in order, through the vLLM client:

1. `LOAD`: `POST /v1/load_lora_adapter {lora_name, lora_path}`. A name that is already
   loaded counts as loaded (a hand-off stopped after the call and before its ledger write
   calls again); `CHECK` then proves it is ours.
2. `CHECK`: `GET /v1/models` lists `lora_name` with `root` equal to `lora_path`.
3. `SMOKE`: one completion with `model=<lora_name>` answers.
4. `UNLOAD`: `POST /v1/unload_lora_adapter {lora_name}` of the version it replaces, last, so
   that a client of the lineage always has one version to call.

Every step may be made again: a failed attempt starts over at `LOAD`, and the server's
answers make each repeat harmless (already loaded; already unloaded is a 404 that counts as
done). A refused `CHECK` or `SMOKE` leaves a loaded adapter that does not work: `rollback_for`
unloads it, and the version it would have replaced stays served.

Pure: no I/O, no clock; `RetryPolicy.delay` says how long the loop sleeps.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.handoff.errors import FailureReason
from orchestrator.handoff.ledger import Slot, SlotState
from orchestrator.handoff.versions import Version


class Action(enum.StrEnum):
    """One call to a serving target."""

    LOAD = "load"
    CHECK = "check"
    SMOKE = "smoke"
    UNLOAD = "unload"


@dataclass(frozen=True, slots=True)
class Step:
    """One call, with what it needs."""

    action: Action
    lora_name: str
    lora_path: str | None = None
    """`LOAD` and `CHECK` only: where the server reads the adapter."""


def steps_for(slot: Slot) -> tuple[Step, ...]:
    """The calls that serve *slot*'s desired version; none unless it is `PENDING`."""
    version = slot.desired
    if slot.state is not SlotState.PENDING or version is None or version.lora_path is None:
        return ()
    calls = [
        Step(Action.LOAD, version.lora_name, version.lora_path),
        Step(Action.CHECK, version.lora_name, version.lora_path),
        Step(Action.SMOKE, version.lora_name),
    ]
    if slot.served is not None and slot.served != version.lora_name:
        calls.append(Step(Action.UNLOAD, slot.served))
    return tuple(calls)


def listing_problem(listed: Mapping[str, str | None], check: Step) -> str | None:
    """What is wrong with `/v1/models` for a `CHECK`, or None when it lists the adapter.

    Args:
        listed: each served model's `id` -> its `root` (for an adapter, the path it was
            loaded from).
        check: the `CHECK` step, with the name and path that were loaded.
    """
    if check.lora_name not in listed:
        return f"/v1/models does not list {check.lora_name!r}"
    root = listed[check.lora_name]
    if root != check.lora_path:
        return (
            f"/v1/models lists {check.lora_name!r} from {root!r}, not {check.lora_path!r}: "
            "another adapter holds the name"
        )
    return None


def rollback_for(refused: Step, version: Version) -> tuple[Step, ...]:
    """The calls that undo what was done before *refused* was refused.

    A refused `LOAD` loaded nothing. After a refused `CHECK` or `SMOKE` the new version is
    loaded but not working: unload it. A refused `UNLOAD` of the replaced version leaves the
    new one served, which is not undone (`served_anyway`).
    """
    if refused.action in (Action.CHECK, Action.SMOKE):
        return (Step(Action.UNLOAD, version.lora_name),)
    return ()


def served_anyway(refused: Step) -> bool:
    """Whether the version counts as served although *refused* was refused: only the last
    call, the unload of the version it replaces, may fail without undoing the new one."""
    return refused.action is Action.UNLOAD


def reason_for(refused: Step) -> FailureReason:
    """The `handoff_failed` reason of a refusal of *refused*."""
    return {
        Action.LOAD: FailureReason.ADAPTER_REJECTED,
        Action.CHECK: FailureReason.NOT_LISTED,
        Action.SMOKE: FailureReason.SMOKE_TEST_FAILED,
        Action.UNLOAD: FailureReason.ADAPTER_REJECTED,
    }[refused.action]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a target that does not answer is retried: exponential backoff, for as long as it
    takes, with one `handoff_failed` (`will_retry: true`) after `report_after` attempts."""

    first_delay: float = 1.0
    """Seconds before the second attempt."""
    max_delay: float = 60.0
    """The longest wait between two attempts."""
    report_after: int = 5
    """Failed attempts after which the failure is published (once per version and target)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.first_delay) and self.first_delay > 0):
            raise ValueError(f"first_delay must be a positive number, got {self.first_delay!r}")
        if not (math.isfinite(self.max_delay) and self.max_delay >= self.first_delay):
            raise ValueError(f"max_delay must be at least first_delay, got {self.max_delay!r}")
        if self.report_after < 1:
            raise ValueError(f"report_after must be at least 1, got {self.report_after!r}")

    def delay(self, failed_attempts: int) -> float:
        """Seconds to wait after *failed_attempts* (>= 1) attempts failed in a row."""
        exponent = min(max(failed_attempts, 1) - 1, 62)
        return min(self.max_delay, self.first_delay * 2.0**exponent)

    def reports(self, failed_attempts: int) -> bool:
        """Whether the failure is published now: exactly at `report_after` attempts."""
        return failed_attempts == self.report_after

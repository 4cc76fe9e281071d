"""The hand-off's ledger: per serving target and lineage, what is served and what should be.

A lineage is one rule's adapters for one key: each promoted version replaces the one before
it on every target of its model. The ledger holds one `Slot` per (target, rule, key), and the
hand-off consumer (`handlers/handoff/`) keeps it on a compacted Kafka topic, one record per
slot, so a restarted hand-off finds it (docs/inference.md, "The ledger").

What it guarantees:

- **No version is loaded twice.** `accept` records a version's name in the slot's `seen`
  before anything is called; a replayed completion finds it there (`Outcome.DUPLICATE`) and
  causes nothing. The calls are made only for `PENDING` slots, and `loaded` ends that.
- **The newest version wins.** A version accepted while an older one is still pending (its
  target was down) replaces it as `desired`; the older one is never loaded there.
- **A refused version leaves the old one served.** `rejected` marks the slot `FAILED` and
  keeps `served`.

Pure: transitions take a slot and return a new one; the caller persists what changed.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from orchestrator.handoff.errors import FailureReason
from orchestrator.handoff.versions import Version

HISTORY = 64
"""Names a slot remembers in `seen`: far more versions than a replayed topic holds between
two promotions of one lineage, and small enough to keep each record a few kilobytes."""


class SlotState(enum.StrEnum):
    """Where a slot's desired version stands."""

    PENDING = "pending"
    """To be loaded: the target's loop calls the server until it is loaded or refused."""
    SERVED = "served"
    """Loaded, listed and answering; the version it replaced was unloaded."""
    FAILED = "failed"
    """Refused for good; `served` (the previous version, if any) is still what is served."""


@dataclass(frozen=True, slots=True, order=True)
class SlotKey:
    """One lineage on one target."""

    target: str
    """The server's base URL, as configured."""
    rule: str
    key: str

    def to_json(self) -> list[str]:
        return [self.target, self.rule, self.key]

    @classmethod
    def from_json(cls, data: object) -> SlotKey:
        """The inverse of `to_json`.

        Raises:
            ValueError: not a list of three strings.
        """
        if not isinstance(data, list) or len(data) != 3:
            raise ValueError(f"not a slot key: {data!r}")
        target, rule, key = data
        if not all(isinstance(part, str) for part in data):
            raise ValueError(f"not a slot key: {data!r}")
        return cls(target=target, rule=rule, key=key)


@dataclass(frozen=True, slots=True)
class Slot:
    """What one target serves for one lineage, and what it should serve."""

    state: SlotState = SlotState.SERVED
    desired: Version | None = None
    """The newest version accepted for this slot."""
    served: str | None = None
    """The name of the version the target serves now (None: none of this lineage)."""
    seen: tuple[str, ...] = ()
    """Names of every version accepted here, oldest first, at most `HISTORY`."""
    reason: FailureReason | None = None
    """Why `desired` was refused (`FAILED` only)."""
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "desired": self.desired.to_json() if self.desired is not None else None,
            "served": self.served,
            "seen": list(self.seen),
            "reason": self.reason.value if self.reason is not None else None,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Slot:
        """The inverse of `to_json`.

        Raises:
            ValueError: a member is missing or invalid.
        """
        try:
            desired = data["desired"]
            reason = data.get("reason")
            seen = data.get("seen", [])
            if not isinstance(seen, list) or not all(isinstance(name, str) for name in seen):
                raise ValueError(f"seen must be a list of names, got {seen!r}")
            return cls(
                state=SlotState(data["state"]),
                desired=Version.from_json(desired) if desired is not None else None,
                served=data.get("served"),
                seen=tuple(seen),
                reason=FailureReason(reason) if reason is not None else None,
                message=str(data.get("message", "")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a hand-off slot: {exc!r}") from exc


class Outcome(enum.StrEnum):
    """What accepting a version meant for one target."""

    PENDING = "pending"
    """New here: the target's loop will load it."""
    DUPLICATE = "duplicate"
    """Accepted here before (a replayed or re-sent completion): nothing to do."""
    REFUSED = "refused"
    """New, but it cannot be served anywhere (no adapter, or no path a server can read)."""


@dataclass(frozen=True, slots=True)
class Intake:
    """What accepting one version changed: persist `changed`, then act on `outcomes`."""

    changed: Mapping[SlotKey, Slot] = field(default_factory=lambda: MappingProxyType({}))
    outcomes: Mapping[SlotKey, Outcome] = field(default_factory=lambda: MappingProxyType({}))

    def keys(self, outcome: Outcome) -> tuple[SlotKey, ...]:
        """The slots whose outcome is *outcome*, in target order."""
        return tuple(key for key, seen in self.outcomes.items() if seen is outcome)


def accept(ledger: Mapping[SlotKey, Slot], version: Version, targets: Iterable[str]) -> Intake:
    """Make *version* the desired one of its lineage on each of *targets* not yet asked."""
    refusal = refusal_of(version)
    changed: dict[SlotKey, Slot] = {}
    outcomes: dict[SlotKey, Outcome] = {}
    for target in targets:
        key = SlotKey(target=target, rule=version.rule, key=version.key)
        slot = ledger.get(key, Slot())
        if version.lora_name in slot.seen:
            outcomes[key] = Outcome.DUPLICATE
            continue
        seen = (*slot.seen, version.lora_name)[-HISTORY:]
        if refusal is None:
            changed[key] = Slot(
                state=SlotState.PENDING, desired=version, served=slot.served, seen=seen
            )
            outcomes[key] = Outcome.PENDING
        else:
            reason, message = refusal
            changed[key] = Slot(
                state=SlotState.FAILED,
                desired=version,
                served=slot.served,
                seen=seen,
                reason=reason,
                message=message,
            )
            outcomes[key] = Outcome.REFUSED
    return Intake(changed=MappingProxyType(changed), outcomes=MappingProxyType(outcomes))


def refusal_of(version: Version) -> tuple[FailureReason, str] | None:
    """Why *version* can be served by no target, before any call; None if it can be tried."""
    if version.adapter_uri is None:
        return FailureReason.NO_ADAPTER, "the promoted completion names no adapter_uri"
    if version.lora_path is None:
        return (
            FailureReason.ADAPTER_NOT_REACHABLE,
            f"{version.adapter_uri} maps to no path a server can read; "
            "map its prefix in TUNELOOP_HANDOFF_PATHS",
        )
    return None


def pending(ledger: Mapping[SlotKey, Slot], target: str) -> tuple[SlotKey, ...]:
    """The slots of *target* with a version to load, in (rule, key) order."""
    return tuple(
        sorted(
            key
            for key, slot in ledger.items()
            if key.target == target and slot.state is SlotState.PENDING
        )
    )


def loaded(slot: Slot, version: Version) -> Slot:
    """*version* is loaded, listed and answering, and what it replaced is unloaded.

    When a newer version was accepted meanwhile, the slot stays `PENDING` for it, and
    *version* is now the one that newer version replaces.
    """
    if slot.desired != version:
        return replace(slot, served=version.lora_name)
    return replace(slot, state=SlotState.SERVED, served=version.lora_name, reason=None, message="")


def rejected(slot: Slot, version: Version, *, reason: FailureReason, message: str) -> Slot:
    """*version* was refused for good; what was served before stays served.

    A slot whose desired version is already a newer one is left as it is.
    """
    if slot.desired != version:
        return slot
    return replace(slot, state=SlotState.FAILED, reason=reason, message=message)

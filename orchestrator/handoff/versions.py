"""A completion event as the hand-off sees it: a promoted `Version` to serve, or `Skipped`.

Called by the hand-off consumer (`handlers/handoff/`) on every event of the completion topic.
Pure: the event's data and the settings' path map in, a value out.

- Only `io.tuneloop.finetune.completed.v1` with `promoted: true` is served. An event without
  `promoted` (a rule with no `promote:` block, or a worker from before the gate) was never
  judged better than what is served, so it is skipped like `promoted: false`.
- The served name (`lora_name`) is the job name: derived from the rule, the key and the
  window that fired (`orchestrator/jobs/naming.py`), so it is new for every version, the same
  for the same version after any restart, and an RFC 1035 label any server accepts.
- The path given to the server (`lora_path`) is where *the server* reads the adapter, which
  need not be where the trainer wrote it: a `TUNELOOP_HANDOFF_PATHS` prefix maps a URI to the
  server's view (`s3://bucket/adapters/` -> `/mnt/adapters/`, a volume or a bucket mount);
  without a mapping `file://` URIs and absolute paths are used as they are. A published folder
  (`<output_uri>/<job>/`, docs/storage.md) holds the adapter in `adapter/`; an unpublished
  local run names its `adapter/` folder itself.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from orchestrator.events import CloudEvent
from orchestrator.vocabulary.output import EventType

ADAPTER_FOLDER = "adapter"
"""The folder of a published job folder that holds the adapter files (docs/storage.md)."""


class SkipReason(enum.StrEnum):
    """Why an event on the completion topic is not handed off (logged, never published)."""

    NOT_A_COMPLETION = "not-a-completion"
    """Another type on the same topic (`started`, `failed`, the hand-off's own events)."""
    NOT_PROMOTED = "not-promoted"
    """`promoted` is false or absent: the gate did not judge this adapter better."""
    NO_TARGETS = "no-targets"
    """No server is configured for the event's model (nor `*`)."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """An event the hand-off leaves alone, and why."""

    reason: SkipReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Version:
    """One promoted adapter: what each target of its model should serve next."""

    lora_name: str
    """The name it is loaded under and that clients send as `model`: the job name."""
    job: str
    rule: str
    key: str
    """The rule key; (rule, key) is the lineage whose served version this one replaces."""
    model: str
    """The model it adapts: the key of `TUNELOOP_HANDOFF_TARGETS`."""
    adapter_uri: str | None
    """Where the trainer published it (the completion's `adapter_uri`)."""
    lora_path: str | None
    """Where the server reads it; None when `adapter_uri` maps to no path a server can read."""
    completion_id: str
    """The id of the `finetune.completed` event, the cause of what the hand-off publishes."""
    decision_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "lora_name": self.lora_name,
            "job": self.job,
            "rule": self.rule,
            "key": self.key,
            "model": self.model,
            "adapter_uri": self.adapter_uri,
            "lora_path": self.lora_path,
            "completion_id": self.completion_id,
            "decision_id": self.decision_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Version:
        """The inverse of `to_json`.

        Raises:
            ValueError: a member is missing or of the wrong type.
        """
        try:
            return cls(
                lora_name=_text(data["lora_name"]),
                job=_text(data["job"]),
                rule=_text(data["rule"]),
                key=_text(data["key"]),
                model=_text(data["model"]),
                adapter_uri=_optional_text(data.get("adapter_uri")),
                lora_path=_optional_text(data.get("lora_path")),
                completion_id=_text(data["completion_id"]),
                decision_id=_optional_text(data.get("decision_id")),
            )
        except KeyError as exc:
            raise ValueError(f"not a hand-off version: {exc!r} is missing") from exc


def version_of(event: CloudEvent, *, paths: Mapping[str, str]) -> Version | Skipped:
    """The version *event* asks to serve, or why it asks for nothing.

    Args:
        event: an event read from the completion topic, already valid for its type.
        paths: URI prefix -> the serving servers' path prefix (`TUNELOOP_HANDOFF_PATHS`).
    """
    data = event.data
    if event.type != EventType.FINETUNE_COMPLETED or not isinstance(data, Mapping):
        return Skipped(SkipReason.NOT_A_COMPLETION, event.type)
    job = data.get("job")
    if data.get("promoted") is not True:
        detail = "no promotion field" if "promoted" not in data else "promoted: false"
        return Skipped(SkipReason.NOT_PROMOTED, detail)
    if not isinstance(job, str) or not job:
        return Skipped(SkipReason.NOT_A_COMPLETION, "no job name")
    key = _optional_text(data.get("key")) or ""
    adapter_uri = _optional_text(data.get("adapter_uri"))
    return Version(
        lora_name=job,
        job=job,
        rule=_optional_text(data.get("rule")) or "",
        key=key,
        model=_optional_text(data.get("model")) or key,
        adapter_uri=adapter_uri,
        lora_path=serving_path(adapter_uri, job=job, paths=paths) if adapter_uri else None,
        completion_id=event.id,
        decision_id=_optional_text(data.get("decision_id")),
    )


def serving_path(adapter_uri: str, *, job: str, paths: Mapping[str, str]) -> str | None:
    """Where a server reads the adapter published at *adapter_uri*; None if nowhere.

    The longest prefix of *paths* that starts *adapter_uri* is replaced by its value;
    otherwise a `file://` URI (on no host or `localhost`) or an absolute path is the path.
    A folder named after *job* is a published job folder: the adapter is in its `adapter/`.
    """
    matches = [prefix for prefix in paths if adapter_uri.startswith(prefix)]
    if matches:
        prefix = max(matches, key=len)
        path = paths[prefix] + adapter_uri[len(prefix) :]
    elif adapter_uri.startswith("/"):
        path = adapter_uri
    else:
        parsed = urlparse(adapter_uri)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            return None
        path = unquote(parsed.path)
    path = path.rstrip("/") or "/"
    if path.rsplit("/", 1)[-1] == job:
        path = f"{path}/{ADAPTER_FOLDER}"
    return path


def targets_for(targets: Mapping[str, tuple[str, ...]], model: str) -> tuple[str, ...]:
    """The servers of *model*: its own entry of `TUNELOOP_HANDOFF_TARGETS`, else `*`'s."""
    if model in targets:
        return targets[model]
    return targets.get("*", ())


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _optional_text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None

"""The CloudEvent value the core works with.

`handlers/codec.py` is the only place that turns Kafka records into these values (and back);
everything inside the core receives a `CloudEvent` that has already passed the CloudEvents 1.0
attribute rules, so code here never re-validates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

ExtensionValue = str | int | bool
"""CloudEvents extension attributes are strings, integers or booleans on the wire."""


@dataclass(frozen=True, slots=True)
class CloudEvent:
    """One CloudEvents 1.0 event.

    `data` holds the decoded JSON value when the content type is JSON (or absent), the raw
    bytes otherwise. `extensions` keeps every extension attribute exactly as the producer sent
    it. (`source`, `id`) identifies the event, as the spec says.
    """

    id: str
    source: str
    type: str
    specversion: str = "1.0"
    subject: str | None = None
    time: datetime | None = None
    datacontenttype: str | None = None
    dataschema: str | None = None
    data: Any = None
    extensions: Mapping[str, ExtensionValue] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def identity(self) -> tuple[str, str]:
        """(source, id): the pair the spec says is unique per distinct event."""
        return (self.source, self.id)

    def event_time(self, arrived_at: datetime) -> datetime:
        """The time the event happened: its `time` attribute, or when it arrived."""
        return self.time if self.time is not None else arrived_at

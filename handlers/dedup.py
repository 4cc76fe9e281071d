"""The seen-set of the intake: skip an event whose (source, id) was already handled.

Called by stage 2 (the partition lanes) of `handlers/intake.py` for every (key, event)
before the sink.
The entries live in a faust Table (`tuneloop-seen`), whose compacted changelog topic makes
them survive restarts and rebalances: a worker taking over a partition replays the changelog
before it processes a single record, so it knows what the previous owner handled.

Bounded two ways, per partition of the keyed topic:
- TTL: an entry older than `dedup_ttl` is forgotten. Safe because the intake refuses events
  older than `max_age <= dedup_ttl`, so a forgotten duplicate is also too old to pass.
- size: beyond `dedup_max_entries`, the oldest entries are forgotten first.

Forgetting writes a tombstone to the changelog, and faust writes changelog records to the
partition of the event being processed. So each entry stores the partition that owns it and
is only ever forgotten while an event of that same partition is processed; the per-partition
`OrderedDict` index (oldest first) makes that O(1) per forgotten entry instead of a scan.
The index is rebuilt from the table, once per partition, after every rebalance.

The table works with any `MutableMapping[str, list]`, so unit tests use a dict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import MutableMapping
from typing import Any

SEEN_TABLE = "tuneloop-seen"
"""Name of the faust Table (and so of its changelog topic `<app id>-tuneloop-seen-changelog`)."""


def seen_key(key: str, identity: tuple[str, str]) -> str:
    """Table key of one event under one rule key: the spec's identity (source, id), scoped
    by the key because an event routed to two keys is handled once under each."""
    source, event_id = identity
    # \x1f (unit separator) cannot occur in a valid URI-reference source, so this is unambiguous.
    return f"{key}\x1f{source}\x1f{event_id}"


class SeenEvents:
    """Which (key, source, id) were handled, when, and forgetting them in bounded time."""

    def __init__(
        self,
        table: MutableMapping[str, Any],
        *,
        ttl_seconds: float,
        max_entries: int,
    ) -> None:
        self._table = table
        self._ttl = ttl_seconds
        self._max_entries = max_entries
        self._index: dict[int, OrderedDict[str, float]] = {}

    def has_seen(self, entry_key: str, *, now: float) -> bool:
        """Whether *entry_key* was handled less than the TTL ago."""
        entry = self._table.get(entry_key)
        if not entry:
            return False
        seen_at = float(entry[0])
        return now - seen_at < self._ttl

    def remember(self, entry_key: str, *, partition: int, now: float) -> None:
        """Record *entry_key* as handled at *now*, owned by *partition*."""
        self._table[entry_key] = [now, partition]
        index = self._index_of(partition)
        index.pop(entry_key, None)
        index[entry_key] = now

    def forget_old(self, *, partition: int, now: float) -> int:
        """Forget *partition*'s entries past the TTL or beyond the size bound.

        Call only while processing an event of *partition* (see the module docstring).
        Returns how many entries were forgotten.
        """
        index = self._index_of(partition)
        forgotten = 0
        while index:
            oldest_key, seen_at = next(iter(index.items()))
            if now - seen_at < self._ttl and len(index) <= self._max_entries:
                break
            del index[oldest_key]
            if oldest_key in self._table:
                del self._table[oldest_key]
            forgotten += 1
        return forgotten

    def reset_index(self) -> None:
        """Drop the in-memory index (after a rebalance); it is rebuilt from the table."""
        self._index.clear()

    def _index_of(self, partition: int) -> OrderedDict[str, float]:
        index = self._index.get(partition)
        if index is None:
            owned = [
                (float(entry[0]), key)
                for key, entry in self._table.items()
                if entry and int(entry[1]) == partition
            ]
            owned.sort()
            index = OrderedDict((key, seen_at) for seen_at, key in owned)
            self._index[partition] = index
        return index

    def __len__(self) -> int:
        return len(self._table)

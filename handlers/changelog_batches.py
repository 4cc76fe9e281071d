"""Table writes made while a partition lane handles a batch of records reach the changelog
once per key, straight through the producer, when the lane closes the batch.

faust sends every Table write as its own changelog record through its producer buffer: a
`FutureMessage`, a queue hand-off to the buffer's task, a sensor round and a callback per
write, and a lane that outruns that task waits on faust's one-message-at-a-time flush
(`ProducerBuffer.wait_until_ebb`, 4.6 % of the worker's CPU in the profile of
docs/performance.md before this module). Stage 2 writes two or more Table entries per event
(the seen-set and the rule state), so the lanes (`handlers/partition_lanes.py`) open a
`ChangelogBatch` around the records they handle together; every worker Table is a
`BatchedChangelogTable` (`handlers/faust_app.py` makes it the App's Table class), which
updates its data at once, as faust does, and leaves the changelog record to the batch.

Closing the batch (`ChangelogBatch.send`) hands the producer the *last* value of each
(table, partition, key) written in it: a compacted changelog keeps only that one, and a
worker recovering a partition replays only that one. Only then does the lane acknowledge the
batch's records, so faust's commit, which flushes the producer first, never covers a record
whose Table writes are not on their way. A crash before that loses the batch's writes and
its offsets together: the records are read again from the committed offset and handled from
the state before the batch.

The tables named `written_last` (the seen-set) go after all the others. A record in the
seen-set means "this event's effects are kept"; if the worker dies between two produce
requests, a partial batch must never keep the seen-mark of an event without the rule state
that counted it.

A write made where no batch is open (a timer, the job watch, a task the handler left
running after its batch was sent) goes through faust's own path, unchanged.

Only in-memory stores (`store="memory://"`, the worker's): faust's RocksDB store records
the offset of every changelog write it sent (`Table._on_changelog_sent`), which a direct
send skips; `BatchedChangelogTable` refuses any other store.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import faust

from orchestrator.errors import ConfigError

_open_batch: contextvars.ContextVar[ChangelogBatch | None] = contextvars.ContextVar(
    "tuneloop_changelog_batch", default=None
)


class ChangelogBatch:
    """The changelog records owed by the Table writes of one lane batch, one per key."""

    def __init__(self, written_last: frozenset[str] = frozenset()) -> None:
        self._written_last = written_last
        self._pending: dict[tuple[str, int, Any], tuple[BatchedChangelogTable, Any, Any]] = {}
        self.closed = False

    def add(
        self, table: BatchedChangelogTable, partition: int, key: Any, value: Any, serializer: Any
    ) -> None:
        """Owe *table*'s changelog the record (*key*, *value*) on *partition*, replacing what
        this batch owed it for that key."""
        slot = (table.name, partition, key)
        self._pending.pop(slot, None)  # re-inserted: the order is that of the last writes
        self._pending[slot] = (table, value, serializer)

    async def send(self, producer: Any) -> None:
        """Hand every owed record to *producer* (faust's), the `written_last` tables' after the
        others, each table's in the order of its keys' last writes. Writes made after this go
        through faust's own path."""
        self.closed = True
        pending = list(self._pending.items())
        self._pending.clear()
        first = [entry for entry in pending if entry[0][0] not in self._written_last]
        last = [entry for entry in pending if entry[0][0] in self._written_last]
        for (_, partition, key), (table, value, serializer) in first + last:
            topic = cast(Any, table.changelog_topic)  # a faust Topic; its stub is narrower
            headers = topic.prepare_headers(None)
            key_bytes, headers = topic.prepare_key(key, table.key_serializer, None, headers)
            value_bytes = None
            if value is not None:
                value_bytes, headers = topic.prepare_value(value, serializer, None, headers)
            await producer.send(
                topic.get_topic_name(), key_bytes, value_bytes, partition, None, headers
            )


@contextmanager
def collecting(batch: ChangelogBatch) -> Iterator[None]:
    """Make the Table writes of this task (and of the tasks it starts) go to *batch* until
    the block ends or the batch is sent."""
    token = _open_batch.set(batch)
    try:
        yield
    finally:
        _open_batch.reset(token)


class BatchedChangelogTable(faust.Table[Any, Any]):
    """A faust Table whose writes inside an open `ChangelogBatch` leave their changelog record
    to it (module docstring); elsewhere, faust's Table as it is."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        store = str(self._store or app.conf.store)
        if not store.startswith("memory:"):
            raise ConfigError(
                f"Table {self.name!r}: tuneloop batches changelog writes only for in-memory "
                f"stores ('memory://'), not {store!r}"
            )

    def on_key_set(self, key: Any, value: Any) -> None:
        batch = _open_batch.get()
        partition = None if batch is None or batch.closed else self.partition_for_key(key)
        if batch is None or partition is None:  # None: the producer picks it (use_partitioner)
            super().on_key_set(key, value)
            return
        batch.add(self, partition, key, value, self.value_serializer)
        self._maybe_set_key_ttl(key, partition)
        self._sensor_on_set(self, key, value)

    def on_key_del(self, key: Any) -> None:
        batch = _open_batch.get()
        partition = None if batch is None or batch.closed else self.partition_for_key(key)
        if batch is None or partition is None:
            super().on_key_del(key)
            return
        batch.add(self, partition, key, None, "raw")  # a tombstone, as faust writes it
        self._maybe_del_key_ttl(key, partition)
        self._sensor_on_del(self, key)


__all__ = ["BatchedChangelogTable", "ChangelogBatch", "collecting"]

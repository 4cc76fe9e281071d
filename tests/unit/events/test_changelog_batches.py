"""A lane's batch of records: its Table writes reach the producer once per key, the seen-set's
last, and only then are its records acknowledged. On a real faust App, consumer and Tables
without a broker; the producer is a stand-in that records what it is handed (a real one needs
a broker: tests/integration/test_intake_lanes.py runs the same path on one).
"""

from __future__ import annotations

import json
import weakref
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.streams import _current_event

from handlers.changelog_batches import BatchedChangelogTable, ChangelogBatch, collecting
from handlers.partition_lanes import deliver_in_lanes
from handlers.seek_safe_consumer import use_seek_safe_consumer
from orchestrator.errors import ConfigError
from tests.unit.events.test_seek_safe_consumer import PARTITION, lane_record, until_handled


class ProducerStandIn:
    """Stand-in for faust's producer: records each send in *steps*, queues nothing."""

    def __init__(self, steps: list[tuple[Any, ...]]) -> None:
        self._steps = steps
        self.buffer = self

    async def wait_until_ebb(self) -> None:
        return None

    async def send(
        self, topic: str, key: Any, value: Any, partition: Any, timestamp: Any, headers: Any
    ) -> None:
        self._steps.append(("send", topic.rsplit("-", 2)[-2], json.loads(key), value, partition))


def batching_app(store: str) -> faust.App:
    """An App whose Tables are `BatchedChangelogTable`s, kept in *store*."""
    return faust.App(
        f"batch-test-{store.split(':', maxsplit=1)[0]}",
        broker="kafka://127.0.0.1:1",
        web_enabled=False,
        store=store,
        Table=BatchedChangelogTable,
    )


def app_with_tables(steps: list[tuple[Any, ...]]) -> tuple[faust.App, Any, Any]:
    app = batching_app("memory://")
    use_seek_safe_consumer(app)
    counts = app.Table("counts", default=None, partitions=1, value_type=bytes)
    seen = app.Table("seen", default=None, partitions=1)
    app._producer = ProducerStandIn(steps)
    acknowledge = app.consumer.ack

    def ack(message: Any) -> bool:
        steps.append(("ack", message.offset))
        return bool(acknowledge(message))

    app.consumer.ack = ack
    return app, counts, seen


async def test_a_batch_sends_each_keys_last_value_once_the_seen_set_last_then_acknowledges() -> (
    None
):
    steps: list[tuple[Any, ...]] = []
    app, counts, seen = app_with_tables(steps)

    async def handle(message: Any) -> None:
        key = message.key.decode()
        seen[f"{key}/{message.offset}"] = [1.0, message.partition]  # before the count: on purpose
        counts[key] = str(int(counts.get(key) or b"0") + 1).encode()
        steps.append(("handled", message.offset))

    lanes = deliver_in_lanes(app, PARTITION.topic, handle, written_last=frozenset({"seen"}))
    app.flow_control.resume()
    for offset, key in ((7, b"a"), (8, b"b"), (9, b"a")):
        lanes.offer(lane_record(offset, key=key))
    await until_handled(lanes, 3)
    await lanes.stop()

    assert steps == [
        ("handled", 7),
        ("handled", 8),
        ("handled", 9),
        ("send", "counts", "b", b"1", 0),  # in the order of the keys' last writes
        ("send", "counts", "a", b"2", 0),
        ("send", "seen", "a/7", b"[1.0,0]", 0),
        ("send", "seen", "b/8", b"[1.0,0]", 0),
        ("send", "seen", "a/9", b"[1.0,0]", 0),
        ("ack", 7),
        ("ack", 8),
        ("ack", 9),
    ]
    assert (counts["a"], counts["b"]) == (b"2", b"1")  # the Table itself changed at once


async def test_a_deleted_key_leaves_one_tombstone_and_a_lone_record_is_sent_at_once() -> None:
    steps: list[tuple[Any, ...]] = []
    app, counts, _ = app_with_tables(steps)

    async def handle(message: Any) -> None:
        counts["gone"] = b"1"
        del counts["gone"]

    lanes = deliver_in_lanes(app, PARTITION.topic, handle)
    app.flow_control.resume()
    lanes.offer(lane_record(7, key=b"x"))
    await until_handled(lanes, 1)
    await lanes.stop()

    assert steps == [("send", "counts", "gone", None, 0), ("ack", 7)]


async def test_a_write_where_no_batch_is_open_or_after_its_batch_was_sent_is_fausts_own() -> None:
    steps: list[tuple[Any, ...]] = []
    app, counts, _ = app_with_tables(steps)
    sent_by_faust: list[tuple[Any, Any]] = []

    def faust_send(partition: Any, key: Any, value: Any, *rest: Any) -> Any:
        sent_by_faust.append((key, value))
        return SimpleNamespace(message=SimpleNamespace(partition=partition))

    counts.send_changelog = faust_send
    current = CurrentRecord(lane_record(7, key=b"x"))
    _current_event.set(weakref.ref(current))  # as faust's stream sets it for a table write
    try:
        batch = ChangelogBatch()
        counts["before"] = b"1"  # a timer, the job watch: no batch open
        with collecting(batch):
            counts["inside"] = b"2"
            await batch.send(app.producer)
            counts["after"] = b"3"  # a task the handler left running, after the batch went
    finally:
        _current_event.set(None)

    assert sent_by_faust == [("before", b"1"), ("after", b"3")]
    assert steps == [("send", "counts", "inside", b"2", 0)]


class CurrentRecord:
    """What faust's tables read of the current event."""

    def __init__(self, message: Any) -> None:
        self.message = message


def test_a_table_kept_anywhere_but_in_memory_is_refused_at_declaration() -> None:
    app = batching_app("rocksdb://")
    with pytest.raises(ConfigError, match="in-memory"):
        app.Table("counts", default=None, partitions=1)

"""The mended faust consumer's hand-over rules, on a real faust consumer object without a broker.

The race these rules close needs a rebalance at the wrong moment, so the real-broker guard
(tests/integration/test_intake.py, the restarted-worker test) catches it only now and then;
here each rule is driven directly.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
import faust.transport.consumer
import pytest
from aiokafka import TopicPartition
from faust.types import TP, Message
from intervaltree import IntervalTree

from handlers.partition_lanes import MAX_WAITING, PartitionLanes, deliver_in_lanes
from handlers.seek_safe_consumer import SeekSafeConsumer, use_seek_safe_consumer

PARTITION = TP("in", 0)
"""A stream partition: its records are acknowledged and its offsets committed."""
CHANGELOG = TP("in-table-changelog", 0)
"""A table's changelog partition: nothing is committed for it, only faust's recovery seeks it."""
COMMITTED = 5


@pytest.fixture
async def consumer() -> Any:
    app = faust.App("seek-safe-test", broker="kafka://127.0.0.1:1", web_enabled=False)
    use_seek_safe_consumer(app)
    made = app.consumer

    async def seek_to_committed() -> dict[TP, int]:
        return {PARTITION: COMMITTED}

    made.seek_to_committed = seek_to_committed
    # faust acknowledges (and so commits) a topic's records once a stream subscribes to it
    app.topics.acks_enabled_for = lambda topic: topic == PARTITION.topic  # type: ignore[method-assign]
    return made


def record(offset: int) -> Any:
    return SimpleNamespace(topic=PARTITION.topic, offset=offset, key=None, value=b"{}")


def changelog_record(offset: int) -> Any:
    return SimpleNamespace(topic=CHANGELOG.topic, offset=offset, key=None, value=b"{}")


def test_an_app_builds_its_consumer_from_the_mended_class(consumer) -> None:
    assert isinstance(consumer, SeekSafeConsumer)


async def test_a_handed_over_record_counts_as_read(consumer) -> None:
    handed: list[int] = []

    async def take(message: Any) -> None:
        handed.append(message.offset)

    consumer.callback = take
    assert await consumer._hand_over(PARTITION, record(7), consumer.seeks)
    assert handed == [7]
    assert consumer._read_offset[PARTITION] == 7


async def test_a_hand_over_cut_short_by_a_flow_stop_leaves_the_record_unread(consumer) -> None:
    async def stuck(message: Any) -> None:
        await asyncio.Event().wait()

    consumer.callback = stuck
    consumer._read_offset[PARTITION] = 6
    handing_over = asyncio.ensure_future(consumer._hand_over(PARTITION, record(7), consumer.seeks))
    await asyncio.sleep(0.01)
    consumer.stop_flow()
    assert await handing_over is False
    assert consumer._read_offset[PARTITION] == 6


async def test_a_seek_during_a_hand_over_keeps_the_seeks_read_offset(consumer) -> None:
    async def take_while_seeking(message: Any) -> None:
        await consumer.perform_seek()

    consumer.callback = take_while_seeking
    seeks_before = consumer.seeks
    assert await consumer._hand_over(PARTITION, record(9), seeks_before) is False
    assert consumer._read_offset[PARTITION] == COMMITTED


async def test_a_seek_stops_the_flow_until_the_caller_resumes_it(consumer) -> None:
    await consumer.perform_seek()
    assert consumer.seeks == 1
    assert not consumer.flow_active
    assert consumer._read_offset[PARTITION] == COMMITTED
    consumer.resume_flow()
    assert consumer.flow_active


async def test_a_batch_that_spans_a_seek_is_read_again_from_the_committed_offsets(
    consumer,
) -> None:
    handed: list[int] = []

    async def take(message: Any) -> None:
        handed.append(message.offset)
        if message.offset == 11:
            await consumer.perform_seek()

    async def batch() -> Any:
        for offset in (10, 11, 12, 13):
            yield PARTITION, record(offset)

    consumer.callback = take
    await consumer._hand_over_batch(batch(), consumer.seeks)
    assert handed == [10, 11]
    assert consumer.seeks == 2  # the seek in the middle, then the batch's own seek back
    assert consumer._read_offset[PARTITION] == COMMITTED


async def test_a_batch_cut_short_by_a_flow_stop_is_read_again_from_the_committed_offsets(
    consumer,
) -> None:
    async def stop_at_11(message: Any) -> None:
        if message.offset == 11:
            consumer.stop_flow()
            await asyncio.Event().wait()

    async def batch() -> Any:
        for offset in (10, 11, 12):
            yield PARTITION, record(offset)

    consumer.callback = stop_at_11
    await consumer._hand_over_batch(batch(), consumer.seeks)
    assert consumer.seeks == 1
    assert consumer._read_offset[PARTITION] == COMMITTED


async def test_changelog_records_fetched_across_a_seek_are_handed_over_stream_records_read_again(
    consumer,
) -> None:
    # What a restarted worker met in CI: the batch was fetched while a rebalance had stopped
    # the flow; meanwhile the end of the previous recovery sought the stream partitions to
    # their committed offsets, and the new recovery resumed the flow. The changelog records
    # were dropped with the stream records, nothing read them again, and the recovery waited
    # for them forever.
    handed: list[tuple[str, int]] = []

    async def take(message: Any) -> None:
        handed.append((message.topic, message.offset))

    async def batch() -> Any:
        yield CHANGELOG, changelog_record(0)
        yield PARTITION, record(10)
        yield CHANGELOG, changelog_record(1)

    consumer.callback = take
    fetched_at = consumer.seeks
    await consumer.perform_seek()
    consumer.resume_flow()
    await consumer._hand_over_batch(batch(), fetched_at)

    assert handed == [(CHANGELOG.topic, 0), (CHANGELOG.topic, 1)]
    assert consumer._read_offset[CHANGELOG] == 1
    assert consumer.seeks == 2  # the seek, then the batch's own seek back for record 10
    assert consumer._read_offset[PARTITION] == COMMITTED


async def test_a_record_waiting_for_room_in_a_queue_that_faust_clears_is_not_handed_over(
    consumer,
) -> None:
    full = consumer.app.FlowControlQueue(maxsize=1, clear_on_resume=True)
    consumer.app.flow_control.resume()
    await full.put(object())

    async def into_the_full_queue(message: Any) -> None:
        await full.put(message)

    consumer.callback = into_the_full_queue
    consumer._read_offset[CHANGELOG] = 6
    handing_over = asyncio.ensure_future(
        consumer._hand_over(CHANGELOG, changelog_record(7), consumer.seeks)
    )
    await asyncio.sleep(0.01)
    # what faust does when partitions are revoked, in one step: the queue cancels the wait
    consumer.stop_flow()
    consumer.app.flow_control.suspend()
    consumer.app.flow_control.clear()

    assert await handing_over is False  # and the fetch loop goes on: no CancelledError
    assert consumer._read_offset[CHANGELOG] == 6


async def test_a_record_behind_the_read_offset_is_not_handed_over_again(consumer) -> None:
    handed: list[int] = []

    async def take(message: Any) -> None:
        handed.append(message.offset)

    consumer.callback = take
    consumer._read_offset[PARTITION] = 8
    assert await consumer._hand_over(PARTITION, record(7), consumer.seeks)
    assert handed == []


class ConsumerThreadStandIn:
    """Stands in for faust's consumer thread (and the broker behind it): the committed offsets
    and first offsets its aiokafka consumer reports, and the offsets it is sent to. It has no
    `seek_to_beginning`, whose pending reset left a partition with no position, which
    crashed faust's livelock check."""

    def __init__(self, committed: dict[TP, int | None], first: dict[TP, int]) -> None:
        self.committed = committed
        self.first = first
        self.sought: dict[TP, int] = {}

    async def seek_to_committed(self) -> dict[TP, int | None]:
        return self.committed

    async def earliest_offsets(self, *partitions: TP) -> dict[TP, int]:
        return {tp: self.first[tp] for tp in partitions}

    def seek(self, partition: TP, offset: int) -> None:
        self.sought[partition] = offset


async def test_a_stream_partition_with_nothing_or_zero_committed_is_read_again_from_its_start() -> (
    None
):
    # aiokafka seeks only where more than 0 is committed; a batch abandoned on such a partition
    # was never read again (a fresh group's first records lost)
    app = faust.App("seek-safe-start", broker="kafka://127.0.0.1:1", web_enabled=False)
    use_seek_safe_consumer(app)
    consumer: Any = app.consumer
    nothing, zero, five, changelog = TP("in", 0), TP("in", 1), TP("in", 2), TP("changelog", 0)
    # retention has removed the first 3 records of the partition with nothing committed
    thread = ConsumerThreadStandIn(
        {nothing: None, zero: 0, five: 5, changelog: None},
        first={nothing: 3, zero: 0, five: 0, changelog: 0},
    )
    consumer._thread = thread
    app.topics.acks_enabled_for = lambda topic: topic == "in"  # type: ignore[method-assign]

    await consumer.perform_seek()

    assert thread.sought == {nothing: 3, zero: 0}  # not a table's changelog
    assert consumer._read_offset[nothing] is None
    assert consumer._read_offset[zero] == 0
    assert consumer._read_offset[five] == 5


def lane_record(offset: int, *, key: bytes | None = None) -> Any:
    """A faust Message of the lane topic, fetched in the consumer's first generation."""
    return Message(
        PARTITION.topic,
        PARTITION.partition,
        offset,
        0.0,
        0,
        [],
        key,
        b"{}",
        None,
        tp=TopicPartition(PARTITION.topic, PARTITION.partition),  # aiokafka's, as fetched
        generation_id=0,
    )


@pytest.fixture
def lanes_and_handled(consumer) -> tuple[PartitionLanes, list[int]]:
    handled: list[int] = []

    async def handle(message: Any) -> None:
        handled.append(message.offset)

    lanes = deliver_in_lanes(consumer.app, PARTITION.topic, handle)
    consumer.app.flow_control.resume()
    return lanes, handled


async def test_a_record_of_a_lane_topic_is_handled_in_its_lane_and_counts_as_read(
    consumer, lanes_and_handled
) -> None:
    lanes, handled = lanes_and_handled
    consumer._read_offset[PARTITION] = 6
    for offset in (7, 8):
        assert await consumer._hand_over(PARTITION, lane_record(offset), consumer.seeks, lanes)
    assert consumer._read_offset[PARTITION] == 8
    await until_handled(lanes, 2)
    assert handled == [7, 8]


async def test_a_lane_record_fetched_before_a_seek_is_not_offered(
    consumer, lanes_and_handled
) -> None:
    lanes, _ = lanes_and_handled
    consumer._read_offset[PARTITION] = 6
    fetched_at = consumer.seeks
    await consumer.perform_seek()
    consumer.resume_flow()
    assert await consumer._hand_over(PARTITION, lane_record(7), fetched_at, lanes) is False
    assert lanes.waiting() == 0
    assert consumer._read_offset[PARTITION] == COMMITTED


async def test_a_lane_record_waits_while_the_app_suspends_and_is_dropped_when_the_consumer_stops(
    consumer, lanes_and_handled
) -> None:
    lanes, _ = lanes_and_handled
    consumer._read_offset[PARTITION] = 6
    consumer.app.flow_control.suspend()  # a rebalance begins: the App stops before the consumer
    handing_over = asyncio.ensure_future(
        consumer._hand_over(PARTITION, lane_record(7), consumer.seeks, lanes)
    )
    await asyncio.sleep(0.01)
    assert not handing_over.done()
    consumer.stop_flow()
    assert await handing_over is False
    assert lanes.waiting() == 0
    assert consumer._read_offset[PARTITION] == 6


async def test_records_waiting_in_a_lane_are_dropped_when_partitions_are_revoked(
    consumer,
) -> None:
    release = asyncio.Event()
    handled: list[int] = []

    async def handle(message: Any) -> None:
        await release.wait()
        handled.append(message.offset)

    lanes = deliver_in_lanes(consumer.app, PARTITION.topic, handle)
    consumer.app.flow_control.resume()
    for offset in (7, 8, 9):
        lanes.offer(lane_record(offset))
    await asyncio.sleep(0.01)  # 7 is in hand, 8 and 9 wait
    # what faust does when partitions are revoked: suspend, then clear the queues it manages
    consumer.app.flow_control.suspend()
    consumer.app.flow_control.clear()
    assert lanes.waiting() == 0
    release.set()
    await lanes.stop()
    assert handled == [7]  # 8 and 9 were never tracked: read again from the committed offset


async def until_handled(lanes: PartitionLanes, count: int) -> None:
    async with asyncio.timeout(5):
        while lanes.handled < count:
            await asyncio.sleep(0.01)


async def test_a_full_lane_takes_its_partition_out_of_the_fetch_until_it_is_down_to_a_quarter(
    consumer,
) -> None:
    release = asyncio.Event()

    async def handle(message: Any) -> None:
        await release.wait()

    lanes = deliver_in_lanes(consumer.app, PARTITION.topic, handle)
    consumer.app.flow_control.resume()
    consumer._set_active_tps({PARTITION})
    fetched = TopicPartition(PARTITION.topic, PARTITION.partition)  # aiokafka's, as fetched
    for offset in range(MAX_WAITING + 1):
        assert await consumer._hand_over(fetched, lane_record(offset), consumer.seeks, lanes)
    await asyncio.sleep(0)
    assert PARTITION not in consumer._get_active_partitions()  # faust's own bookkeeping
    release.set()
    async with asyncio.timeout(5):
        while lanes.waiting() > MAX_WAITING // 4 - 2:
            await asyncio.sleep(0)
    assert PARTITION in consumer._get_active_partitions()
    await lanes.stop()


GAPS = [(3, 3), (5, 6), (9, 9), (4, 5), (12, 14), (13, 20), (8, 10), (30, 31), (2, 2), (30, 31)]
"""Gaps as the fetch loop reports them (first and last missing offset): apart, touching,
overlapping, nested and repeated ones."""


async def test_gaps_are_kept_as_fausts_own_add_gap_keeps_them(consumer) -> None:
    ours, fausts = TP("in", 1), TP("in", 2)
    consumer._committed_offset[ours] = consumer._committed_offset[fausts] = 2
    for first, last in GAPS:
        await consumer._add_gap(ours, first, last)
        await faust.transport.consumer.Consumer._add_gap(consumer, fausts, first, last)
    assert sorted(consumer._gap[ours]) == sorted(consumer._gap[fausts])
    # intervals exclude their end; touching ones stay apart; 2 is below the committed offset
    assert sorted((gap.begin, gap.end) for gap in consumer._gap[ours]) == [
        (3, 4),
        (4, 7),
        (8, 11),
        (12, 21),
        (30, 32),
    ]


async def test_a_gap_that_overlaps_none_held_is_added_without_rebuilding_the_tree(
    consumer,
) -> None:
    rebuilds: list[int] = []

    class CountedTree(IntervalTree):
        def merge_overlaps(self, *args: Any, **kwargs: Any) -> None:
            rebuilds.append(len(self))
            super().merge_overlaps(*args, **kwargs)

    consumer._gap[PARTITION] = CountedTree()
    for offset in range(10, 200, 2):  # a marker after every record: one-record transactions
        await consumer._add_gap(PARTITION, offset, offset)
    assert rebuilds == []
    assert len(consumer._gap[PARTITION]) == 95
    await consumer._add_gap(PARTITION, 11, 12)  # overlaps the gap at 12
    assert rebuilds == [96]
    assert (11, 13) in {(gap.begin, gap.end) for gap in consumer._gap[PARTITION]}

"""faust's Kafka consumer, mended so that a record read around a seek is never skipped.

`handlers/faust_app.py` installs it on every App with `use_seek_safe_consumer(app)`. Pinned
to the faust-streaming release `FAUST_RELEASE` (pyproject.toml): it replaces faust's fetch
loop and wraps its seek.

What goes wrong without it (faust-streaming 0.15.3; seen in the restarted-worker test of
tests/integration/test_intake.py once in 10 to 40 runs, more often on a loaded machine, and
as launches lost without a decision in the kill -9 soak; docs/guarantees.md has the traces):

1. When a worker (re)joins its group, faust's recovery resumes the input partitions, then
   seeks them to their committed offsets, then resumes flow control. The fetcher is already
   running by then, so records can reach a stream's queue before the seek or between the seek
   and the resume. Resuming flow control empties every stream queue, and those records are
   gone: nothing reads them again, because the consumer's read position is past them.
2. faust's fetch loop sets its "read up to" offset after handing a record over, even when the
   hand-over was cut short by a flow stop, and even when a seek happened meanwhile. A seek's
   reset of that offset is then overwritten, and the records after the seek position are
   dropped as already read ("DROPPED MESSAGE ROFF" in faust's developer log).
3. faust commits past one unacknowledged record at the head of a partition (it allows one
   offset for a transaction marker), so a record lost by 1 or 2 is also committed as done,
   and a restart does not bring it back.

The mend:

- `perform_seek` stops the consumer's flow before it seeks. Every caller in faust resumes the
  flow itself, after flow control (which empties the queues), so nothing is handed to a stream
  between the seek and the point where the queues are known empty.
- The fetch loop (faust's own, otherwise unchanged) counts seeks. It stops handing over a
  batch's stream records when a seek happened since the batch was fetched (the records may be
  from before it, and the read offset is the seek's now, which the gap check would misread),
  and it stops the whole batch when a hand-over was cut short; such a record does not move the
  read offset. It then seeks to the committed offsets once more, because it cannot tell
  whether the fetch that returned the batch ran before the seek (the records come again
  anyway) or after it (they would not).
- A seek to the committed offsets moves only the stream partitions: a table's changelog has
  nothing committed, and only faust's recovery positions it. So a changelog record is still
  handed over after such a seek. Dropping it lost it for good, since nothing reads a changelog
  again before the next rebalance; when the lost records were the rest of a partition that a
  recovery was reading, the recovery waited for them forever (seen in CI: a worker restarted
  in the kill -9 and two-worker fault suites stood still with "No event received for active
  tp" on some changelog partitions; docs/guarantees.md has the sequence, reconstructed from
  faust's code).
- A record waiting to enter a full faust queue is not delivered when faust clears its queues
  (at a revoke, and when its flow control resumes): the queue cancels the wait. That counts
  as a hand-over cut short. Before, the cancellation escaped the fetch loop and ended it
  (faust restarts its fetcher only when it sees a rebalance in progress).

- Seeking "to the committed offsets" puts a stream partition with none committed, or 0, back
  at its start. aiokafka 0.14's `seek_to_committed` seeks only to an offset above 0 and leaves
  the others where the fetcher is. So a batch abandoned on such a partition was never read
  again: a fresh group's first records, already fetched, were lost for good (seen: a worker
  started beside `tuneloop emit` on a new broker handled none of its first 3 events; the
  consumer's position was 5 of 5 on the keyed partition, nothing handed over; also the
  "record waiting at offset 0" that `tuneloop partitions grow` guards against).

The keyed topic of the intake is not handed to a faust stream at all: its records go to
the partition lanes of `handlers/partition_lanes.py`, one queue and one task per partition,
under the same rules (a record is offered only while the flow is on and no seek came since
its fetch, and counts as read once offered).

A record read twice is at-least-once delivery, which the intake already absorbs: the seen-set
skips the second copy (see docs/guarantees.md).

One more change, for speed: the consumer's fetch waits at most `FETCH_MAX_WAIT_MS` for data,
not faust's hard-coded 1,500 ms. Stage 1 writes the keyed topic in transactions, and a fetch
that reached the end of one transaction was held by the broker for up to that long although
the next transaction's records were already there (seen: the keyed agent stood still 1.28 s
after the first 500 of 3,000 events, intake bench 1,070 events/s; 2,260/s with 100 ms).

One more for speed: a gap in a partition's offsets (a transaction marker: stage 1 writes
the keyed topic in transactions, so at a few events per transaction nearly every record
follows one) is added to faust's per-partition `IntervalTree` of gaps without rebuilding the
tree, unless the new gap overlaps one it holds (`_add_gap`). faust rebuilds it on every gap
(`merge_overlaps`), which costs O(n log n) in the gaps held until the next commit chops them:
17 % of the worker's main-thread CPU at 100 launching events/s (a `cProfile` on CPU time
during `bench/endtoend.py`'s 100/s phase, 0.95 s of 5.5 s). Gaps that overlap nothing leave
nothing to merge, so the tree is the same either way.

And one for stopping: the final commit of a stopping consumer gives up after
`FINAL_COMMIT_SECONDS`. aiokafka retries a commit until the group's coordinator answers, so
with the broker gone a worker never finished stopping (seen: the getting-started page stops
its worker and its broker together, and the worker hung at SIGTERM for good). What it could
not commit is read again by the next worker, which the seen-set absorbs. The consumer thread's
stop also survives an aiokafka slip in that state (`_PromptFetchThread.on_thread_stop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any, cast

import faust
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from mode import Service

from handlers.partition_lanes import PartitionLanes, lanes_of

FAUST_RELEASE = "0.15.3"
"""The faust-streaming release whose fetch loop `_SeekSafeConsumer` copies and whose seek it
wraps. pyproject.toml pins exactly this release, and tests/unit/test_faust_release.py fails
on any other: a new faust may change the loop this module replaces, so a bump means reading
faust's diff of `faust/transport/consumer.py` and mending this copy first."""

FETCH_MAX_WAIT_MS = 100
"""The longest a fetch of the worker's faust consumer waits for records (module docstring)."""

FINAL_COMMIT_SECONDS = 10.0
"""The longest a stopping consumer waits for its final commit (module docstring)."""

YIELD_EVERY = 100
"""Records handed over between two forced returns to the event loop (as faust does)."""


def use_seek_safe_consumer(app: faust.App) -> None:
    """Make *app* build its Kafka consumer from `SeekSafeConsumer` (before the app starts)."""
    transport = cast(Any, app.transport)
    if not issubclass(SeekSafeConsumer, transport.Consumer):
        raise TypeError(
            f"the seek-safe consumer mends faust's aiokafka consumer; this app's transport "
            f"uses {transport.Consumer!r}"
        )
    transport.Consumer = SeekSafeConsumer


class SeekSafeConsumer(AIOKafkaConsumer):
    """faust's aiokafka consumer that never skips a record around a seek (module docstring)."""

    seeks: int = 0
    """How many times the consumer seeked its stream partitions to their committed offsets."""

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return _PromptFetchThread(self, loop=self.loop, beacon=self.beacon)

    async def on_stop(self) -> None:
        for lanes in lanes_of(self.app).values():
            await lanes.stop()  # the records in hand are acknowledged before the final commit
        try:
            async with asyncio.timeout(FINAL_COMMIT_SECONDS):
                await super().on_stop()  # commits what the streams acknowledged
        except TimeoutError:
            self.log.warning(
                "Final commit gave up after %.0f s (broker unreachable?): "
                "the next worker reads those records again",
                FINAL_COMMIT_SECONDS,
            )
            cast(Any, self.transport)._topic_waiters.clear()  # as faust's on_stop ends

    async def seek_to_committed(self) -> Mapping[Any, int]:
        committed = await super().seek_to_committed()
        # mended: aiokafka seeks only where more than 0 is committed (module docstring); a
        # stream partition with 0 or nothing committed goes back to its start, as a fresh
        # group's `auto_offset_reset="earliest"` would read it
        topics = self.app.topics
        from_start = [
            tp
            for tp, offset in committed.items()
            if not offset and topics.acks_enabled_for(tp.topic)
        ]
        if from_start:
            # to the start's offset itself, not aiokafka's seek_to_beginning: that one leaves
            # the partition with no position until its fetcher resolves the reset, and faust's
            # livelock check, reading the position meanwhile, crashed the worker on aiokafka's
            # `assert self._position is not None` (seen in CI: a worker restarted mid-sweep)
            thread = cast(Any, self)._thread
            starts = await thread.earliest_offsets(*from_start)
            for tp in from_start:
                thread.seek(tp, starts[tp])
        return committed

    async def perform_seek(self) -> None:
        # Stop handing records over first: faust's callers resume the flow only after flow
        # control has emptied the stream queues, so no record slips into a queue in between.
        self.stop_flow()
        self.seeks += 1
        await super().perform_seek()

    async def _add_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        """faust's `_add_gap`, rebuilding the tree only when there is something to merge
        (module docstring): the same gaps, in a tree whose intervals never overlap."""
        committed = self._committed_offset[tp]
        gaps = self._gap[tp]
        if committed is not None:
            offset_from = max(offset_from, committed + 1)
        if offset_from > offset_to:
            return
        end = offset_to + 1  # intervaltree intervals exclude their end
        if not gaps.overlaps(offset_from, end):
            gaps.addi(offset_from, end)
            return
        gaps.addi(offset_from, end)
        # as faust does: let other coroutines (the health check) run before the rebuild
        await asyncio.sleep(0)
        gaps.merge_overlaps()

    async def _drain_messages(self, fetcher: Any) -> None:
        # faust 0.15.3's Consumer._drain_messages, split in three; the changes are marked
        # "mended" in _hand_over_batch and _hand_over.
        consumer_should_stop = cast(Service, self)._stopped.is_set
        fetcher_should_stop = cast(Service, fetcher)._stopped.is_set
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                seeks_before = self.seeks
                batch = cast(AsyncGenerator[tuple[Any, Any], None], self.getmany(timeout=1.0))
                # faust: getmany can return at once, again and again; let others run
                await self.sleep(0)
                if not self.should_stop:
                    await self._hand_over_batch(batch, seeks_before)
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)

    async def _hand_over_batch(
        self, batch: AsyncGenerator[tuple[Any, Any], None], seeks_before: int
    ) -> None:
        abandoned = False
        stream_records_left = False
        since_yield = 0
        lanes = lanes_of(self.app)
        moved_by_seeks = self.app.topics.acks_enabled_for  # the stream topics (module docstring)
        try:
            async for tp, message in batch:
                since_yield += 1
                if since_yield > YIELD_EVERY:
                    await asyncio.sleep(0)
                    since_yield = 0
                stream_record = moved_by_seeks(message.topic)
                # mended: checked before the gap check, which would otherwise compare this
                # record with the read offset a seek has just reset
                if stream_record and (stream_records_left or self.seeks != seeks_before):
                    stream_records_left = True
                    continue
                if not await self._hand_over(tp, message, seeks_before, lanes.get(message.topic)):
                    if stream_record and self.flow_active:  # a seek came during its hand-over
                        stream_records_left = True
                        continue
                    abandoned = True
                    break
        finally:
            await batch.aclose()
        if (abandoned or stream_records_left) and not self.should_stop:
            await self._read_again_from_committed()

    async def _read_again_from_committed(self) -> None:
        """Seek to the committed offsets without touching the flow (faust's own seek)."""
        self.seeks += 1
        try:
            await super().perform_seek()
        except Exception as exc:  # e.g. nothing assigned mid-rebalance, whose recovery seeks
            self.log.warning("Seek back to committed offsets failed: %r", exc)

    async def _hand_over(
        self,
        tp: Any,
        message: Any,
        seeks_before: int,
        lanes: PartitionLanes | None = None,
    ) -> bool:
        """Give *message* to its partition's lane, or else to faust's streams; False: stop
        this batch, it is to be read again."""
        offset = message.offset
        read = self._read_offset[tp]
        if read is not None and offset < read:
            self.log.dev("DROPPED MESSAGE ROFF %r: k=%r v=%r", offset, message.key, message.value)
            return True
        if read and offset - read > 1 and self.app.topics.acks_enabled_for(message.topic):
            # offsets with no record (transaction markers, compaction) count as done
            await self._add_gap(tp, read + 1, offset)
        if self._commit_every is not None and self._n_acked >= self._commit_every:
            self._n_acked = 0
            await self.commit()
        if lanes is not None:
            if not self._offer_to_lane(lanes, message, seeks_before):
                flow_control = self.app.flow_control
                if flow_control.is_active() or not self.flow_active:
                    return False
                # the App suspended its flow but not yet the consumer's (a rebalance begins):
                # wait as faust's hand-over does, for either to decide
                await self.wait_first(flow_control.acquire(), self.suspend_flow.wait())
                if not self._offer_to_lane(lanes, message, seeks_before):
                    return False
        else:
            handing_over = asyncio.ensure_future(self._deliver(message))
            outcome = await self.wait_first(handing_over, self.suspend_flow.wait())
            if handing_over not in outcome.done or not handing_over.result():
                # mended: faust counted the record as read even when a flow stop cut the
                # hand-over short
                return False
            if self.seeks != seeks_before and self.app.topics.acks_enabled_for(message.topic):
                # mended: ... or a seek happened meanwhile, overwriting the seek's offset
                return False
        self._read_offset[tp] = offset
        return True

    async def _deliver(self, message: Any) -> bool:
        """faust's delivery of *message* to its streams and tables; False: a queue clear
        cancelled its wait for room in a full queue, so it was not delivered."""
        try:
            await self.callback(message)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the hand-over itself is cancelled (a flow stop came first, or a stop)
            return False  # mended: faust cancels the waits of a queue it clears (docstring)
        return True

    def _offer_to_lane(self, lanes: PartitionLanes, message: Any, seeks_before: int) -> bool:
        """Queue *message* on its lane if the flow is on and no seek came since its fetch."""
        if not (self.flow_active and self.app.flow_control.is_active()):
            return False
        if self.seeks != seeks_before:
            return False
        lanes.offer(message)
        return True


class _PromptFetchThread(AIOKafkaConsumerThread):
    """faust's consumer thread, whose aiokafka consumer waits `FETCH_MAX_WAIT_MS` per fetch."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # faust passes fetch_max_wait_ms=1500 with no setting to change it; aiokafka reads this
        # attribute when start() builds the fetcher, which comes after this.
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer

    async def on_thread_stop(self) -> None:
        try:
            await super().on_thread_stop()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this stop itself was cancelled
            # aiokafka 0.14's Fetcher.close awaits the fetch requests it cancels without
            # catching their CancelledError (seen with the broker gone). It escaped this stop,
            # the thread never said it had stopped, and mode waited out its 60 s stop timeout.
            # The consumer had left its group and closed its fetcher; its client is left.
            consumer = cast(Any, self)._consumer
            if consumer is not None:
                await consumer._client.close()

"""Stage 2's delivery: the seek-safe consumer hands each keyed record straight to a lane of
its partition, one task per partition works its lane in order. No faust agent, stream or
per-record queue stands in between.

Installed by `handlers/intake.py` with `deliver_in_lanes(app, topic, handle)`; the fetch loop
of `handlers/seek_safe_consumer.py` calls `offer(message)` for each record of that topic
it reads, and stops the lanes when it stops.

Why not faust's agent: a faust stream hands a record over through the conductor (flow control,
producer back-pressure, decoding into an `Event`, a queue per agent), then wakes the agent's
task, which tracks, acknowledges and reports it through the sensors, one record at a time.
That machinery alone capped a no-op agent at ~5,300 records/s on the benchmark machine, ~4x
below what the worker's own work allows (`make bench`, docs/performance.md). A lane keeps
what the intake relies on and drops the rest:

- **Order and isolation per partition.** One task per keyed partition, as faust's
  `isolated_partitions` agent ran one actor per partition: the records of one key are handled
  in order, one at a time, and a launch waiting on the API server holds up only its own
  partition.
- **At-least-once.** A record is tracked when its handling starts and acknowledged once its
  batch is closed (below), so faust commits an offset only once every record before it was
  handled, after flushing the producer (changelog writes, dead letters, audit records).
- **Batches.** A lane handles up to `BATCH_RECORDS` records together: their Table writes
  reach the changelog once per key when the batch closes, straight to the producer, and only
  then are the records acknowledged (`handlers/changelog_batches.py`). A lane that runs dry
  closes its batch at once.
- **Rebalances and seeks.** faust clears its queues when it suspends the flow (revoke, stop)
  and when it resumes it; the lanes are registered with the same flow control and are cleared
  with them. A record waiting in a lane was never tracked, so nothing counts it as done: it is
  read again from the committed offset (the seek-safe consumer's guarantee). A lane also
  checks, before each record, that the flow is active and that the record was fetched in the
  consumer's current generation, as faust's stream does.
- **Tables.** faust's tables find the partition of a write from the *current event* of the
  task. A lane sets it to the record it is handling, so a table write goes to the changelog
  partition of the record's partition, as from an agent.
- **Back-pressure.** A lane holding `MAX_WAITING` records takes its partition out of the
  fetch until it is down to a quarter of that (faust's own buffer-full mechanism), and a lane
  waits before each record while faust's producer buffer is over its limit.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import faust
import structlog
from faust.streams import _current_event
from faust.types import TP

from handlers.changelog_batches import ChangelogBatch, collecting

log = structlog.get_logger("tuneloop.lanes")

Handle = Callable[[Any], Awaitable[None]]
"""What a lane does with one record (a faust `Message`); returns once its effects are queued
on faust's producer. Anything it raises stops the worker (it handles the errors it expects)."""

MAX_WAITING = 2_000
"""Records a lane may hold before its partition is taken out of the fetch."""

BATCH_RECORDS = 100
"""Records a lane handles together: their Table writes reach the changelog once per key, then
they are acknowledged, and the lane lets other tasks run. A lane that runs dry closes its
batch at once, so a lone record waits for nothing."""

STOP_SECONDS = 10.0
"""How long stopping waits for the record a lane is handling before it cancels it."""


class PartitionLanes:
    """One lane per partition of one topic, each worked by its own task while it holds
    records (module docstring)."""

    def __init__(
        self, app: faust.App, handle: Handle, *, written_last: frozenset[str] = frozenset()
    ) -> None:
        self._app = app
        self._handle = handle
        self._written_last = written_last
        self._lanes: dict[Any, deque[Any]] = {}
        self._workers: dict[Any, asyncio.Task[None]] = {}
        self._held_back: set[Any] = set()
        self._tps: dict[int, TP] = {}
        self.handled = 0
        """Records handled and acknowledged, all partitions together."""

    def offer(self, message: Any) -> None:
        """Queue *message* (a faust `Message`) behind the others of its partition; its lane's
        task starts if none is running."""
        # faust's own TP: the fetch loop's (and so `message.tp`) is aiokafka's TopicPartition,
        # which faust's partition bookkeeping refuses (it asserts on the type)
        tp = self._tps.get(message.partition)
        if tp is None:
            tp = self._tps[message.partition] = TP(message.topic, message.partition)
        lane = self._lanes.get(tp)
        if lane is None:
            lane = self._lanes[tp] = deque()
        lane.append(message)
        if len(lane) >= MAX_WAITING and tp not in self._held_back:
            self._held_back.add(tp)
            self._app.consumer.on_buffer_full(tp)
        if tp not in self._workers:
            self._workers[tp] = asyncio.get_running_loop().create_task(
                self._work(tp, lane), name=f"tuneloop-lane-{tp.topic}-{tp.partition}"
            )

    def waiting(self) -> int:
        """Records offered and not yet taken up, all partitions together."""
        return sum(len(lane) for lane in self._lanes.values())

    def clear(self) -> None:
        """Drop every waiting record (faust's flow control calls this on suspend and resume):
        none was tracked, so each is read again from the committed offset."""
        for tp, lane in self._lanes.items():
            lane.clear()
            self._let_fetch(tp)

    async def stop(self) -> None:
        """Drop what waits, let each lane finish the record in hand (at most `STOP_SECONDS`),
        then cancel what is left."""
        self.clear()
        workers = list(self._workers.values())
        if not workers:
            return
        _, pending = await asyncio.wait(workers, timeout=STOP_SECONDS)
        for worker in pending:
            worker.cancel()
        if pending:
            log.warning("lanes_cancelled", lanes=len(pending), after_seconds=STOP_SECONDS)
            await asyncio.gather(*pending, return_exceptions=True)

    def _let_fetch(self, tp: Any) -> None:
        if tp in self._held_back:
            self._held_back.discard(tp)
            self._app.consumer.on_buffer_drop(tp)

    async def _work(self, tp: Any, lane: deque[Any]) -> None:
        app = self._app
        consumer = cast(Any, app.consumer)
        flow_control = app.flow_control
        wait_for_producer = app.producer.buffer.wait_until_ebb
        inbound = cast(Any, app.monitor).stream_inbound_time  # faust's stuck-stream check
        let_fetch_below = MAX_WAITING // 4
        batch = ChangelogBatch(self._written_last)
        handled: list[Any] = []
        try:
            while lane:
                message = lane.popleft()
                if (
                    not flow_control.is_active()
                    or message.generation_id != app.consumer_generation_id
                ):
                    # fetched before a rebalance or a seek: read again from the committed offset
                    lane.clear()
                    break
                if len(lane) < let_fetch_below:
                    self._let_fetch(tp)
                await wait_for_producer()
                message.tracked = True
                consumer.track_message(message)
                inbound[tp] = time.monotonic()
                current = _CurrentRecord(message)
                _current_event.set(weakref.ref(cast(Any, current)))
                with collecting(batch):
                    await self._handle(message)
                handled.append(message)
                if len(handled) >= BATCH_RECORDS or not lane:
                    await self._close(tp, batch, handled)
                    batch, handled = ChangelogBatch(self._written_last), []
                    await asyncio.sleep(0)  # a long lane lets the others run
            if handled:  # the flow stopped: what was handled is kept and acknowledged
                await self._close(tp, batch, handled)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # the handler dead-letters what it expects to fail; this is a bug or a dead
            # producer, and skipping the record would lose it: stop the worker, whose
            # successor reads it again
            log.exception("lane_failed", topic=tp.topic, partition=tp.partition)
            await cast(Any, app).crash(exc)
        finally:
            _current_event.set(None)
            if self._workers.get(tp) is asyncio.current_task():
                del self._workers[tp]

    async def _close(self, tp: Any, batch: ChangelogBatch, handled: list[Any]) -> None:
        """Hand the producer the batch's changelog records, then acknowledge its records: an
        offset is committed only after the writes of every record before it are on their way
        (`handlers/changelog_batches.py`)."""
        await batch.send(self._app.producer)
        consumer = cast(Any, self._app.consumer)
        message_out = self._app.sensors.on_message_out
        for message in handled:
            consumer.ack(message)
            message_out(tp, message.offset, message)
        self.handled += len(handled)


class _CurrentRecord:
    """What faust's tables read of the current event: the record (`.message`)."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, message: Any) -> None:
        self.message = message


_registry: weakref.WeakKeyDictionary[Any, dict[str, PartitionLanes]] = weakref.WeakKeyDictionary()


def deliver_in_lanes(
    app: faust.App, topic: str, handle: Handle, *, written_last: frozenset[str] = frozenset()
) -> PartitionLanes:
    """Have *app*'s consumer hand every record of *topic* to *handle*, in lanes per partition.

    Table writes of a batch of records reach the changelog once per key when the batch ends,
    those of the tables named in *written_last* after the others
    (`handlers/changelog_batches.py`).

    The topic must be subscribed by the App (`app.topics.add`) with acknowledgements on, and
    the App must use the seek-safe consumer (`handlers/faust_app.py`), whose fetch loop
    offers the records."""
    lanes = PartitionLanes(app, handle, written_last=written_last)
    _registry.setdefault(app, {})[topic] = lanes
    app.flow_control.manage_queue(cast(Any, lanes))
    return lanes


def lanes_of(app: Any) -> dict[str, PartitionLanes]:
    """The lanes installed on *app*, by topic (empty: every topic goes to faust's streams)."""
    return _registry.get(app, {})

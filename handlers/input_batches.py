"""Stage 1 of the intake: the input topics read in batches, each batch committed in one Kafka
transaction with its forwards and dead letters.

`handlers/intake.py` creates an `InputBatches` for the worker's App and registers it as an
App service (`app.service`), which faust starts once the App has started and recovered its
tables and stops with the App (the worker, `build_intake`, and an App run in-process with
`faust.contrib.asgi.faust_app_running` alike). What to send for a record is
the intake's decision (`_Pipeline.sort_raw`); this module only reads, sends and commits.

- **Its own consumer**, not faust's: a plain `AIOKafkaConsumer` on the worker's loop, in the
  consumer group `<group>-intake` (faust's assignor cannot share a group with a plain
  consumer), reading committed records only, committing nothing by itself. It starts where
  `handlers/input_positions.py` says: the intake group's offset, else the faust group's (a
  worker of the previous version), else earliest.
- **One transaction per fetched batch**: every forward and dead letter of the batch is sent
  through a transactional producer, the batch's next offsets are added to the transaction
  (`send_offsets_to_transaction`) and the transaction is committed. A batch's records and
  its offsets are on the brokers together or not at all, so a record read again after a
  crash or a rebalance was never committed before: a reader of the DLQ or the keyed topic
  that reads committed records sees each dead letter and each forward once.
- **The transactional id** is unique per live process (`transactional_id_for`): group, host,
  pid and a random suffix. A stable id would let a restarted worker fence its predecessor at
  once; with pods that come and go it would need an id per partition (as Kafka Streams had
  before KIP-447), which aiokafka's producer API does not make cheap. The consequence of a
  unique id: a killed worker's open transaction stays open until the broker aborts it after
  `transaction_timeout_ms` (10 s here), and until then read_committed readers of the DLQ
  wait at it. faust reads the keyed topic read_uncommitted, so stage 2 never waits; a
  forward of an aborted batch it already handled comes again, and the seen-set skips it.
- **Errors have one owner, this loop.** A Kafka error inside a batch aborts the transaction
  and reads the batch again from its first offsets after a back-off. When the outcome is
  unknown (the abort failed, the producer is fenced or broken, a commit timed out) the
  producer is replaced by one with the same transactional id, whose start fences the old one
  and settles its transaction, and the assigned partitions are read again from the offsets
  committed after that.
- **Rebalances**: `on_partitions_revoked` waits for the batch in hand (a lock), so a partition
  is never handed over with its transaction open; a batch fetched before a rebalance is
  dropped unprocessed, since the assignment put the positions back at the committed offsets.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from mode import Service

from handlers.codec import Headers, KafkaRecord, RecordInfo, consumed
from handlers.input_positions import committed_positions
from handlers.publishing import RECORD_HEADROOM_BYTES, aiokafka_options, produce_batch_bytes
from orchestrator.settings import KafkaSettings

log = structlog.get_logger("tuneloop.intake")

CONFIRM_SECONDS = 5.0
"""How long a revoke waits for the last committed offsets to be readable."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A record stage 1 sends: a forward to the keyed topic or a dead letter."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """What stage 1 decided for one input record, and what it sends for it."""

    origin: RecordInfo
    sends: tuple[Outgoing, ...]
    unrouted: tuple[str, ...] = ()
    """Ids of events no rule key cared about (nothing is sent for them)."""
    refused: tuple[str, str] | None = None
    """(code, message) when the record is dead-lettered; `sends` is then its dead letter."""


Sort = Callable[[KafkaRecord, RecordInfo], RecordOutcome]
"""What to send for one input record (`_Pipeline.sort_raw`); sends nothing itself."""

Count = Callable[[Sequence[RecordOutcome]], None]
"""Counts and logs the outcomes of a batch once it is committed (`_Pipeline.count`)."""


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How stage 1 reads and commits; the defaults are the worker's."""

    max_records: int = 500
    """Records per fetched batch, so per transaction."""
    fetch_timeout_ms: int = 500
    """How long one fetch waits for records; also how soon a stop is noticed."""
    transaction_timeout_ms: int = 10_000
    """After this the broker aborts a transaction left open (a killed worker's)."""
    backoff_seconds: float = 0.5
    """The first wait after a failed batch; it doubles up to `max_backoff_seconds`."""
    max_backoff_seconds: float = 10.0
    stop_timeout_seconds: float = 30.0
    """How long a stop waits for the batch in hand before cancelling it."""


def intake_group_id(kafka: KafkaSettings) -> str:
    """The consumer group stage 1 reads the input topics in (its committed offsets)."""
    return f"{kafka.group_id}-intake"


def transactional_id_for(kafka: KafkaSettings) -> str:
    """A transactional id no other live process has (see the module docstring)."""
    return f"{intake_group_id(kafka)}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class InputBatches(Service):
    """Reads the input topics in batches and commits each in one transaction (module
    docstring). A `mode.Service`: the faust App starts and stops it.

    Args:
        kafka: brokers, credentials, input topics, group id, record size limit.
        sort: what to send for one record.
        count: counts the outcomes of a committed batch.
        options: batch size, timeouts, back-off.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        sort: Sort,
        count: Count,
        options: BatchOptions | None = None,
        **kwargs: Any,
    ) -> None:
        self.kafka = kafka
        self.sort = sort
        self.count = count
        self.options = options or BatchOptions()
        self.group_id = intake_group_id(kafka)
        self.transactional_id = transactional_id_for(kafka)
        self.batches_committed = 0
        self.batches_failed = 0
        self.assignments = 0
        """Times partitions were assigned to this reader (its group's rebalances)."""
        self._consumer: Any = None
        self._producer: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._lock = asyncio.Lock()
        self._epoch = 0
        self._rewind = False
        self._committed: dict[Any, int] = {}
        """The next offset of each partition as of this reader's last committed batch."""
        super().__init__(**kwargs)

    @property
    def transaction_open(self) -> bool:
        """Whether a batch's transaction is open now (records sent, not yet committed)."""
        manager = getattr(self._producer, "_txn_manager", None)
        return manager is not None and manager.is_in_transaction()

    async def progress(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(end offset, committed offset) of each assigned partition, by (topic, partition):
        the end as a reader of committed records sees it; before anything was committed, the
        log's first offset. Asks the broker."""
        consumer = self._consumer
        if consumer is None or not consumer.assignment():
            return {}
        assigned = sorted(consumer.assignment())
        ends = await consumer.end_offsets(assigned)
        found: dict[tuple[str, int], tuple[int, int]] = {}
        for tp in assigned:
            done = self._committed.get(tp)
            if done is None:
                done = await consumer.committed(tp)
            if done is None:
                done = (await consumer.beginning_offsets([tp]))[tp]
            found[(tp.topic, tp.partition)] = (int(ends[tp]), int(done))
        return found

    # --- lifecycle --------------------------------------------------------------------------

    async def on_start(self) -> None:
        limit = self.kafka.max_event_bytes + RECORD_HEADROOM_BYTES
        consumer = AIOKafkaConsumer(
            group_id=self.group_id,
            client_id=f"{self.group_id}-consumer",
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=max(limit, 1_048_576),
            fetch_max_bytes=max(4 * limit, 52_428_800),
            **aiokafka_options(self.kafka),
        )
        consumer.subscribe(list(self.kafka.topics_in), listener=_Rebalances(self))
        self._consumer = consumer  # before start: the listener may be called during it
        await consumer.start()
        self._closing = False
        self._reader = asyncio.ensure_future(self._read())

    async def on_stop(self) -> None:
        """Finish the batch in hand (or abort it), then leave the group."""
        self._closing = True
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                await asyncio.wait_for(
                    asyncio.shield(reader), timeout=self.options.stop_timeout_seconds
                )
            except TimeoutError:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            except Exception as exc:  # the loop catches its errors; this would be a bug
                log.exception("intake_reader_failed", error=repr(exc))
        await self._drop_producer(abort=True)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await self._confirm_committed(consumer, consumer.assignment())
            try:
                async with asyncio.timeout(self.options.stop_timeout_seconds):
                    await consumer.stop()  # leaves the group: waits on a broker that may be gone
            except Exception as exc:  # the group notices the member gone after its session
                log.warning("intake_consumer_stop_failed", error=repr(exc))

    async def abandon(self) -> None:
        """Stop as a killed worker would (for fault tests): no abort, no commit. What the
        batch in hand sent is left in an open transaction for the broker to abort after
        `transaction_timeout_ms`; its offsets stay uncommitted."""
        self._closing = True
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # flushes what was sent, ends no transaction
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        await self.stop()

    # --- the loop ---------------------------------------------------------------------------

    async def _read(self) -> None:
        failures = 0
        while not self._closing:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one owner retries: this loop, after a back-off
                failures += 1
                self.batches_failed += 1
                delay = min(
                    self.options.max_backoff_seconds,
                    self.options.backoff_seconds * 2 ** (failures - 1),
                )
                log.warning("intake_batch_failed", error=repr(exc), retry_in=delay)
                await asyncio.sleep(delay)
            else:
                failures = 0

    async def _step(self) -> None:
        """Fetch one batch and commit it, after putting the producer and positions right."""
        if self._producer is None:
            await self._start_producer()
        if self._rewind:
            async with self._lock:
                await self._rewind_assigned()
        epoch = self._epoch
        batches = await self._consumer.getmany(
            timeout_ms=self.options.fetch_timeout_ms, max_records=self.options.max_records
        )
        if not batches or self._closing:
            return
        async with self._lock:
            if epoch != self._epoch:
                # The group changed since the fetch: these records may no longer be ours, and
                # the fetch moved the positions past them. Read again from what is committed.
                await self._rewind_assigned()
                return
            await self._commit(batches)

    async def _commit(self, batches: dict[Any, list[Any]]) -> None:
        """One transaction: every record's sends, then the batch's offsets, then commit."""
        outcomes = [
            self.sort(*_consumed(message)) for messages in batches.values() for message in messages
        ]
        producer = self._producer
        step = "sending"
        try:
            async with asyncio.timeout(2 * self.options.transaction_timeout_ms / 1000):
                await producer.begin_transaction()
                deliveries = [
                    await producer.send(
                        send.topic, value=send.value, key=send.key, headers=list(send.headers)
                    )
                    for outcome in outcomes
                    for send in outcome.sends
                ]
                await asyncio.gather(*deliveries)
                step = "adding offsets"
                offsets = {tp: messages[-1].offset + 1 for tp, messages in batches.items()}
                await producer.send_offsets_to_transaction(offsets, self.group_id)
                step = "committing"
                await producer.commit_transaction()
        except Exception as exc:  # a Kafka error, a timeout, a transaction in the wrong state
            log.warning("intake_transaction_failed", step=step, error=repr(exc))
            await self._give_up_batch(batches)
            raise
        self._committed.update(offsets)
        self.batches_committed += 1
        self.count(outcomes)

    async def _give_up_batch(self, batches: dict[Any, list[Any]]) -> None:
        """Abort the batch's transaction and read it again; if the outcome is unknown, replace
        the producer and read again from what is committed."""
        try:
            async with asyncio.timeout(self.options.transaction_timeout_ms / 1000):
                await self._producer.abort_transaction()
        except Exception as exc:  # fenced, fatal, or stuck committing: the outcome is unknown
            log.warning("intake_transaction_unknown", error=repr(exc))
            await self._drop_producer(abort=False)
            self._rewind = True
            return
        for tp, messages in batches.items():
            self._consumer.seek(tp, messages[0].offset)

    async def _rewind_assigned(self) -> None:
        """Put every assigned partition back at its committed offset."""
        assigned = self._consumer.assignment()
        await self._seek_committed(assigned)
        self._rewind = False

    async def _seek_committed(self, partitions: Collection[Any]) -> None:
        positions = await committed_positions(self._consumer, self.kafka, partitions)
        for tp in partitions:
            if tp in positions:
                self._consumer.seek(tp, positions[tp])
            else:
                await self._consumer.seek_to_beginning(tp)

    async def _start_producer(self) -> None:
        producer = AIOKafkaProducer(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.options.transaction_timeout_ms,
            acks="all",
            enable_idempotence=True,
            max_request_size=self.kafka.max_event_bytes + RECORD_HEADROOM_BYTES,
            # No linger: a batch's records are all handed over before its transaction waits
            # for them, so a linger only held back the last request of every transaction
            # (2026-12-07, timed inside stage 1 at 10 events/s: send 16 -> 12 ms at p50).
            linger_ms=0,
            max_batch_size=produce_batch_bytes(self.kafka),
            client_id=f"{self.group_id}-producer",
            **aiokafka_options(self.kafka),
        )
        try:
            await producer.start()  # fences an earlier producer of this id, settles its txn
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def _drop_producer(self, *, abort: bool) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            async with asyncio.timeout(self.options.transaction_timeout_ms / 1000):
                if abort and producer._txn_manager.is_in_transaction():
                    await producer.abort_transaction()
                await producer.stop()
        except Exception as exc:  # the broker aborts what is left open after its timeout
            log.warning("intake_producer_stop_failed", error=repr(exc))

    # --- rebalances (called by `_Rebalances`) -----------------------------------------------

    async def partitions_revoked(self, revoked: Collection[Any]) -> None:
        # Wait for the batch in hand: its transaction commits (or aborts) before the
        # partitions go, and a batch fetched before now is dropped (the epoch moved).
        async with self._lock:
            self._epoch += 1
            if self._consumer is not None:
                await self._confirm_committed(self._consumer, revoked)

    async def partitions_assigned(self, assigned: Collection[Any]) -> None:
        self.assignments += 1
        async with self._lock:
            try:
                await self._seek_committed(assigned)
            except Exception as exc:  # try again from the loop before the next fetch
                log.warning("intake_positions_unknown", error=repr(exc))
                self._rewind = True
            # A batch fetched while the positions were being set is dropped.
            self._epoch += 1

    async def _confirm_committed(self, consumer: Any, partitions: Collection[Any]) -> None:
        """Wait (up to `CONFIRM_SECONDS`) until the offsets this reader's transactions
        committed for *partitions* are what the group reads back, before they go to another
        member.

        `commit_transaction` returns once the commit is decided; the offsets become readable
        when the broker has written the transaction's markers, a moment later. The next owner
        of a partition could read the older offset in between (aiokafka's offset fetch does
        not ask for stable offsets, KIP-447) and dead-letter a batch a second time. (A plain
        commit of the same offsets would be readable at once, but the broker warns against
        mixing plain and transactional commits in one group, with reason.)"""
        expected = {tp: self._committed.pop(tp) for tp in partitions if tp in self._committed}
        try:
            # A bound on the whole wait, not between reads: with the broker gone, one read of
            # the committed offset never returns (seen: a worker stopped after its broker hung
            # in its stop for good).
            async with asyncio.timeout(CONFIRM_SECONDS):
                while expected:
                    for tp, offset in list(expected.items()):
                        if (await consumer.committed(tp) or 0) >= offset:
                            del expected[tp]
                    if expected:
                        await asyncio.sleep(0.01)
        except TimeoutError:
            log.warning("intake_offsets_unconfirmed", partitions=len(expected))
        except Exception as exc:  # the transactions committed them; this only waited for it
            log.info("intake_offsets_unconfirmed", error=repr(exc))


class _Rebalances(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka's rebalance callbacks, passed on to the reader."""

    def __init__(self, reader: InputBatches) -> None:
        self._reader = reader

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._reader.partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._reader.partitions_assigned(assigned)


def _consumed(message: Any) -> tuple[KafkaRecord, RecordInfo]:
    stamp = message.timestamp  # aiokafka's, in milliseconds
    return consumed(message, timestamp_seconds=None if stamp is None else stamp / 1000)

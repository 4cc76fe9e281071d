"""The front door: CloudEvents from Kafka into the core, or into the dead-letter topic.

Called by the composition root (`handlers/app.py`), which installs the intake on the
worker's App with `install_intake(app, kafka, seen=..., router=..., sink=...)` once the
orchestrator it feeds exists; tests and the benchmark build an intake alone with
`build_intake` and run it in-process with `faust.contrib.asgi.faust_app_running`.

Two stages, so that per-key state is co-partitioned with the key the rules care about:

1. Stage 1 (`handlers/input_batches.py`, a service of the App, not a faust agent) reads raw
   records (bytes + headers) from the input topics in batches. For each record `sort_raw`
   decodes (`handlers/codec.py`), validates the data against the schema of its type
   (`orchestrator/vocabulary/registry.py`), refuses events that are too old or expired, asks
   `router` for the keys the event is relevant to, and says what to send: the *original
   record* to the internal keyed topic once per key, or, for a record it refuses, one dead
   letter. Exactly one of the two happens. A batch's records and its input offsets are
   committed in one Kafka transaction.
2. Stage 2 reads the keyed topic (partitioned by rule key) in one lane per partition
   (`handlers/partition_lanes.py`, fed by the worker's consumer, not a faust agent), skips
   what the seen-set (`handlers/dedup.py`, a faust Table with a changelog) already holds, and
   calls `sink(key, event, info)`; then it records the event as seen. The sink is where the
   rule engine with its per-key state plugs in.

Delivery (argued in docs/delivery.md): stage 1 is exactly-once for readers of the keyed and
dead-letter topics that read committed records, since a batch's forwards, dead letters and
offsets commit together or not at all. Stage 2 is at-least-once: faust flushes the producer
(dead letters, changelog writes) before it commits an offset, so an offset is committed only
after the record's outcome is durable. A crash between the sink and the seen-set write
replays that event to the sink once more, so the sink's effects must be idempotent (job names
derived from the decision make launches so).

Forwarding the original bytes rather than a re-encoded event keeps extension types and binary
data exact, keeps the internal record no larger than the input one, and lets stage 2
dead-letter the true original if the sink refuses the event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import faust
import structlog

from handlers.codec import Headers, KafkaRecord, RecordInfo, consumed, decode_record
from handlers.dead_letters import dead_letter_record
from handlers.dedup import SEEN_TABLE, SeenEvents, seen_key
from handlers.faust_app import new_app, raw_topic
from handlers.input_batches import BatchOptions, InputBatches, Outgoing, RecordOutcome
from handlers.partition_lanes import PartitionLanes, deliver_in_lanes
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.settings import KafkaSettings, Settings
from orchestrator.vocabulary.registry import SchemaRegistry
from orchestrator.vocabulary.rejections import Rejection
from orchestrator.vocabulary.timestamps import parse_rfc3339

log = structlog.get_logger("tuneloop.intake")

Router = Callable[[CloudEvent], Sequence[str]]
"""The state keys an event is relevant to (the rule engine's `route()`); none: no rule cares."""

Sink = Callable[[str, CloudEvent, RecordInfo], Awaitable[None]]
"""Where a validated, deduplicated event goes, with the key it was routed by.

May raise `InvalidEventError` (dead-lettered as `sink.rejected`); anything else is
dead-lettered as `sink.failed` so that one bad event cannot stop the worker. The sink never
hands back a failure to retry: the service owns retries (`orchestrator/service.py`) and waits
inside the sink, which holds only this key's partition."""

UnknownTypePolicy = Callable[[str], bool]
"""Whether an event type without a registered schema may pass (a rule allows it)."""

FORWARD_HEADERS = (
    "tuneloop-forward-topic",
    "tuneloop-forward-partition",
    "tuneloop-forward-offset",
    "tuneloop-forward-timestamp",
    "tuneloop-forward-key",
    "tuneloop-forward-index",
)
"""Appended (in this order) to a record forwarded to the keyed topic: where it came from and
which event of a batch this copy is for."""


def route_by_partitionkey(event: CloudEvent) -> tuple[str, ...]:
    """Default router: the `partitionkey` extension, else `subject`, else `source`."""
    key = event.extensions.get("partitionkey")
    if key is not None and str(key):
        return (str(key),)
    if event.subject:
        return (event.subject,)
    return (event.source,)


def refuse_unknown_types(event_type: str) -> bool:
    """Default policy: a type without a schema is dead-lettered (`type.unknown`)."""
    del event_type
    return False


def admit(
    record: KafkaRecord,
    *,
    arrived_at: datetime,
    now: datetime,
    registry: SchemaRegistry,
    accepts_unknown_type: UnknownTypePolicy,
    max_event_bytes: int,
    max_age: timedelta | None,
) -> tuple[CloudEvent, ...]:
    """The events of *record* if every one may enter the core. Pure: no I/O, time injected.

    Raises:
        InvalidEventError: the record must be dead-lettered, with the code saying why.
    """
    events = decode_record(record, max_event_bytes=max_event_bytes)
    for event in events:
        registry.validate(event, accept_unknown=accepts_unknown_type(event.type))
        happened = event.event_time(arrived_at)
        if max_age is not None and now - happened > max_age:
            raise InvalidEventError(
                Rejection.EVENT_TOO_OLD,
                f"event {event.id!r} happened at {happened.isoformat()}, more than "
                f"{max_age} before {now.isoformat()}",
            )
        expiry = event.extensions.get("expirytime")
        if expiry is not None and parse_rfc3339(str(expiry), attribute="expirytime") <= now:
            raise InvalidEventError(
                Rejection.EVENT_EXPIRED, f"event {event.id!r} expired at {expiry}"
            )
    return events


@dataclass(slots=True)
class IntakeStats:
    """Counters of outcomes, for tests, the benchmark and a metrics exporter."""

    received: int = 0
    forwarded: int = 0
    unrouted: int = 0
    handled: int = 0
    duplicates: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)


Admission = Callable[[KafkaRecord, datetime], tuple[CloudEvent, ...]]
"""`admit` as this intake applies it (its registry, unknown-type policy, limits and clock),
given a record and when it arrived. Raises `InvalidEventError` with the dead-letter code."""


@dataclass(frozen=True, slots=True)
class Intake:
    """The faust app plus what tests and wiring may want to look at."""

    app: faust.App
    stats: IntakeStats
    seen: SeenEvents
    keyed_topic: str
    admission: Admission
    """The intake's validation, for the HTTP ingress (`handlers/web/ingress.py`): one code
    path decides what may enter, whichever way a record came."""
    input_batches: InputBatches
    """Stage 1, a service of `app`: started once the App has started, stopped with it."""
    lanes: PartitionLanes
    """Stage 2's lanes, one per keyed partition (`handlers/partition_lanes.py`)."""


def keyed_topic_name(kafka: KafkaSettings) -> str:
    """The internal topic the intake re-keys events onto, by rule key."""
    return f"{kafka.group_id}-tuneloop-keyed"


def seen_events(app: faust.App, kafka: KafkaSettings) -> SeenEvents:
    """The seen-set of (key, source, id) on a faust Table of *app* (changelog-backed)."""
    table = app.Table(SEEN_TABLE, default=None, partitions=kafka.internal_partitions)
    return SeenEvents(
        table,
        ttl_seconds=kafka.dedup_ttl.total_seconds(),
        max_entries=kafka.dedup_max_entries,
    )


def install_intake(
    app: faust.App,
    kafka: KafkaSettings,
    *,
    seen: SeenEvents,
    router: Router = route_by_partitionkey,
    sink: Sink,
    registry: SchemaRegistry | None = None,
    accepts_unknown_type: UnknownTypePolicy = refuse_unknown_types,
    clock: Clock | None = None,
    batch_options: BatchOptions | None = None,
) -> Intake:
    """Add the two stages (see the module docstring) to *app*: stage 1 as a service the App
    starts and stops, stage 2 as lanes fed by the App's consumer.

    The composition root calls it last, once what *router* and *sink* use exists.

    Args:
        app: the worker's faust App (`handlers/faust_app.py`).
        kafka: topics, group id, limits.
        seen: the seen-set, from `seen_events(app, kafka)`.
        router: the keys an event is relevant to.
        sink: called once per (key, event) that passed.
        registry: schemas of known types; the built-in vocabulary when omitted.
        accepts_unknown_type: which types without a schema may pass.
        clock: the time for age checks and the seen-set; the system clock when omitted.
        batch_options: how stage 1 reads and commits (tests make batches small).
    """
    keyed_name = keyed_topic_name(kafka)
    keyed = raw_topic(app, keyed_name, partitions=kafka.internal_partitions, internal=True)
    pipeline = _Pipeline(
        kafka=kafka,
        registry=registry if registry is not None else SchemaRegistry.builtin(),
        accepts_unknown_type=accepts_unknown_type,
        router=router,
        sink=sink,
        now=(clock or SystemClock()).now,
        seen=seen,
        keyed_topic=keyed_name,
        dlq=_ProducerTopic(app, kafka.topic_dlq),
    )
    # Stage 1 has its own consumer group and transactional producer (handlers/input_batches.py);
    # faust does not subscribe to the input topics. An App service starts once the App has
    # started and recovered its tables: faust has created the keyed topic by then (a send
    # before that could have the broker create it with its default partition count) and
    # stage 2 is ready. It stops first, before the App's own services.
    batches = InputBatches(
        kafka,
        sort=pipeline.sort_raw,
        count=pipeline.count,
        options=batch_options or BatchOptions(),
    )
    cast(Any, app).service(batches)  # faust takes an instance too, though typed for a class

    # Stage 2: faust subscribes to the keyed topic and assigns its partitions with the tables'
    # (co-partitioned), but its records skip faust's streams: the seek-safe consumer hands
    # them to one lane per partition (handlers/partition_lanes.py). Keys of different
    # partitions are handled side by side (a launch waiting on the API server holds up only
    # its own partition), while the inputs of one key arrive in order, one at a time, as the
    # rule state needs.
    app.topics.add(keyed)
    # the seen-set's changelog records go after a batch's other writes: a seen-mark must never
    # be kept without the state its event changed (handlers/changelog_batches.py)
    lanes = deliver_in_lanes(
        app, keyed_name, pipeline.take_keyed, written_last=frozenset({SEEN_TABLE})
    )

    def forget_index(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        # The table's contents change on rebalance; rebuild the per-partition order from it.
        seen.reset_index()

    # faust's stubs type receivers narrower than mode calls them; the call is checked at runtime.
    cast(Any, app.on_partitions_revoked).connect(forget_index)

    return Intake(
        app=app,
        stats=pipeline.stats,
        seen=seen,
        keyed_topic=keyed_name,
        admission=pipeline.admit,
        input_batches=batches,
        lanes=lanes,
    )


def build_intake(
    settings: Settings,
    *,
    router: Router = route_by_partitionkey,
    sink: Sink,
    registry: SchemaRegistry | None = None,
    accepts_unknown_type: UnknownTypePolicy = refuse_unknown_types,
    clock: Clock | None = None,
    batch_options: BatchOptions | None = None,
    **faust_options: Any,
) -> Intake:
    """An intake on its own App, without the rule engine: for tests and the intake benchmark
    (a worker is wired by `handlers/app.py`). Arguments as `install_intake`;
    *faust_options* go to `faust_app.new_app`."""
    app = new_app(settings.kafka, **faust_options)
    return install_intake(
        app,
        settings.kafka,
        seen=seen_events(app, settings.kafka),
        router=router,
        sink=sink,
        registry=registry,
        accepts_unknown_type=accepts_unknown_type,
        clock=clock,
        batch_options=batch_options,
    )


class _Pipeline:
    """What the two stages do with one record each; stage 1's reader and stage 2's lanes only
    iterate."""

    def __init__(
        self,
        *,
        kafka: KafkaSettings,
        registry: SchemaRegistry,
        accepts_unknown_type: UnknownTypePolicy,
        router: Router,
        sink: Sink,
        now: Callable[[], datetime],
        seen: SeenEvents,
        keyed_topic: str,
        dlq: Any,
    ) -> None:
        self.kafka = kafka
        self.registry = registry
        self.accepts_unknown_type = accepts_unknown_type
        self.router = router
        self.sink = sink
        self.now = now
        self.seen = seen
        self.keyed_topic = keyed_topic
        self.dlq = dlq
        self.stats = IntakeStats()

    def admit(self, record: KafkaRecord, arrived_at: datetime) -> tuple[CloudEvent, ...]:
        """`admit` with this intake's registry, policy, limits and clock (`Admission`)."""
        return admit(
            record,
            arrived_at=arrived_at,
            now=self.now(),
            registry=self.registry,
            accepts_unknown_type=self.accepts_unknown_type,
            max_event_bytes=self.kafka.max_event_bytes,
            max_age=self.kafka.max_age,
        )

    def sort_raw(self, record: KafkaRecord, origin: RecordInfo) -> RecordOutcome:
        """Stage 1: what to send for one input record: the original once per key to the keyed
        topic, or one dead letter. Sends nothing and counts nothing (`count` does, once the
        batch is committed), so a batch that is tried again changes nothing twice."""
        try:
            events = self.admit(record, origin.timestamp or self.now())
            routes = [(index, tuple(self.router(event))) for index, event in enumerate(events)]
        except InvalidEventError as exc:
            return self._refusal(record, origin, exc.code, exc.message)
        except Exception as exc:  # a bug of ours must not stop the worker or lose the record
            log.exception("intake_failed", topic=origin.topic, offset=origin.offset)
            return self._refusal(record, origin, Rejection.INTAKE_FAILED, repr(exc))
        forwards = tuple(
            Outgoing(
                topic=self.keyed_topic,
                key=key.encode("utf-8"),
                value=record.value,
                headers=(*record.headers, *_forward_block(origin, index)),
            )
            for index, keys in routes
            for key in keys
        )
        unrouted = tuple(events[index].id for index, keys in routes if not keys)
        return RecordOutcome(origin=origin, sends=forwards, unrouted=unrouted)

    def _refusal(
        self, record: KafkaRecord, origin: RecordInfo, code: str, message: str
    ) -> RecordOutcome:
        letter = dead_letter_record(
            record, origin=origin, code=code, message=message, at=self.now()
        )
        send = Outgoing(
            topic=self.kafka.topic_dlq, key=letter.key, value=letter.value, headers=letter.headers
        )
        return RecordOutcome(origin=origin, sends=(send,), refused=(str(code), message))

    def count(self, outcomes: Sequence[RecordOutcome]) -> None:
        """Count and log the outcomes of a committed stage-1 batch."""
        for outcome in outcomes:
            self.stats.received += 1
            if outcome.refused is not None:
                code, message = outcome.refused
                self._dead_lettered(outcome.origin, code, message)
                continue
            self.stats.forwarded += len(outcome.sends)
            for event_id in outcome.unrouted:
                self.stats.unrouted += 1
                log.info("event_unrouted", event_id=event_id)

    async def take_keyed(self, message: Any) -> None:
        """Stage 2: skip duplicates, hand the rest to the sink, remember them."""
        key = bytes(message.key or b"").decode("utf-8", errors="replace")
        try:
            record, origin, index = _unforward(message)
            event = decode_record(record, max_event_bytes=len(record.value or b""))[index]
        except Exception as exc:  # the intake admitted it, so this is a bug of ours
            log.exception("keyed_decode_failed", key=key)
            record, origin = consumed(message, timestamp_seconds=message.timestamp)
            await self.dead_letter(record, origin, Rejection.INTAKE_FAILED, repr(exc))
            return
        entry = seen_key(key, event.identity)
        moment = self.now().timestamp()
        self.seen.forget_old(partition=message.partition, now=moment)
        if self.seen.has_seen(entry, now=moment):
            self.stats.duplicates += 1
            log.info("event_duplicate", event_id=event.id, source=event.source, key=key)
            return
        await self.deliver(key, event, record, replace(origin, sequence=message.offset))
        self.seen.remember(entry, partition=message.partition, now=moment)

    async def deliver(
        self, key: str, event: CloudEvent, record: KafkaRecord, origin: RecordInfo
    ) -> None:
        """Hand the event to the sink; dead-letter it if the sink refuses it."""
        try:
            await self.sink(key, event, origin)
        except InvalidEventError as exc:
            await self.dead_letter(record, origin, Rejection.SINK_REJECTED, exc.message)
            return
        except Exception as exc:
            log.exception("sink_failed", event_id=event.id, key=key)
            await self.dead_letter(record, origin, Rejection.SINK_FAILED, repr(exc))
            return
        self.stats.handled += 1
        log.debug("event_handled", event_id=event.id, key=key)

    async def dead_letter(
        self, original: KafkaRecord, origin: RecordInfo, code: str, message: str
    ) -> None:
        """Stage 2: send *original* to the DLQ with the reason attached."""
        letter = dead_letter_record(
            original, origin=origin, code=code, message=message, at=self.now()
        )
        await self.dlq.send(key=letter.key, value=letter.value, headers=list(letter.headers))
        self._dead_lettered(origin, code, message)

    def _dead_lettered(self, origin: RecordInfo, code: str, message: str) -> None:
        self.stats.dead_lettered[str(code)] += 1
        log.warning(
            "event_dead_lettered",
            code=str(code),
            reason=message[:200],
            topic=origin.topic,
            partition=origin.partition,
            offset=origin.offset,
        )


class _ProducerTopic:
    """Sends raw records to one topic through the app's producer (stage 2's dead letters),
    skipping faust's Topic machinery (serializers, FutureMessage bookkeeping). Still durable
    before commit: faust flushes this same producer before it commits any offset."""

    def __init__(self, app: faust.App, name: str) -> None:
        self._app = app
        self._name = name

    async def send(self, *, key: bytes | None, value: bytes | None, headers: list[Any]) -> None:
        await self._app.producer.send(self._name, key, value, None, None, headers)


def _forward_block(origin: RecordInfo, index: int) -> Headers:
    stamp = "" if origin.timestamp is None else str(int(origin.timestamp.timestamp() * 1000))
    key = "-" if origin.key is None else origin.key.hex()
    values = (origin.topic, str(origin.partition), str(origin.offset), stamp, key, str(index))
    return tuple(
        (name, value.encode("utf-8")) for name, value in zip(FORWARD_HEADERS, values, strict=True)
    )


def _unforward(message: Any) -> tuple[KafkaRecord, RecordInfo, int]:
    """The original record, where it came from, and which batch element this copy is for."""
    headers = [(name, bytes(value or b"")) for name, value in message.headers or ()]
    block = dict((name, value.decode("utf-8")) for name, value in headers[-len(FORWARD_HEADERS) :])
    original = tuple(headers[: -len(FORWARD_HEADERS)])
    key = (
        None
        if block["tuneloop-forward-key"] == "-"
        else bytes.fromhex(block["tuneloop-forward-key"])
    )
    stamp = block["tuneloop-forward-timestamp"]
    origin = RecordInfo(
        topic=block["tuneloop-forward-topic"],
        partition=int(block["tuneloop-forward-partition"]),
        offset=int(block["tuneloop-forward-offset"]),
        timestamp=None if not stamp else datetime.fromtimestamp(int(stamp) / 1000, UTC),
        key=key,
    )
    record = KafkaRecord(value=message.value, headers=original, key=key)
    return record, origin, int(block["tuneloop-forward-index"])


if __name__ == "__main__":  # pragma: no cover - `python -m handlers.intake worker -l info`
    # A stand-alone intake that only logs what passes: for trying producers against the rules
    # of the wire format before the rule engine is wired (`handlers/app.py` does that).
    async def _log_event(key: str, event: CloudEvent, info: RecordInfo) -> None:
        log.info("event_accepted", key=key, event_id=event.id, type=event.type, topic=info.topic)

    build_intake(Settings.from_env(), sink=_log_event).app.main()

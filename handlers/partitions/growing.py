"""`tuneloop partitions grow`: move a stopped worker group to a new group with another count of
internal partitions (docs/partitions.md).

A group's count can't change in place (`guard.py`), so the state moves to a new group whose
topics have the new count, each entry onto the partition its rule key hashes to there:

1. refuse unless the old group's workers are stopped (no members in `<old>` nor in its stage
   1 group `<old>-intake`), the new group has never run (no offsets on its keyed topic), every
   Table of the old group is one whose entries can be placed (`entries.py`), and no
   transaction on the old topics is still open;
2. create the new group's keyed topic and changelogs with the new count (changelogs
   compacted, as faust creates them; as many replicas as the old topics have);
3. copy the latest value of every Table key (tombstones skipped) to the new changelog, on
   `murmur2(rule key) % N` (`placing.py`), with the key and value bytes faust wrote (a
   seen-set entry restamped with its new partition);
4. re-forward the keyed records stage 2 had not consumed (from the old group's committed
   offset to the end) onto the new keyed topic, by the same partitioner, each partition's
   first one twice: a guard copy at offset 0, then the record (see below);
5. commit offsets to the new group: the input topics' of `<old>-intake` if it has any (stage 1
   in its own group), else those of `<old>`, to both `<new>-intake` (where stage 1 reads them)
   and `<new>` (where a worker whose stage 1 read the input through faust read them); and 1
   on each keyed partition that holds records, past the guard copy.

Why the guard copy: a worker whose new group had a record waiting at offset 0 of a keyed
partition when it started, with 0 (or nothing) committed there, dropped that record and later
committed past it in 8 runs of 18. With the record at offset 1 and 1 committed it was handled
in 15 runs of 15. The cause was found later: aiokafka's seek to the committed offsets leaves a
partition with 0 or nothing committed where it is, so a batch the seek-safe consumer abandoned
there was never read again; `SeekSafeConsumer.seek_to_committed` now seeks such a partition to
its start. The guard copy stays, as a second line for groups moved by older workers.

The copy at offset 0 is never read while that offset stands; were it read (the group's offsets
expired), it is handled and the record after it is a duplicate the seen-set skips.

Run twice, it writes nothing new: a value already the latest in a new changelog, or a keyed
record already on the new topic, is not written again, and a key of a new changelog that the
old group no longer holds is deleted. Records are read `read_committed`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from faust.serializers import codecs

from handlers.input_batches import intake_group_id
from handlers.intake import keyed_topic_name
from handlers.partitions.cluster import Cluster, NewInternalTopic, TopicShape
from handlers.partitions.entries import (
    KEY_SERIALIZER,
    TableLayout,
    layout_of,
    table_of_changelog,
)
from handlers.partitions.placing import partition_for, placed, rule_key_partition
from handlers.publishing import aiokafka_options
from orchestrator.errors import ConfigError
from orchestrator.settings import KafkaSettings

COMMIT_MARK = "tuneloop partitions grow"
"""The metadata of the offsets this command commits: any other commit on the new keyed topic
is a worker's, so the new group ran."""
CHANGELOG_CONFIGS: Mapping[str, str] = {"cleanup.policy": "compact"}
"""What faust gives a Table's changelog topic (`Table._new_changelog_topic`: compacting)."""
FETCH_BYTES = 16 * 1024 * 1024

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TableCopy:
    """What moved of one Table."""

    table: str
    keys: int
    """Live keys in the old changelog (latest value not a tombstone)."""
    written: int
    """Records written to the new changelog (0 when a run before wrote them all)."""
    deleted: int
    """Keys of the new changelog that the old group no longer holds, deleted."""
    unplaced: tuple[str, ...]
    """Table keys whose rule key could not be told (left behind, see entries.py)."""


@dataclass(frozen=True, slots=True)
class Growth:
    """The migration's summary."""

    old_group: str
    new_group: str
    old_partitions: int
    new_partitions: int
    tables: tuple[TableCopy, ...]
    pending: int
    """Keyed records the old group had not consumed."""
    reforwarded: int
    """Of those, written to the new keyed topic (the rest were there from a run before)."""
    offsets_from: str | None
    """The group whose input offsets were copied; None when neither had any."""
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Move:
    """From which group and count to which."""

    old: str
    new: str
    old_keyed: str
    new_keyed: str
    old_count: int
    count: int


async def grow(kafka: KafkaSettings, *, to_group: str, partitions: int, say: Say) -> Growth:
    """Move the stopped group `kafka.group_id` to *to_group* with *partitions* partitions,
    saying what it does through *say*.

    Raises:
        ConfigError: refused before anything was written: a worker still runs, the new group
            already ran, a topic has an unexpected shape, a Table is unknown, a transaction
            is open.
    """
    old = kafka.group_id
    if not to_group or to_group == old:
        raise ConfigError(f"--to-group must name a new group, not {to_group!r}")
    if partitions <= 0:
        raise ConfigError(f"--partitions must be positive, not {partitions}")
    new_kafka = replace(kafka, group_id=to_group, internal_partitions=partitions)
    old_keyed, new_keyed = keyed_topic_name(kafka), keyed_topic_name(new_kafka)
    async with Cluster(kafka) as cluster, _Clients(kafka) as clients:
        topics = await cluster.topics()
        if old_keyed not in topics:
            raise ConfigError(
                f"group {old!r} has no keyed topic {old_keyed!r}: no worker of it ran, so "
                "there is nothing to move; start the workers with the new group and count"
            )
        move = _Move(old, to_group, old_keyed, new_keyed, topics[old_keyed].partitions, partitions)
        layouts = _tables_of(old, topics, move.old_count)
        await _refuse_running(cluster, move, kafka, new_kafka)
        wanted = _new_topics(topics, move, layouts)
        for topic in (old_keyed, *(layout.changelog(old) for layout in layouts)):
            await clients.refuse_open_transaction(topic, topics[topic].partitions)
        committed_old = await cluster.committed(old)
        committed_intake = await cluster.committed(intake_group_id(kafka))

        created = await cluster.create(wanted)
        say(
            f"group {old} ({move.old_count} partitions) -> {to_group} ({partitions} "
            f"partitions): {len(created)} topics created, {len(wanted) - len(created)} there"
        )
        copies = []
        for layout in layouts:
            copy = await _copy_table(clients, layout, move)
            say(
                f"table {copy.table}: {copy.keys} keys, {copy.written} written, "
                f"{copy.deleted} deleted, {len(copy.unplaced)} not placed"
            )
            for key in copy.unplaced:
                say(f"  not placed (no rule key of its partition): {copy.table} {key!r}")
            copies.append(copy)
        pending, reforwarded, keyed_starts = await _reforward(clients, move, committed_old)
        say(f"keyed records not yet handled: {pending}, {reforwarded} re-forwarded")
        source, offsets = carried_input_offsets(kafka, committed_intake, committed_old)
        await clients.commit(to_group, {**offsets, **keyed_starts})
        await clients.commit(intake_group_id(new_kafka), offsets)
        say(
            f"input offsets: {len(offsets)} partitions copied from group {source}"
            if source
            else "input offsets: none committed by the old group, none copied"
        )
    return Growth(
        old_group=old,
        new_group=to_group,
        old_partitions=move.old_count,
        new_partitions=partitions,
        tables=tuple(copies),
        pending=pending,
        reforwarded=reforwarded,
        offsets_from=source,
        offsets=offsets,
    )


def _tables_of(group: str, topics: Mapping[str, TopicShape], count: int) -> list[TableLayout]:
    """The layouts of the Tables whose changelogs *group* has, all of *count* partitions.

    Raises:
        ConfigError: a Table is unknown, or a changelog has another count than the keyed
            topic (the group mixes partitionings: nothing can be placed with certainty).
    """
    names = sorted(filter(None, (table_of_changelog(group, name) for name in topics)))
    layouts = [layout_of(name) for name in names]
    mixed = [
        f"{layout.changelog(group)} has {topics[layout.changelog(group)].partitions}"
        for layout in layouts
        if topics[layout.changelog(group)].partitions != count
    ]
    if mixed:
        raise ConfigError(
            f"group {group!r} mixes partition counts: its keyed topic has {count}, "
            f"{', '.join(mixed)}; its entries can't be placed"
        )
    return layouts


async def _refuse_running(
    cluster: Cluster, move: _Move, kafka: KafkaSettings, new_kafka: KafkaSettings
) -> None:
    old, new = move.old, move.new
    for group in (old, intake_group_id(kafka), new, intake_group_id(new_kafka)):
        members = await cluster.members(group)
        if members:
            raise ConfigError(
                f"group {group!r} has {members} active member(s): stop every worker of "
                f"{old!r} (and of {new!r}) first; a killed worker stays a member until its "
                "session times out"
            )
    commits = await cluster.commits(new)
    if any(tp.topic == move.new_keyed and mark != COMMIT_MARK for tp, (_, mark) in commits.items()):
        raise ConfigError(
            f"group {new!r} already ran (it committed offsets on {move.new_keyed!r}): its "
            "state is newer than the old group's; choose a group that never ran"
        )


def _new_topics(
    topics: Mapping[str, TopicShape], move: _Move, layouts: Iterable[TableLayout]
) -> list[NewInternalTopic]:
    """The new group's keyed topic and changelogs, shaped as the old ones but for the count.

    Raises:
        ConfigError: one exists with another count.
    """
    count = move.count
    wanted = [NewInternalTopic(move.new_keyed, count, topics[move.old_keyed].replicas)]
    wanted += [
        NewInternalTopic(
            layout.changelog(move.new),
            count,
            topics[layout.changelog(move.old)].replicas,
            CHANGELOG_CONFIGS,
        )
        for layout in layouts
    ]
    wrong = [
        f"{t.name} has {topics[t.name].partitions}"
        for t in wanted
        if t.name in topics and topics[t.name].partitions != count
    ]
    if wrong:
        raise ConfigError(
            f"topics of group {move.new!r} exist with another count than {count} "
            f"({', '.join(wrong)}): choose another group"
        )
    return wanted


Latest = dict[tuple[int, bytes], Any]
"""The latest record of each (partition, key) of a topic."""


async def _copy_table(clients: _Clients, layout: TableLayout, move: _Move) -> TableCopy:
    """Write the latest live value of every key of *layout*'s old changelog onto its rule
    key's partition of the new one, unless it is the latest there already."""
    source, target = layout.changelog(move.old), layout.changelog(move.new)
    before = _latest(await clients.read(source, move.old_count))
    there = _latest(await clients.read(target, move.count))
    wanted: dict[tuple[int, bytes], tuple[bytes, Any]] = {}
    unplaced: list[str] = []
    for (found_on, key_bytes), record in before.items():
        if record.value is None:
            continue  # a tombstone: the key was deleted
        key = codecs.loads(KEY_SERIALIZER, key_bytes)
        value = codecs.loads(layout.value_serializer, record.value)
        candidates = layout.rule_keys(key, value)
        rule_key = placed(candidates, found_on=found_on, partitions=move.old_count)
        if rule_key is None:
            unplaced.append(key)
            continue
        partition = rule_key_partition(rule_key, move.count)
        value_bytes = record.value
        if layout.restamp is not None:
            value_bytes = codecs.dumps(layout.value_serializer, layout.restamp(value, partition))
        wanted[(partition, key_bytes)] = (value_bytes, record)
    written = deleted = 0
    for (partition, key_bytes), (value_bytes, record) in wanted.items():
        current = there.get((partition, key_bytes))
        if current is not None and current.value == value_bytes:
            continue
        await clients.send(target, partition, key_bytes, value_bytes, record)
        written += 1
    for (partition, key_bytes), record in there.items():
        if record.value is not None and (partition, key_bytes) not in wanted:
            await clients.send(target, partition, key_bytes, None, record)
            deleted += 1
    await clients.flush()
    live = sum(1 for record in before.values() if record.value is not None)
    return TableCopy(layout.name, live, written, deleted, tuple(unplaced))


def _latest(records: Iterable[Any]) -> Latest:
    latest: Latest = {}
    for record in records:
        if record.key is not None:
            latest[(record.partition, record.key)] = record
    return latest


async def _reforward(
    clients: _Clients, move: _Move, committed: Mapping[TopicPartition, int]
) -> tuple[int, int, dict[TopicPartition, int]]:
    """Copy the old keyed records after the old group's committed offsets onto the new keyed
    topic, but those a run before copied, with a guard copy first on an empty partition
    (module docstring); (records pending, records written, where the new group starts)."""
    starts = {p: committed.get(TopicPartition(move.old_keyed, p), 0) for p in range(move.old_count)}
    pending = await clients.read(move.old_keyed, move.old_count, starts=starts)
    there = await clients.read(move.new_keyed, move.count)
    guarded = {record.partition for record in there}
    copied = Counter(_identity(record) for record in there if record.offset > 0)
    reforwarded = 0
    for record in pending:
        identity = _identity(record)
        if copied[identity]:
            copied[identity] -= 1
            continue
        if record.key is None:  # never written so: every keyed record has its rule key
            continue
        partition = partition_for(record.key, move.count)
        if partition not in guarded:
            await clients.send(move.new_keyed, partition, record.key, record.value, record)
            guarded.add(partition)
        await clients.send(move.new_keyed, partition, record.key, record.value, record)
        reforwarded += 1
    await clients.flush()
    new_starts = {TopicPartition(move.new_keyed, p): 1 for p in sorted(guarded)}
    return len(pending), reforwarded, new_starts


def _identity(record: Any) -> tuple[Any, ...]:
    return (record.key, record.value, tuple((n, bytes(v or b"")) for n, v in record.headers))


def carried_input_offsets(
    kafka: KafkaSettings,
    intake: Mapping[TopicPartition, int],
    faust_group: Mapping[TopicPartition, int],
) -> tuple[str | None, dict[TopicPartition, int]]:
    """The input topics' committed offsets to carry over, and the group they come from. Pure.

    Stage 1's own group (`<group>-intake`) if it committed any on the input topics: its
    offsets are the current ones once stage 1 reads outside faust, and the faust group's are
    then where an earlier version stopped. Else the faust group `<group>`'s."""
    inputs = set(kafka.topics_in)
    for group, offsets in (
        (intake_group_id(kafka), intake),
        (kafka.group_id, faust_group),
    ):
        chosen = {tp: offset for tp, offset in offsets.items() if tp.topic in inputs}
        if chosen:
            return group, chosen
    return None, {}


class _Clients:
    """A producer, and readers of whole topics, with the worker's connection options."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._options = aiokafka_options(kafka)
        self._producer = AIOKafkaProducer(
            **self._options, acks="all", enable_idempotence=True, request_timeout_ms=30_000
        )

    def _reader(self, isolation: str) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            **self._options,
            group_id=None,
            enable_auto_commit=False,
            isolation_level=isolation,
            fetch_max_bytes=FETCH_BYTES,
            max_partition_fetch_bytes=FETCH_BYTES,
        )

    async def __aenter__(self) -> _Clients:
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()

    async def send(
        self, topic: str, partition: int, key: bytes, value: bytes | None, original: Any
    ) -> None:
        """Send a record to *topic*'s *partition*, with *original*'s timestamp and headers."""
        await self._producer.send(
            topic,
            key=key,
            value=value,
            partition=partition,
            timestamp_ms=original.timestamp,
            headers=list(original.headers or ()),
        )

    async def flush(self) -> None:
        """Wait until every record sent is on the brokers."""
        await self._producer.flush()

    async def read(
        self, topic: str, partitions: int, *, starts: Mapping[int, int] | None = None
    ) -> list[Any]:
        """Every committed record of *topic* (of *partitions* partitions) from *starts* (by
        partition; else the beginning) to its end offsets of now, partition by partition.

        A reader of its own each time, with explicit seeks: a reader assigned one topic after
        another was seen to report a partition's position at its end right after
        `seek_to_beginning` (aiokafka 0.14), and so to skip its records."""
        reader = self._reader("read_committed")
        await reader.start()
        try:
            assigned = [TopicPartition(topic, p) for p in range(partitions)]
            reader.assign(assigned)
            ends = await reader.end_offsets(assigned)
            beginnings = await reader.beginning_offsets(assigned)
            for tp in assigned:
                reader.seek(tp, max(beginnings[tp], (starts or {}).get(tp.partition, 0)))
            found: list[Any] = []
            while [tp for tp in assigned if await reader.position(tp) < ends[tp]]:
                for tp, records in (await reader.getmany(*assigned, timeout_ms=1000)).items():
                    found.extend(r for r in records if r.offset < ends[tp])
        finally:
            await reader.stop()
        found.sort(key=lambda r: (r.partition, r.offset))
        return found

    async def refuse_open_transaction(self, topic: str, partitions: int) -> None:
        """Refuse while a transaction on *topic* is open: its last stable offset (where a
        `read_committed` reader stops) is short of its end.

        Raises:
            ConfigError: one is open.
        """
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        found = {}
        for isolation in ("read_committed", "read_uncommitted"):
            reader = self._reader(isolation)
            await reader.start()
            try:
                found[isolation] = await reader.end_offsets(assigned)
            finally:
                await reader.stop()
        stable, end = found["read_committed"], found["read_uncommitted"]
        open_ = [tp.partition for tp in assigned if end[tp] != stable[tp]]
        if open_:
            raise ConfigError(
                f"{topic!r} partitions {open_} hold an unfinished transaction (a stopped "
                "worker's, aborted by the broker after its transaction timeout): run again "
                "in a minute"
            )

    async def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit *offsets* as *group*'s, marked `COMMIT_MARK` (a group with no members: no
        generation needed)."""
        if not offsets:
            return
        consumer = AIOKafkaConsumer(**self._options, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(list(offsets))
            await consumer.commit(
                {tp: OffsetAndMetadata(offset, COMMIT_MARK) for tp, offset in offsets.items()}
            )
        finally:
            await consumer.stop()

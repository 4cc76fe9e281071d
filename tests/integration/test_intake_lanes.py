"""Stage 2's partition lanes against the real broker: each key's events in order, a slow key
holding up only its own partition, the seen-set's changelog written to the partition of
the record being handled, and a key's Table entry written once per batch of its records.

Which keyed partition a key lands on is computed with kafka-python's murmur2 (the Java
client's default partitioner), not with anything of tuneloop's.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from handlers.codec import RecordInfo
from orchestrator.events import CloudEvent
from tests.corpus.bad_records import binary_headers
from tests.integration.test_intake import produce, running, settings_for, until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

PARTITIONS = 4
DRIFT = b'{"model_id":"chat","metric":"psi","value":1,"threshold":0}'


def keyed_partition(key: str) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % PARTITIONS


def keys_on_every_partition(per_partition: int) -> list[str]:
    """Model keys, *per_partition* of them on each keyed partition."""
    found: dict[int, list[str]] = defaultdict(list)
    n = 0
    while any(len(found[p]) < per_partition for p in range(PARTITIONS)):
        key = f"model-{n}"
        n += 1
        if len(found[keyed_partition(key)]) < per_partition:
            found[keyed_partition(key)].append(key)
    return [key for p in range(PARTITIONS) for key in found[p]]


def interleaved(keys: list[str], per_key: int) -> list[tuple[Any, Any, Any]]:
    """*per_key* events for each key, ids `<key>/<n>`, sent round-robin across the keys."""
    return [
        (DRIFT, binary_headers(ce_id=f"{key}/{n}", ce_partitionkey=key), None)
        for n in range(per_key)
        for key in keys
    ]


def seen_entries_by_partition(bootstrap: str, changelog: str) -> dict[str, set[int]]:
    """The partitions of the changelog on which each rule key's seen entries were written."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    try:
        consumer.assign([TopicPartition(changelog, p) for p in range(PARTITIONS)])
        where: dict[str, set[int]] = defaultdict(set)
        for record in consumer:
            rule_key = json.loads(record.key).split("\x1f")[0]
            where[rule_key].add(record.partition)
        return where
    finally:
        consumer.close()


async def test_each_keys_events_reach_the_sink_once_and_in_the_order_sent(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq, group = new_topic("in"), new_topic("dlq"), f"it-{uuid.uuid4().hex[:8]}"
    keys = keys_on_every_partition(3)
    per_key = 25
    received: dict[str, list[int]] = defaultdict(list)

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        received[key].append(int(event.id.split("/")[1]))
        await asyncio.sleep(0)  # let the other lanes interleave

    await produce(kafka_bootstrap, topic, interleaved(keys, per_key))
    async with running(
        settings_for(kafka_bootstrap, topic, dlq, group, internal_partitions=PARTITIONS), sink
    ):
        await until(
            lambda: sum(map(len, received.values())) >= len(keys) * per_key,
            what="every event to reach the sink",
        )
    assert received == {key: list(range(per_key)) for key in keys}

    seen = await asyncio.to_thread(
        seen_entries_by_partition, kafka_bootstrap, f"{group}-tuneloop-seen-changelog"
    )
    assert seen == {key: {keyed_partition(key)} for key in keys}


async def test_a_key_whose_sink_call_hangs_holds_up_only_its_own_partition(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq, group = new_topic("in"), new_topic("dlq"), f"it-{uuid.uuid4().hex[:8]}"
    keys = keys_on_every_partition(2)
    slow = keys[0]
    held_up = {key for key in keys if keyed_partition(key) == keyed_partition(slow)}
    free = [key for key in keys if key not in held_up]
    release = asyncio.Event()
    received: dict[str, list[int]] = defaultdict(list)

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        if key == slow:
            await release.wait()  # a launch waiting on an API server that does not answer
        received[key].append(int(event.id.split("/")[1]))

    await produce(kafka_bootstrap, topic, interleaved(keys, 5))
    async with running(
        settings_for(kafka_bootstrap, topic, dlq, group, internal_partitions=PARTITIONS), sink
    ):
        await until(
            lambda: all(len(received[key]) == 5 for key in free),
            what="the keys of the other partitions to be handled",
        )
        assert not any(received[key] for key in held_up - {slow})
        release.set()
        await until(
            lambda: all(len(received[key]) == 5 for key in keys),
            what="the held-up partition to go on once released",
        )
    assert received == {key: list(range(5)) for key in keys}


def changelog_records(bootstrap: str, changelog: str) -> list[Any]:
    """Every record of *changelog*, each partition's in order."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    try:
        consumer.assign([TopicPartition(changelog, p) for p in range(PARTITIONS)])
        return list(consumer)
    finally:
        consumer.close()


async def test_a_keys_backlog_writes_its_table_entry_once_per_batch_and_a_restart_recovers_it(
    kafka_bootstrap, new_topic
) -> None:
    topic, dlq, group = new_topic("in"), new_topic("dlq"), f"it-{uuid.uuid4().hex[:8]}"
    settings = settings_for(kafka_bootstrap, topic, dlq, group, internal_partitions=PARTITIONS)
    key = "model-0"
    backlog = 60
    tables: dict[str, Any] = {}

    def with_a_count_table(intake: Any) -> None:
        tables["counts"] = intake.app.Table(
            "it-counts", default=None, partitions=PARTITIONS, value_type=bytes
        )

    async def count(rule_key: str, event: CloudEvent, info: RecordInfo) -> None:
        counts = tables["counts"]
        counts[rule_key] = str(int(counts.get(rule_key) or b"0") + 1).encode()

    await produce(kafka_bootstrap, topic, interleaved([key], backlog))
    async with running(settings, count, before_start=with_a_count_table):
        await until(lambda: tables["counts"].get(key) == b"60", what="the whole backlog counted")

    written = await asyncio.to_thread(
        changelog_records, kafka_bootstrap, f"{group}-it-counts-changelog"
    )
    assert [json.loads(record.key) for record in written] == [key] * len(written)
    assert 1 <= len(written) < backlog  # one per batch of the lane, not one per event
    assert written[-1].value == b"60"
    assert {record.partition for record in written} == {keyed_partition(key)}

    # the next owner of the partition recovers the count from the changelog and goes on
    more = [(DRIFT, binary_headers(ce_id=f"{key}/{backlog}", ce_partitionkey=key), None)]
    await produce(kafka_bootstrap, topic, more)
    async with running(settings, count, before_start=with_a_count_table):
        await until(lambda: tables["counts"].get(key) == b"61", what="the count to go on")

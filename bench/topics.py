"""The benchmarks' Kafka work: topics, a backlog of records, and counting what a process wrote.

`Counter` counts the records on a topic from the broker's end offsets (one small ListOffsets
request, no fetching), so sampling it many times a second costs the machine little: that is
how `watch` follows a worker's output (its audit records) or the raw pipeline's, next to the
process's CPU time, for `bench/steady.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bench.steady import Sample

Record = tuple[bytes | None, bytes, Sequence[tuple[str, bytes]]]
"""(key, value, headers) of one record to produce."""


def create(bootstrap: str, partitions: Mapping[str, int], *, timeout: float = 30.0) -> None:
    """Create the topics *partitions* names, with that many partitions each, and wait until
    every partition has a leader."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="tuneloop-bench")
    try:
        admin.create_topics(
            [
                NewTopic(name, num_partitions=n, replication_factor=1)
                for name, n in partitions.items()
            ]
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            described = admin.describe_topics(list(partitions))
            if all(
                t.get("partitions") and all(_leader(p) >= 0 for p in t["partitions"])
                for t in described
            ):
                return
            time.sleep(0.2)
        raise TimeoutError(f"topics {sorted(partitions)} had no leaders after {timeout:.0f} s")
    finally:
        admin.close()


def _leader(partition: Mapping[str, Any]) -> int:
    """The partition's leader broker, -1 while it has none (kafka-python names the field
    `leader_id` in its newer metadata, `leader` in older ones)."""
    return int(partition.get("leader_id", partition.get("leader", -1)))


def names(bootstrap: str) -> set[str]:
    """Every topic on the cluster."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="tuneloop-bench")
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


async def produce(bootstrap: str, topic: str, records: Iterable[Record]) -> int:
    """Send *records* to *topic* as fast as the producer batches them; how many were sent."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    sent = 0
    try:
        for key, value, headers in records:
            await producer.send(topic, value=value, key=key, headers=list(headers))
            sent += 1
        await producer.flush()
    finally:
        await producer.stop()
    return sent


class Counter:
    """How many records a topic holds, from its partitions' end offsets."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._consumer: Any = None
        self._partitions: list[Any] = []

    async def __aenter__(self) -> Counter:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self._consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap)
        await self._consumer.start()
        found = self._consumer.partitions_for_topic(self._topic)
        deadline = time.monotonic() + 30
        while not found and time.monotonic() < deadline:
            await self._consumer._client.force_metadata_update()
            found = self._consumer.partitions_for_topic(self._topic)
        if not found:
            raise LookupError(f"topic {self._topic} not found")
        self._partitions = [TopicPartition(self._topic, p) for p in sorted(found)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def count(self) -> int:
        ends = await self._consumer.end_offsets(self._partitions)
        return int(sum(ends.values()))


async def watch(
    counter: Counter,
    *,
    cpu: Callable[[], float],
    until: int,
    timeout: float,
    already: int = 0,
    interval: float = 0.02,
    alive: Callable[[], bool] = lambda: True,
) -> list[Sample]:
    """Samples of (time, records beyond *already*, `cpu()`) every *interval* seconds until
    *until* records are done, *timeout* seconds passed, or `alive()` is false."""
    samples: list[Sample] = []
    deadline = time.perf_counter() + timeout
    while True:
        done = await counter.count() - already
        samples.append(Sample(at=time.perf_counter(), done=done, cpu=cpu()))
        if done >= until or time.perf_counter() > deadline or not alive():
            return samples
        await asyncio.sleep(interval)


async def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record on *topic* now, in order per partition (no consumer group)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        found = consumer.partitions_for_topic(topic) or set()
        if not found:
            await consumer._client.force_metadata_update()
            found = consumer.partitions_for_topic(topic) or set()
        partitions = [TopicPartition(topic, p) for p in sorted(found)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[Any] = []
        remaining = {p for p in partitions if ends[p] > 0}
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=1000)
            for partition, batch in batches.items():
                records.extend(batch)
                if batch[-1].offset + 1 >= ends[partition]:
                    remaining.discard(partition)
        return records
    finally:
        await consumer.stop()

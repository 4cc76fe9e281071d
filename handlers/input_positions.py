"""Where stage 1 of the intake reads an input partition from, and how it goes back there.

Used by `handlers/input_batches.py` when partitions are assigned to it and after a batch
failed with an unknown outcome. For each partition, in order:

1. the offset the intake group (`<group>-intake`) committed, the end of its last committed
   batch;
2. else the offset the worker's faust group (`<group>`) committed for it: a worker of the
   version before stage 1 had a group of its own read the input topics through a faust agent
   in that group, and stopped there. Starting from the beginning instead would forward every
   event again (the seen-set would skip them) and dead-letter every bad record again (nothing
   would skip those);
3. else none: the consumer's `auto_offset_reset` (earliest) decides.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from handlers.publishing import aiokafka_options
from orchestrator.settings import KafkaSettings


async def committed_positions(
    consumer: Any, kafka: KafkaSettings, partitions: Collection[TopicPartition]
) -> dict[TopicPartition, int]:
    """Where to read each of *partitions* from (module docstring); a partition with no
    position in either group is left out.

    Args:
        consumer: stage 1's `AIOKafkaConsumer`, in the intake group, with *partitions*
            assigned.
        kafka: brokers and credentials, and the faust group id.
        partitions: assigned partitions of the input topics.

    Raises:
        KafkaError: a group coordinator did not answer; the positions are unknown.
    """
    positions: dict[TopicPartition, int] = {}
    fresh: list[TopicPartition] = []
    for tp in sorted(partitions):
        offset = await consumer.committed(tp)
        if offset is None or offset < 0:
            fresh.append(tp)
        else:
            positions[tp] = offset
    if fresh:
        positions.update(await faust_group_positions(kafka, fresh))
    return positions


async def faust_group_positions(
    kafka: KafkaSettings, partitions: Collection[TopicPartition]
) -> dict[TopicPartition, int]:
    """The offsets the worker's faust group committed for *partitions* (those it has)."""
    admin = AIOKafkaAdminClient(client_id="tuneloop-intake-positions", **aiokafka_options(kafka))
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(
            kafka.group_id, partitions=list(partitions)
        )
    finally:
        await admin.close()
    return {
        TopicPartition(tp.topic, tp.partition): meta.offset
        for tp, meta in offsets.items()
        if meta.offset >= 0
    }

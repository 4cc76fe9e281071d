"""`tuneloop partitions show`: a group's internal topics, their partition counts, its members.

What an operator looks at before choosing a count or growing one (docs/partitions.md): the
count the group's topics have (which the settings must say), how many workers share them now,
and whether the workers are stopped before a migration.
"""

from __future__ import annotations

from handlers.input_batches import intake_group_id
from handlers.intake import keyed_topic_name
from handlers.partitions.cluster import Cluster
from handlers.partitions.entries import table_of_changelog
from orchestrator.settings import KafkaSettings


async def describe(kafka: KafkaSettings) -> list[str]:
    """Lines that describe the group of *kafka* on its brokers."""
    group = kafka.group_id
    keyed = keyed_topic_name(kafka)
    async with Cluster(kafka) as cluster:
        topics = await cluster.topics()
        members = {name: await cluster.members(name) for name in (group, intake_group_id(kafka))}
    internal = sorted(
        name for name in topics if name == keyed or table_of_changelog(group, name) is not None
    )
    lines = [f"group {group}: TUNELOOP_KAFKA_INTERNAL_PARTITIONS={kafka.internal_partitions}"]
    if not internal:
        lines.append("  no internal topics yet (no worker of this group ran)")
    lines += [
        f"  {name}: {topics[name].partitions} partitions, {topics[name].replicas} replicas"
        for name in internal
    ]
    lines += [f"  members of {name}: {count}" for name, count in members.items()]
    return lines

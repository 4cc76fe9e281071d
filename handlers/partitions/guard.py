"""`tuneloop run` refuses to start a group whose internal topics have another partition count
than `TUNELOOP_KAFKA_INTERNAL_PARTITIONS`.

faust creates the internal topics once, with the count of the first worker; a later worker
with another count would find them as they are and, for a Table created afterwards, mix two
partitionings (faust stops with `PartitionsMismatch` then). Altering the topics by hand would
move keys to partitions whose state is elsewhere. So the count of a group is fixed, and a
change of it is refused before the worker starts, with the way to grow named
(docs/partitions.md: `tuneloop partitions grow`).
"""

from __future__ import annotations

import asyncio

import structlog
from aiokafka.errors import KafkaError

from handlers.intake import keyed_topic_name
from handlers.partitions.cluster import Cluster, TopicShape
from handlers.partitions.entries import table_of_changelog
from orchestrator.errors import ConfigError
from orchestrator.settings import KafkaSettings

log = structlog.get_logger("tuneloop.partitions")

CHECK_TIMEOUT = 10.0
"""Seconds the check may take; a broker that does not answer by then is the worker's own
problem (it retries), and the check is skipped with a warning."""


def changed_partitions(kafka: KafkaSettings, topics: dict[str, TopicShape]) -> str | None:
    """Why *kafka*'s group may not start on *topics* (every topic of the cluster), or None.
    Pure: the group's internal topics that exist must all have `internal_partitions`."""
    group = kafka.group_id
    keyed = keyed_topic_name(kafka)
    internal = sorted(
        (name for name in topics if name == keyed or table_of_changelog(group, name) is not None),
        key=lambda name: (name != keyed, name),  # the keyed topic first
    )
    wrong = [name for name in internal if topics[name].partitions != kafka.internal_partitions]
    if not wrong:
        return None
    found = ", ".join(f"{name} has {topics[name].partitions}" for name in wrong)
    actual = topics[wrong[0]].partitions
    return (
        f"TUNELOOP_KAFKA_INTERNAL_PARTITIONS is {kafka.internal_partitions} but the internal "
        f"topics of group {group!r} were created with another count ({found}). A group's "
        "count can't change: each key's state lives on the partition its rule key hashes to. "
        f"Keep {actual}, or grow under a new group: stop this group's workers, run `tuneloop "
        f"partitions grow --to-group NEW --partitions {kafka.internal_partitions}`, then start "
        "the workers with TUNELOOP_KAFKA_GROUP_ID=NEW (docs/partitions.md)"
    )


def refuse_changed_partitions(kafka: KafkaSettings) -> None:
    """Look at the group's internal topics on the brokers and refuse a changed count; for a
    caller without a running event loop (`tuneloop run`, before the worker starts).

    It runs on an event loop of its own and leaves none behind as the thread's current one
    (as `asyncio.run` would), since faust takes the thread's loop when the worker starts.

    Raises:
        ConfigError: they exist with another count than `kafka.internal_partitions`.
    """
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(check_internal_partitions(kafka))
    finally:
        loop.close()


async def check_internal_partitions(kafka: KafkaSettings) -> None:
    """Look at the group's internal topics on the brokers and refuse a changed count.

    Raises:
        ConfigError: they exist with another count than `kafka.internal_partitions`.
    """
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            async with Cluster(kafka, request_timeout=CHECK_TIMEOUT) as cluster:
                topics = await cluster.topics()
    except (KafkaError, OSError, TimeoutError) as exc:
        log.warning("partition_check_skipped", reason=repr(exc))
        return
    reason = changed_partitions(kafka, topics)
    if reason is not None:
        raise ConfigError(reason)

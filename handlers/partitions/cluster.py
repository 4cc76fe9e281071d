"""What the brokers say about a worker group: its topics, its members, its committed offsets.

One admin connection (aiokafka's, with the worker's TLS/SASL options from
`handlers/publishing.py`), for the start-time check (`guard.py`) and the migration
(`growing.py`). Topics are looked up in the metadata of every topic, never by name: a
metadata request that names a missing topic makes a broker with `auto.create.topics.enable`
create it, with the broker's default partition count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.structs import TopicPartition

from handlers.publishing import aiokafka_options
from orchestrator.settings import KafkaSettings

COORDINATOR_WAIT = 30.0
"""Seconds to wait for a group coordinator that is still loading (a fresh broker creates its
offsets topic on the first group request)."""
_NOT_YET = (CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError)


@dataclass(frozen=True, slots=True)
class TopicShape:
    """How a topic is laid out: its partitions and its replication factor."""

    partitions: int
    replicas: int


@dataclass(frozen=True, slots=True)
class NewInternalTopic:
    """A topic to create: name, partitions, replicas and its topic configs."""

    name: str
    partitions: int
    replicas: int
    configs: Mapping[str, str] = field(default_factory=dict)


class Cluster:
    """An admin connection: `async with Cluster(kafka) as cluster: ...`."""

    def __init__(self, kafka: KafkaSettings, *, request_timeout: float = 30.0) -> None:
        self._admin = AIOKafkaAdminClient(
            **aiokafka_options(kafka), request_timeout_ms=int(request_timeout * 1000)
        )

    async def __aenter__(self) -> Self:
        await self._admin.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self._admin.close()

    async def topics(self) -> dict[str, TopicShape]:
        """Every topic of the cluster with its shape."""
        found: dict[str, TopicShape] = {}
        for topic in await self._admin.describe_topics():
            if topic["error_code"]:
                continue
            partitions = topic["partitions"]
            replicas = max((len(p["replicas"]) for p in partitions), default=1)
            found[topic["topic"]] = TopicShape(partitions=len(partitions), replicas=replicas)
        return found

    async def create(self, topics: Iterable[NewInternalTopic]) -> list[str]:
        """Create *topics*; the names of those created (one that exists already is left as
        it is: the caller checked its shape).

        Raises:
            KafkaError: the brokers refused one.
        """
        wanted = [
            NewTopic(t.name, t.partitions, t.replicas, topic_configs=dict(t.configs))
            for t in topics
        ]
        if not wanted:
            return []
        response: Any = await self._admin.create_topics(wanted)
        created = []
        for name, code, message, *_ in response.topic_errors:
            if code == 0:
                created.append(name)
            elif code != TopicAlreadyExistsError.errno:
                raise for_code(code)(f"could not create topic {name!r}: {message}")
        return created

    async def members(self, group: str) -> int:
        """How many consumers are members of *group* now (0 for a group that never was)."""
        responses: Any = await self._coordinated(self._admin.describe_consumer_groups, [group])
        count = 0
        for response in responses:
            for described in response.to_object()["groups"]:
                count += len(described["members"])
        return count

    async def committed(self, group: str) -> dict[TopicPartition, int]:
        """The offsets *group* has committed, by partition (none: an empty dict)."""
        return {tp: offset for tp, (offset, _) in (await self.commits(group)).items()}

    async def commits(self, group: str) -> dict[TopicPartition, tuple[int, str]]:
        """The offsets *group* has committed with the metadata each commit carried."""
        offsets: Any = await self._coordinated(self._admin.list_consumer_group_offsets, group)
        return {
            tp: (meta.offset, meta.metadata or "")
            for tp, meta in offsets.items()
            if meta.offset >= 0
        }

    async def _coordinated(self, call: Any, *args: Any) -> Any:
        deadline = asyncio.get_running_loop().time() + COORDINATOR_WAIT
        while True:
            try:
                return await call(*args)
            except _NOT_YET:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.5)

"""The hand-off's ledger on a compacted Kafka topic: one record per slot, the last one wins.

`handlers/handoff/service.py` reads the whole topic once at start (`load`) and writes each
changed slot (`put`) before it acts on the change, so a hand-off restarted anywhere finds
what every target serves and was asked to serve (`orchestrator/handoff/ledger.py`). Kafka
rather than a file: the hand-off runs where the workers run, with no volume of its own,
and the topic outlives any pod.

Records: key = the slot key as JSON (`["<target>", "<rule>", "<key>"]`), value = the slot
as JSON. The topic is created compacted (`cleanup.policy=compact`) with one partition when
missing; a record that does not parse is logged and skipped (a newer one of its key may
follow).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from handlers.codec import KafkaRecord
from handlers.publishing import KafkaEventPublisher, aiokafka_options
from orchestrator.errors import TransientBackendError
from orchestrator.handoff.ledger import Slot, SlotKey
from orchestrator.settings import KafkaSettings

log = structlog.get_logger("tuneloop.handoff")

TOPIC_EXISTS = 36
"""Kafka's TOPIC_ALREADY_EXISTS error code: another hand-off or an operator made it."""
MAX_REPLICATION = 3


class KafkaLedger:
    """Reads and writes the ledger topic; `publisher` must be started by the caller."""

    def __init__(self, kafka: KafkaSettings, *, topic: str, publisher: KafkaEventPublisher) -> None:
        self._kafka = kafka
        self.topic = topic
        self._publisher = publisher

    async def ensure_topic(self) -> None:
        """Create the compacted topic if it is missing.

        Raises:
            TransientBackendError: Kafka did not answer, or refused to create it.
        """
        admin = AIOKafkaAdminClient(client_id="tuneloop-handoff", **aiokafka_options(self._kafka))
        try:
            await admin.start()
            brokers = (await admin.describe_cluster()).get("brokers", [])
            replication = max(1, min(MAX_REPLICATION, len(brokers)))
            response = await admin.create_topics(
                [
                    NewTopic(
                        self.topic,
                        num_partitions=1,
                        replication_factor=replication,
                        topic_configs={"cleanup.policy": "compact"},
                    )
                ]
            )
        except KafkaError as exc:
            raise TransientBackendError(f"cannot create the ledger topic {self.topic}") from exc
        finally:
            await admin.close()
        for _topic, code, *message in response.topic_errors:
            if code not in (0, TOPIC_EXISTS):
                raise TransientBackendError(
                    f"Kafka refused to create the ledger topic {self.topic}: {code} {message}"
                )

    async def load(self) -> dict[SlotKey, Slot]:
        """Every slot on the topic, read from its beginning to its end of now.

        Raises:
            TransientBackendError: Kafka did not answer.
        """
        consumer = AIOKafkaConsumer(
            enable_auto_commit=False,
            client_id="tuneloop-handoff-ledger",
            **aiokafka_options(self._kafka),
        )
        slots: dict[SlotKey, Slot] = {}
        try:
            await consumer.start()
            partitions = consumer.partitions_for_topic(self.topic)
            if partitions is None:
                # aiokafka has no public way to refresh the metadata before `assign`.
                await consumer._client.force_metadata_update()
                partitions = consumer.partitions_for_topic(self.topic) or set()
            assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            if not assigned:
                return slots
            consumer.assign(assigned)
            await consumer.seek_to_beginning(*assigned)
            ends = await consumer.end_offsets(assigned)
            while [tp for tp in assigned if await consumer.position(tp) < ends[tp]]:
                batches = await consumer.getmany(timeout_ms=1000)
                for records in batches.values():
                    for record in records:
                        _read_into(slots, record.key, record.value, offset=record.offset)
        except KafkaError as exc:
            raise TransientBackendError(f"cannot read the ledger topic {self.topic}") from exc
        finally:
            await consumer.stop()
        return slots

    async def put(self, changed: Mapping[SlotKey, Slot]) -> None:
        """Write each changed slot and wait for Kafka's acknowledgement of all of them.

        Raises:
            TransientBackendError: Kafka did not acknowledge; writing again is safe.
        """
        for key, slot in changed.items():
            record = KafkaRecord(
                value=json.dumps(slot.to_json(), sort_keys=True).encode(),
                headers=(),
                key=json.dumps(key.to_json()).encode(),
            )
            await self._publisher.publish_record(record, topic=self.topic)


def _read_into(
    slots: dict[SlotKey, Slot], key: bytes | None, value: bytes | None, *, offset: int
) -> None:
    try:
        slot_key = SlotKey.from_json(json.loads(key or b"null"))
        if value is None:
            slots.pop(slot_key, None)
            return
        slots[slot_key] = Slot.from_json(json.loads(value))
    except ValueError as exc:
        log.warning("handoff_ledger_record_skipped", offset=offset, error=str(exc))

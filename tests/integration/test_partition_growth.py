"""The documented way to grow a group's internal partitions (docs/partitions.md), on the real
broker: a worker of group A with 2 partitions leaves state, stops; `tuneloop partitions grow`
moves it to group B with 4; a worker of B goes on where A stopped.

The workers run in this process with the in-memory backend (each group its own, so that a
launch B should not make is seen as one); the commands run as an operator runs them, as
`tuneloop` processes with the settings in their environment, and are the page's own: its
`tuneloop partitions ...` lines, with this test's group and count in place of the page's.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.partitioner.default import murmur2
from kafka.structs import TopicPartition

from handlers.codec import KafkaRecord, encode_event
from handlers.intake import FORWARD_HEADERS
from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from orchestrator.settings import Settings
from orchestrator.testing import InMemoryBackend
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import send_events, send_records
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import (
    INTERNAL_PARTITIONS,
    build_test_worker,
    running,
    worker_settings,
    worker_topics,
)
from tests.unit.test_docs_code_blocks import fenced

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "partitions.md"
GROWN = 4
RULES = """
runtimes: [torch-distributed]
rules:
  - name: retrain
    on:
      type: io.tuneloop.drift.detected.v1
      where: "event.data.value > event.data.threshold"
    key: "event.data.model_id"
    count: 1
    window: 1h
    cooldown: 1h
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""
LEAVE_GROUP_FAST = {
    # A stopped worker leaves its group at once; these only bound how long a member that
    # did not say goodbye keeps the group busy (faust's default session is 60 s).
    "broker_session_timeout": 10.0,
    "broker_heartbeat_interval": 1.0,
    "broker_rebalance_timeout": 10.0,
}


def partition_of(key: str, partitions: int) -> int:
    """kafka-python's murmur2 (its own implementation): where a Java producer puts *key*."""
    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def alarm(event_id: str, model: str) -> CloudEvent:
    return drift_alarm(event_id, model=model, value=0.5)


def forwarded(event: CloudEvent, *, key: str, topic: str) -> KafkaRecord:
    """The record stage 1 writes to the keyed topic for *event* under *key*, as read from
    offset 999 of *topic* (handlers/intake.py: the original with a forward block)."""
    record = encode_event(event)
    block = (topic, "0", "999", "", "-", "0")
    forward = tuple(zip(FORWARD_HEADERS, (value.encode() for value in block), strict=True))
    return KafkaRecord(value=record.value, headers=(*record.headers, *forward), key=key.encode())


def admin_call(bootstrap: str, call: str, *args: object) -> object:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return getattr(admin, call)(*args)
    finally:
        admin.close()


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """What *group* committed on *topic*, by partition (read through kafka-python)."""
    offsets = admin_call(bootstrap, "list_group_offsets", {group: None})
    assert isinstance(offsets, dict)
    return {tp.partition: meta.offset for tp, meta in offsets[group].items() if tp.topic == topic}


def last_records(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """The offset of the last record of each partition of *topic* that holds one (the end
    offset is past it by one, or by two after a transaction's marker)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=2000
    )
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        return {record.partition: record.offset for record in consumer}
    finally:
        consumer.close()


def consumed_to_the_end(bootstrap: str, group: str, topic: str, partitions: int) -> bool:
    """Whether *group* committed every record of *topic*."""
    done = committed(bootstrap, group, topic)
    last = last_records(bootstrap, topic, partitions)
    return all(done.get(p, 0) > offset for p, offset in last.items())


def members(bootstrap: str, group: str) -> int:
    described = admin_call(bootstrap, "describe_groups", [group])
    assert isinstance(described, dict)
    return len(described[group]["members"])


def changelog_partitions(bootstrap: str, topic: str) -> dict[str, int]:
    """Each live key of a changelog (a JSON string) and the partition it is on."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(GROWN)])
        where: dict[str, int] = {}
        for record in consumer:
            key = record.key.decode().strip('"')
            if record.value is None:
                where.pop(key, None)
            else:
                where[key] = record.partition
        return where
    finally:
        consumer.close()


def tuneloop(*args: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "handlers.cli.main", *args],
        cwd=REPO,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def documented(command: str, **replacing: str) -> list[str]:
    """The arguments of the page's `tuneloop <command>` line (in a bash block), each word that
    is a key of *replacing* replaced by its value."""
    for language, body, _ in fenced(PAGE.read_text(encoding="utf-8")):
        for line in body.splitlines() if language == "bash" else ():
            words = shlex.split(line)
            if words[: len(command.split()) + 1] == ["tuneloop", *command.split()]:
                return [replacing.get(word, word) for word in words[1:]]
    raise AssertionError(f"docs/partitions.md has no `tuneloop {command}` line")


def kafka_environment(settings: Settings) -> dict[str, str]:
    kafka = settings.kafka
    return {
        "TUNELOOP_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "TUNELOOP_KAFKA_GROUP_ID": kafka.group_id,
        "TUNELOOP_KAFKA_TOPICS_IN": ",".join(kafka.topics_in),
        "TUNELOOP_KAFKA_INTERNAL_PARTITIONS": str(kafka.internal_partitions),
    }


async def test_a_group_grown_to_more_partitions_keeps_its_state_and_goes_on_where_it_stopped(
    kafka_bootstrap: str, new_topic: TopicFactory, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    topics = worker_topics(new_topic, "grow")
    suffix = uuid.uuid4().hex[:8]
    group_a, group_b = f"grow-a-{suffix}", f"grow-b-{suffix}"
    settings_a = worker_settings(kafka_bootstrap, topics, group=group_a)
    settings_b = replace(
        settings_a, kafka=replace(settings_a.kafka, group_id=group_b, internal_partitions=GROWN)
    )
    keyed_a, keyed_b = f"{group_a}-tuneloop-keyed", f"{group_b}-tuneloop-keyed"
    environment = kafka_environment(settings_a)
    old_keys = ("m1", "m2", "m3")
    # m2 moves to a partition group A did not have: the state is repartitioned, not copied.
    assert partition_of("m2", INTERNAL_PARTITIONS) != partition_of("m2", GROWN) >= 2

    # Group A, 2 partitions: one launch per model; each leaves a cooldown in its rule state.
    backend_a = InMemoryBackend(SystemClock())
    worker_a = build_test_worker(settings_a, rules=rules, backend=backend_a, **LEAVE_GROUP_FAST)
    async with running(worker_a):
        await send_events(kafka_bootstrap, topics["in"], [alarm(f"d-{m}", m) for m in old_keys])
        await wait_for(lambda: len(backend_a.job_names) == 3, what="three launches", timeout=60)

        def caught_up() -> bool:
            input_done = max(
                sum(committed(kafka_bootstrap, group, topics["in"]).values())
                for group in (group_a, f"{group_a}-intake")
            )
            return input_done == 3 and consumed_to_the_end(
                kafka_bootstrap, group_a, keyed_a, INTERNAL_PARTITIONS
            )

        await wait_for(lambda: asyncio.to_thread(caught_up), what="A's commits", timeout=60)
        refused = await asyncio.to_thread(
            tuneloop, "partitions", "grow", "--to-group", group_b, "--partitions", "4",
            environment=environment,
        )  # fmt: skip
        assert refused.returncode == 1
        assert f"group '{group_a}' has 1 active member(s)" in refused.stderr

    await wait_for(
        lambda: asyncio.to_thread(lambda: members(kafka_bootstrap, group_a) == 0),
        what="A's workers gone",
        timeout=30,
    )
    # While no worker runs: a duplicate of a handled event, a new event of a key in its
    # cooldown, an event of a new key; and a record stage 1 had forwarded that stage 2 had
    # not handled yet when the workers stopped.
    await send_events(
        kafka_bootstrap, topics["in"], [alarm("d-m1", "m1"), alarm("d-m1-later", "m1")]
    )
    await send_events(kafka_bootstrap, topics["in"], [alarm("d-m4", "m4")])
    await send_records(
        kafka_bootstrap, keyed_a, [forwarded(alarm("d-m5", "m5"), key="m5", topic=topics["in"])]
    )
    done = committed(kafka_bootstrap, group_a, keyed_a)
    last = last_records(kafka_bootstrap, keyed_a, INTERNAL_PARTITIONS)
    assert [p for p, offset in last.items() if done.get(p, 0) <= offset] == [
        partition_of("m5", INTERNAL_PARTITIONS)
    ]  # only the forward of d-m5 is left for stage 2

    # The count of a group is fixed: group A with 4 partitions does not start.
    changed = await asyncio.to_thread(
        tuneloop, "run", "--rules", str(rules),
        environment={**environment, "TUNELOOP_KAFKA_INTERNAL_PARTITIONS": "4"},
    )  # fmt: skip
    assert changed.returncode == 1
    assert "refusing to start" in changed.stderr
    assert f"{keyed_a} has 2" in changed.stderr
    assert "tuneloop partitions grow --to-group NEW --partitions 4" in changed.stderr
    assert "docs/partitions.md" in changed.stderr

    # The page's steps: look at the group, then move it, twice: the second run finds
    # everything in place.
    shown = await asyncio.to_thread(
        tuneloop, *documented("partitions show"), environment=environment
    )
    assert shown.returncode == 0, shown.stderr
    assert f"{keyed_a}: 2 partitions" in shown.stdout
    assert f"members of {group_a}: 0" in shown.stdout
    grow = documented("partitions grow", **{"tuneloop-16": group_b, "16": str(GROWN)})
    assert grow == ["partitions", "grow", "--to-group", group_b, "--partitions", "4"]
    first = await asyncio.to_thread(tuneloop, *grow, environment=environment)
    assert first.returncode == 0, first.stderr
    assert "table tuneloop-rule-state: 3 keys, 3 written, 0 deleted, 0 not placed" in first.stdout
    assert "keyed records not yet handled: 1, 1 re-forwarded" in first.stdout
    assert f"input offsets: 1 partitions copied from group {group_a}-intake" in first.stdout
    again = await asyncio.to_thread(tuneloop, *grow, environment=environment)
    assert again.returncode == 0, again.stderr
    assert "table tuneloop-rule-state: 3 keys, 0 written, 0 deleted, 0 not placed" in again.stdout
    assert "tuneloop-seen" in again.stdout
    assert all(
        " 0 written," in line for line in again.stdout.splitlines() if line.startswith("table ")
    )
    assert "keyed records not yet handled: 1, 0 re-forwarded" in again.stdout
    # Each key's state is on the partition a Java producer would send the key to.
    state_b = changelog_partitions(kafka_bootstrap, f"{group_b}-tuneloop-rule-state-changelog")
    assert state_b == {m: partition_of(m, GROWN) for m in old_keys}

    # Group B, 4 partitions, goes on where A stopped.
    backend_b = InMemoryBackend(SystemClock())
    worker_b = build_test_worker(settings_b, rules=rules, backend=backend_b, **LEAVE_GROUP_FAST)
    async with running(worker_b):
        await wait_for(
            lambda: len(backend_b.job_names) == 2,
            what="two launches",
            timeout=60,
            on_timeout=lambda: (
                f"{backend_b.job_names}; {worker_b.intake.stats}; committed "
                f"{committed(kafka_bootstrap, group_b, keyed_b)}, last records "
                f"{last_records(kafka_bootstrap, keyed_b, GROWN)}"
            ),
        )

        def handled_all() -> bool:
            return worker_b.intake.stats.received == 3 and consumed_to_the_end(
                kafka_bootstrap, group_b, keyed_b, GROWN
            )

        await wait_for(
            lambda: asyncio.to_thread(handled_all),
            what="B caught up",
            timeout=60,
            on_timeout=lambda: (
                f"{worker_b.intake.stats}; committed "
                f"{committed(kafka_bootstrap, group_b, keyed_b)}, last records "
                f"{last_records(kafka_bootstrap, keyed_b, GROWN)}"
            ),
        )
        stats = worker_b.intake.stats

    launched = sorted(backend_b.request_of(name).key for name in backend_b.job_names)
    assert launched == ["m4", "m5"]  # m1's later event fell in the cooldown A left
    assert backend_b.launch_calls == 2
    assert stats.received == 3  # only what came while no worker ran: not re-read from the start
    assert stats.duplicates == 1  # d-m1, handled by A

    # Once B ran, its state is newer than A's: moving A again is refused.
    late = await asyncio.to_thread(tuneloop, *grow, environment=environment)
    assert late.returncode == 1
    assert f"group '{group_b}' already ran" in late.stderr

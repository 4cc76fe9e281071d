"""Fault suite 7, rule reload under load: rule files change under a worker while events flow.

A wired worker on the real broker counts drift events with rules v1 while a producer sends a
steady stream. Mid-stream the rule file is replaced (atomically, as a deploy would) by a valid
v2; then by a series of invalid files (a YAML syntax error, an unknown field, a CEL syntax
error, a repeated rule name, an empty file, a half-written file written in place); then by a
valid v3. The audit topic is the witness: every event has exactly one decision, each decision
carries the version of a valid rule file, a key never goes back to an older version, events
sent after a version took effect carry it, and no decision ever names what the invalid files
said. v3 taking effect at the end shows the reloader outlived the invalid files, and the worker
never restarted (same app, no crash).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from structlog.testing import capture_logs

from handlers.app import Worker
from handlers.codec import encode_event
from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from orchestrator.rules import loading
from orchestrator.rules.parsing import RuleFileError
from orchestrator.testing import InMemoryBackend
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

RELOAD_INTERVAL = 0.2
EVENTS_PER_PHASE = 60
RATE = 100.0
"""Events per second the producer sends while the files change."""
KEYS = ("m0", "m1", "m2", "m3")
POLL = 0.05
"""Seconds between looks at the worker: a version's mark is set as soon as it takes effect."""


def rules_text(
    *, name: str = "drift-watch", window: str = "30d", runtime: str = "torch-distributed"
) -> str:
    """Rules that count every drift event per model and never launch."""
    return f"""
runtimes: [torch-distributed]
rules:
  - name: {name}
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: {window}
    count: 1000000
    launch:
      runtime: {runtime}
      base_model: tiny
      dataset: "file:///data/${{ key }}.jsonl"
"""


V1 = rules_text(window="30d", runtime="torch-distributed")
V2 = rules_text(window="29d", runtime="torch-distributed")
V3 = rules_text(window="28d", runtime="torch-distributed")
INVALID = {
    "yaml-syntax": V2.replace("count: 1000000", "count: [1000000"),
    "unknown-field": V2.replace("count: 1000000", "count: 1000000\n    countt: 3").replace(
        "drift-watch", "drift-invalid"
    ),
    "bad-expression": V2.replace(
        "type: io.tuneloop.drift.detected.v1",
        'type: io.tuneloop.drift.detected.v1\n      where: "event.data.value >"',
    ).replace("drift-watch", "drift-invalid"),
    "duplicate-rule": V2 + V2.split("rules:\n", 1)[1],
    "empty": "",
    "half-written": V2[: len(V2) // 2].replace("drift-watch", "drift-invalid"),
}


def drift(n: int) -> CloudEvent:
    return drift_alarm(f"reload-{n}", model=KEYS[n % len(KEYS)], minutes_ago=1)


def version_of(text: str, tmp: Path) -> str:
    probe = tmp / f"probe-{uuid.uuid4().hex[:6]}.yaml"
    probe.write_text(text)
    return loading.load_rules([probe]).rules[0].version


def rejections(logs: list[MutableMapping[str, Any]]) -> int:
    """How many times the reloader has refused a rule file so far."""
    return sum(1 for entry in logs if entry.get("event") == "rules_reload_rejected")


def replace_atomically(path: Path, text: str) -> None:
    staging = path.with_name(path.name + ".new")
    staging.write_text(text)
    os.replace(staging, path)


class Stream:
    """Sends drift events at a steady rate; remembers which were sent after which mark."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.sent = 0
        self.marks: dict[str, int] = {}

    async def send(self, count: int) -> None:
        for _ in range(count):
            record = encode_event(drift(self.sent))
            await self.producer.send_and_wait(
                self.topic, value=record.value, key=record.key, headers=list(record.headers)
            )
            self.sent += 1
            await asyncio.sleep(1 / RATE)

    def mark(self, name: str) -> None:
        self.marks[name] = self.sent


def make_worker(bootstrap: str, topics: dict[str, str], rules: Path) -> Worker:
    return build_test_worker(
        worker_settings(bootstrap, topics),
        rules=rules,
        backend=InMemoryBackend(SystemClock()),
        tick_interval=0.5,
        reload_interval=RELOAD_INTERVAL,
    )


async def test_a_valid_rule_file_takes_effect_mid_stream_and_invalid_ones_never_do(
    kafka_bootstrap: str, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topics = worker_topics(new_topic, "reload", partitions={"in": 2, "audit": 2})
    versions = {name: version_of(text, tmp_path) for name, text in (("v1", V1), ("v2", V2))}
    versions["v3"] = version_of(V3, tmp_path)
    for name, text in INVALID.items():  # each really is invalid
        probe = tmp_path / f"invalid-{name}.yaml"
        probe.write_text(text)
        with pytest.raises(RuleFileError):
            loading.load_rules([probe])
    rules = tmp_path / "rules" / "rules.yaml"
    rules.parent.mkdir()
    rules.write_text(V1)
    worker = make_worker(kafka_bootstrap, topics, rules)
    app, stats = worker.app, worker.intake.stats

    def in_force() -> str:
        return worker.orchestrator.rules.rules[0].version

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    stream = Stream(producer, topics["in"])
    try:
        # The reloader's log lines are how the test knows it read each file (structlog's
        # capture, as STYLE.md says tests assert on logs).
        with capture_logs() as logs:
            async with running(worker):
                await stream.send(EVENTS_PER_PHASE)
                replace_atomically(rules, V2)
                sending = asyncio.ensure_future(stream.send(EVENTS_PER_PHASE))
                await wait_for(
                    lambda: in_force() == versions["v2"],
                    what="v2 to take effect",
                    timeout=60,
                    interval=POLL,
                )
                stream.mark("v2")
                await sending
                for name, text in INVALID.items():
                    rejected = rejections(logs)
                    if name == "half-written":
                        rules.write_text(text)  # in place, as a careless editor would
                    else:
                        replace_atomically(rules, text)
                    # Counted, not slept for: the reloader has read this file and said no...
                    await wait_for(
                        lambda before=rejected: rejections(logs) > before,
                        what=f"the reloader to reject the {name} file",
                        timeout=60,
                        interval=POLL,
                    )
                    # ...and the worker has decided every event sent after that.
                    await stream.send(EVENTS_PER_PHASE // len(INVALID))
                    await wait_for(
                        lambda: stats.handled == stream.sent,
                        what=f"the events sent after the {name} file to be decided",
                        timeout=60,
                        interval=POLL,
                    )
                    assert in_force() == versions["v2"], f"invalid file {name} took effect"
                replace_atomically(rules, V3)
                await wait_for(
                    lambda: in_force() == versions["v3"],
                    what="v3 to take effect",
                    timeout=60,
                    interval=POLL,
                )
                stream.mark("v3")
                await stream.send(EVENTS_PER_PHASE)
                await wait_for(
                    lambda: stats.handled == stream.sent,
                    what=f"every event to be handled ({stats.handled}/{stream.sent})",
                    timeout=60,
                    interval=POLL,
                )
                crash = app._crash_reason
    finally:
        await producer.stop()
    decisions = await read_decisions(kafka_bootstrap, topics["audit"])

    by_event: dict[str, list[dict[str, Any]]] = {}
    for decision in decisions:
        for event_id in decision["event_ids"]:
            by_event.setdefault(event_id, []).append(decision)
    sent_ids = [f"reload-{n}" for n in range(stream.sent)]
    lost = [i for i in sent_ids if i not in by_event]
    doubled = [i for i in sent_ids if len(by_event.get(i, ())) > 1]
    version_names = {v: k for k, v in versions.items()}
    seen = [version_names.get(d["rule_version"], d["rule_version"]) for d in decisions]
    print(
        f"\nrule reload: events sent={stream.sent} decisions={len(decisions)} "
        f"lost={len(lost)} duplicates={len(doubled)} "
        f"v1={seen.count('v1')} v2={seen.count('v2')} v3={seen.count('v3')} "
        f"other versions={len(seen) - sum(seen.count(v) for v in ('v1', 'v2', 'v3'))} "
        f"invalid files={len(INVALID)} DLQ={sum(stats.dead_lettered.values())} "
        f"crashes={0 if crash is None else 1}"
    )
    assert crash is None, crash
    assert worker.app is app
    assert not lost, lost[:10]
    assert not doubled, doubled[:10]
    assert len(decisions) == stream.sent
    assert not stats.dead_lettered
    assert {d["rule"] for d in decisions} == {"drift-watch"}
    assert set(seen) <= {"v1", "v2", "v3"}, set(seen)
    # events sent before a swap may be decided after it: rules apply when an event is handled
    assert seen.count("v1") > 0
    assert seen.count("v2") > 0
    assert seen.count("v3") >= EVENTS_PER_PHASE
    order = {"v1": 1, "v2": 2, "v3": 3}
    number = {event_id: int(event_id.rsplit("-", 1)[1]) for event_id in sent_ids}
    for key in KEYS:
        per_key = sorted(
            (number[d["event_ids"][-1]], order[version_names[d["rule_version"]]])
            for d in decisions
            if d["key"] == key
        )
        steps = [step for _, step in per_key]
        assert steps == sorted(steps), f"key {key} went back to an older rule version"
    for decision in decisions:
        n = number[decision["event_ids"][-1]]
        name = version_names[decision["rule_version"]]
        if n >= stream.marks["v3"]:
            assert name == "v3", (n, name)
        elif n >= stream.marks["v2"]:
            assert name == "v2", (n, name)

"""The intake's per-message logic without a broker: forwarding, dedup, the sink's errors.

Stage 1's reader and stage 2's partition lanes only iterate and call `_Pipeline`; here what stage 1
would send and what stage 2 dead-letters are recorded by stand-ins, and the seen-table is a
dict, so each outcome is checked directly. The real broker path is in
tests/integration/test_intake.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from handlers.codec import RecordInfo, consumed
from handlers.dedup import SeenEvents
from handlers.intake import _Pipeline, route_by_partitionkey
from orchestrator.errors import InvalidEventError, TransientBackendError
from orchestrator.rules.state import InputPosition
from orchestrator.settings import KafkaSettings
from orchestrator.vocabulary import SchemaRegistry
from tests.corpus.bad_records import NOW, binary_headers


@dataclass
class RecordingTopic:
    sent: list[dict[str, Any]] = field(default_factory=list)

    async def send(self, **message: Any) -> None:
        self.sent.append(message)


def message(value: bytes | None, headers, *, offset: int = 0, key: bytes | None = None, topic="in"):
    return SimpleNamespace(
        topic=topic,
        partition=0,
        offset=offset,
        timestamp=NOW.timestamp(),
        key=key,
        value=value,
        headers=list(headers),
    )


def read(raw: SimpleNamespace) -> tuple[Any, Any]:
    return consumed(raw, timestamp_seconds=raw.timestamp)


DATA = b'{"model_id":"chat","metric":"psi","value":1,"threshold":0}'


def pipeline(sink, **settings: Any) -> tuple[_Pipeline, RecordingTopic, RecordingTopic]:
    keyed, dlq = RecordingTopic(), RecordingTopic()
    kafka = KafkaSettings(**settings)
    return (
        _Pipeline(
            kafka=kafka,
            registry=SchemaRegistry.builtin(),
            accepts_unknown_type=lambda event_type: False,
            router=route_by_partitionkey,
            sink=sink,
            now=lambda: NOW,
            seen=SeenEvents({}, ttl_seconds=3600, max_entries=100),
            keyed_topic=KEYED,
            dlq=dlq,
        ),
        keyed,
        dlq,
    )


KEYED = "keyed"


async def pass_through(stage: _Pipeline, keyed: RecordingTopic, raw) -> None:
    """Stage 1 on *raw* (its sends recorded by topic, then counted as committed), then
    stage 2 on every record it forwarded."""
    before = len(keyed.sent)
    outcome = stage.sort_raw(*read(raw))
    for send in outcome.sends:
        target = keyed if send.topic == KEYED else stage.dlq
        await target.send(key=send.key, value=send.value, headers=list(send.headers))
    stage.count([outcome])
    for forwarded in keyed.sent[before:]:
        await stage.take_keyed(
            message(forwarded["value"], forwarded["headers"], key=forwarded["key"], topic="keyed")
        )


async def test_a_valid_event_reaches_the_sink_under_its_key_with_its_origin() -> None:
    calls = []

    async def sink(key, event, info):
        calls.append((key, event.id, info.topic, info.offset))

    stage, keyed, dlq = pipeline(sink)
    await pass_through(
        stage, keyed, message(DATA, binary_headers(ce_id="a", ce_partitionkey="chat"), offset=7)
    )
    assert calls == [("chat", "a", "in", 7)]
    assert dlq.sent == []


def test_stage_one_decides_what_to_send_and_counts_nothing_until_its_batch_is_committed() -> None:
    async def sink(key, event, info):
        raise AssertionError("stage 1 never calls the sink")

    stage, _, _ = pipeline(sink, topic_dlq="dead")
    good = stage.sort_raw(*read(message(DATA, binary_headers(ce_partitionkey="chat"))))
    bad = stage.sort_raw(*read(message(b"{", binary_headers(), offset=3)))

    assert [(send.topic, send.key) for send in good.sends] == [(KEYED, b"chat")]
    ((topic, code),) = [(s.topic, dict(s.headers)["tuneloop-error-code"]) for s in bad.sends]
    assert (topic, code) == ("dead", b"data.invalid_json")  # docs/dead-letters.md
    assert (stage.stats.received, stage.stats.forwarded) == (0, 0)
    stage.count([good, bad])
    assert (stage.stats.received, stage.stats.forwarded) == (2, 1)
    assert dict(stage.stats.dead_lettered) == {"data.invalid_json": 1}


async def test_the_sink_learns_where_the_input_record_sits_for_the_rule_engine() -> None:
    positions = []

    async def sink(key, event, info):
        positions.append(info.position)

    stage, keyed, _ = pipeline(sink)
    await pass_through(
        stage, keyed, message(DATA, binary_headers(ce_id="a", ce_partitionkey="chat"), offset=7)
    )
    assert positions == [InputPosition("in/0", 7)]


def test_a_signal_has_no_input_position() -> None:
    assert RecordInfo(topic="keyed", partition=-1, offset=-1).position is None


async def test_the_same_source_and_id_reach_the_sink_once() -> None:
    calls = []

    async def sink(key, event, info):
        calls.append(event.id)

    stage, keyed, _ = pipeline(sink)
    for offset in range(3):
        await pass_through(stage, keyed, message(DATA, binary_headers(ce_id="a"), offset=offset))
    assert calls == ["a"]
    assert stage.stats.duplicates == 2


async def test_the_record_key_is_kept_for_the_event_after_repartitioning() -> None:
    keys = []

    async def sink(key, event, info):
        keys.append((key, event.extensions["partitionkey"], info.key))

    stage, keyed, _ = pipeline(sink)
    await pass_through(stage, keyed, message(DATA, binary_headers(), key=b"chat"))
    assert keys == [("chat", "chat", b"chat")]


async def test_the_intake_hands_an_event_to_the_sink_once_and_never_retries_it() -> None:
    # The service owns retries and waits inside the sink; a retryable error that still
    # escapes it is a bug of ours, dead-lettered like any other, not a reason to loop here.
    attempts = []

    async def sink(key, event, info):
        attempts.append(event.id)
        raise TransientBackendError("busy", delay=0.001)

    stage, keyed, dlq = pipeline(sink)
    await pass_through(stage, keyed, message(DATA, binary_headers()))
    assert len(attempts) == 1
    assert stage.stats.handled == 0
    assert [dict(letter["headers"])["tuneloop-error-code"] for letter in dlq.sent] == [
        b"sink.failed"
    ]


@pytest.mark.parametrize(
    ("error", "code"),
    [(InvalidEventError("x", "no such model"), "sink.rejected"), (KeyError("bug"), "sink.failed")],
    ids=["refused", "crashed"],
)
async def test_a_sink_that_refuses_or_crashes_dead_letters_the_original(error, code) -> None:
    async def sink(key, event, info):
        raise error

    stage, keyed, dlq = pipeline(sink)
    headers = binary_headers(ce_id="a")
    await pass_through(stage, keyed, message(DATA, headers, offset=5))
    (letter,) = dlq.sent
    sent_headers = dict(letter["headers"])
    assert sent_headers["tuneloop-error-code"] == code.encode()
    assert sent_headers["tuneloop-origin-offset"] == b"5"
    assert letter["value"] == DATA
    assert tuple(letter["headers"][: len(headers)]) == headers
    # the worker goes on: the next event is handled
    assert stage.stats.dead_lettered[code] == 1


async def test_a_batch_is_forwarded_once_per_event_and_key() -> None:
    import json

    from tests.corpus.bad_records import BATCH, envelope

    seen = []

    async def sink(key, event, info):
        seen.append((key, event.id))

    stage, keyed, _ = pipeline(sink)
    batch = [envelope(id="1", partitionkey="a"), envelope(id="2", partitionkey="b")]
    await pass_through(stage, keyed, message(json.dumps(batch).encode(), BATCH))
    assert sorted(seen) == [("a", "1"), ("b", "2")]


async def test_a_record_on_the_keyed_topic_not_written_by_tuneloop_is_dead_lettered() -> None:
    async def sink(key, event, info):
        raise AssertionError("must not be called")

    stage, _, dlq = pipeline(sink)
    await stage.take_keyed(message(DATA, binary_headers(), key=b"k", topic="keyed"))
    assert dict(dlq.sent[0]["headers"])["tuneloop-error-code"] == b"intake.failed"

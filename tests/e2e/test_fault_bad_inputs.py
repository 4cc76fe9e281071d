"""Fault suite 5, bad inputs: a wired worker on the real broker takes hundreds of malformed
records interleaved with good ones, and none of them crashes it or gets lost.

The malformed records are the event-path corpus (`tests/corpus/bad_records.py`, written by
hand, each with the dead-letter code it must get) plus hypothesis-generated fuzz: good records
with one thing broken in a way the CloudEvents spec or the event's schema forbids (a header
that is not UTF-8, an unsupported specversion, a time that is no RFC 3339 time, an extension
name with a forbidden character, data or an envelope that is not JSON, an envelope that is not
an object, an attribute that is not a string, a drift `value` that is not a number). The code
each must get follows from how it was broken, never from the intake under test. The fuzz is
generated once, derandomized, before the worker starts.

What must hold: the worker is still running; every bad record is in the DLQ exactly once,
byte for byte, with the expected code and its origin offset; every good event was decided on
by the rules (one audit decision each); stage 1's group's committed offsets are past every record.
"""

from __future__ import annotations

import asyncio
import json
import string
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaAdminClient

from handlers.codec import KafkaRecord
from handlers.dead_letters import read_reason
from orchestrator.clock import FixedClock
from orchestrator.testing import InMemoryBackend
from orchestrator.vocabulary.rejections import Rejection
from tests.corpus.bad_records import (
    GOOD_DRIFT,
    NOW,
    STRUCTURED,
    Headers,
    bad_records,
    binary_headers,
    envelope,
    good_records,
)
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions, read_records, send_records
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

LIMIT = 200_000
"""Event size limit of the worker: small, so the corpus's oversized records fit the broker."""
GOOD_COUNT = 40
FUZZ_EXAMPLES = 160

RULES = """
runtimes: [torch-distributed]
rules:
  - name: drift-watch
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 30d
    count: 1000000
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "file:///data/${ key }.jsonl"
"""
"""Every good event is counted (one `accumulate` decision each) and nothing launches."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """One bad record to send and the dead-letter code it must end with."""

    name: str
    value: bytes | None
    headers: Headers
    code: str


# Each fuzzed record is a good one with one thing broken in a way the CloudEvents spec (or
# the event's schema) forbids, and its code follows from that breakage, as the hand-written
# corpus's cases of the same kind say. Nothing here asks the intake what it thinks.
NAME_CHARS = string.ascii_lowercase + string.digits
# Finite floats only: json.dumps writes inf as `Infinity`, which is not JSON, so a record meant
# to break one attribute would break the whole envelope and earn another code.
json_scalars = (
    st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    st.none() | json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
not_utf8 = st.binary(max_size=40).map(lambda tail: b"\xff" + tail)
"""Bytes that are not UTF-8 (0xff never occurs in UTF-8), so not JSON either."""


@st.composite
def fuzzed_records(draw: st.DrawFn) -> tuple[str, bytes | None, Headers, str]:
    """(kind, value, headers, the code that kind of breakage must get)."""
    event_id = f"fuzz-{draw(st.uuids()).hex[:12]}"
    good_data = json.dumps(envelope(id=event_id)["data"]).encode()
    good_headers = binary_headers(ce_id=event_id)
    kind = draw(st.sampled_from(KINDS))
    if kind == "header-not-utf8":
        return kind, good_data, (*good_headers, ("ce_subject", draw(not_utf8))), "header.not_utf8"
    if kind == "specversion-unsupported":
        version = draw(
            st.text(NAME_CHARS + ".-", min_size=1, max_size=8).filter(lambda v: v != "1.0")
        )
        headers = binary_headers(ce_id=event_id, ce_specversion=version)
        return kind, good_data, headers, "attribute.unsupported_specversion"
    if kind == "time-not-rfc3339":
        time = "x" + draw(st.text(NAME_CHARS + ":-TZ+.", max_size=24))  # never starts a date
        return (
            kind,
            good_data,
            binary_headers(ce_id=event_id, ce_time=time),
            "attribute.invalid_time",
        )
    if kind == "extension-name-invalid":
        # an extension name is lowercase letters and digits only; each of these has one more
        name = (
            draw(st.text(NAME_CHARS, max_size=6))
            + draw(st.sampled_from("-_."))
            + draw(st.text(NAME_CHARS, max_size=6))
        )
        headers = (
            *good_headers,
            (f"ce_{name}", draw(st.binary(max_size=20).map(bytes.hex).map(str.encode))),
        )
        return kind, good_data, headers, "attribute.invalid_name"
    if kind == "data-not-json":
        return kind, draw(not_utf8), good_headers, "data.invalid_json"
    if kind == "envelope-not-json":
        return kind, draw(not_utf8), STRUCTURED, "structured.invalid_json"
    if kind == "envelope-not-object":
        body = draw(json_scalars | st.none() | st.lists(json_values, max_size=4))
        return kind, json.dumps(body).encode(), STRUCTURED, "structured.not_object"
    if kind == "attribute-not-a-string":
        member = draw(st.sampled_from(("id", "source", "type", "subject")))
        wrong = draw(
            st.booleans()
            | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.lists(json_values, max_size=3)
            | st.dictionaries(st.text(max_size=8), json_values, max_size=3)
        )
        body = envelope(id=event_id) | {member: wrong}
        return kind, json.dumps(body).encode(), STRUCTURED, "attribute.invalid"
    # "value-not-a-number": the drift schema's `value` is a number
    wrong_value = draw(
        st.none()
        | st.text(max_size=20)
        | st.lists(json_values, max_size=3)
        | st.dictionaries(st.text(max_size=8), json_values, max_size=3)
    )
    body = envelope(id=event_id, data={**GOOD_DRIFT, "value": wrong_value})
    return kind, json.dumps(body).encode(), STRUCTURED, "data.schema_mismatch"


KINDS = (
    "header-not-utf8",
    "specversion-unsupported",
    "time-not-rfc3339",
    "extension-name-invalid",
    "data-not-json",
    "envelope-not-json",
    "envelope-not-object",
    "attribute-not-a-string",
    "value-not-a-number",
)


def generate_fuzz(count: int) -> list[Malformed]:
    """*count* hypothesis examples, derandomized, each bad by construction."""
    found: list[Malformed] = []

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzzed_records())
    def collect(record: tuple[str, bytes | None, Headers, str]) -> None:
        kind, value, headers, code = record
        found.append(Malformed(f"fuzz-{len(found)}-{kind}", value, headers, code))

    collect()
    return found


def malformed_inputs() -> list[Malformed]:
    corpus = [
        Malformed(bad.name, bad.value, bad.headers, bad.code)
        for bad in bad_records(max_event_bytes=LIMIT)
    ]
    return corpus + generate_fuzz(FUZZ_EXAMPLES)


def committed(bootstrap: str, group: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    finally:
        admin.close()
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset > 0)


async def wait_committed(bootstrap: str, group: str, topic: str, end: int) -> int:
    """The group's committed offset on *topic* once it reaches *end* (or after 30 s)."""
    deadline = asyncio.get_running_loop().time() + 30
    while (offset := await asyncio.to_thread(committed, bootstrap, group, topic)) < end:
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.3)
    return offset


async def test_hundreds_of_malformed_records_go_to_the_dlq_and_the_good_ones_are_decided(
    kafka_bootstrap: str, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topics = worker_topics(new_topic, "bad")
    group = f"bad-{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    malformed = malformed_inputs()
    assert len(malformed) >= 200
    good = list(good_records(GOOD_COUNT, prefix="ok"))
    # a good event after every few bad ones, so that consuming must go on past each
    records: list[tuple[bytes | None, Headers]] = []
    expected_at: dict[int, Malformed] = {}
    spacing = max(1, len(malformed) // GOOD_COUNT)
    for index, bad in enumerate(malformed):
        expected_at[len(records)] = bad
        records.append((bad.value, bad.headers))
        if index % spacing == 0 and good:
            records.append(good.pop(0))
    records.extend(good)

    worker = build_test_worker(
        worker_settings(kafka_bootstrap, topics, group=group, max_event_bytes=LIMIT),
        rules=rules,
        backend=InMemoryBackend(FixedClock(NOW)),
        clock=FixedClock(NOW),
        tick_interval=0.5,
        producer_max_request_size=4 * LIMIT,
    )
    stats = worker.intake.stats
    # one partition for all, so that offsets name the records in sending order; a record
    # without a value gets a key, as Kafka wants one of the two
    await send_records(
        kafka_bootstrap,
        topics["in"],
        [
            KafkaRecord(
                value=value, headers=headers, key=None if value is not None else f"k{n}".encode()
            )
            for n, (value, headers) in enumerate(records)
        ],
        partition=0,
    )
    async with running(worker):
        await wait_for(
            lambda: stats.received == len(records) and stats.handled == GOOD_COUNT,
            what=f"every record to have an outcome ({stats})",
            timeout=90,
            interval=0.1,
        )
        # stage 1 of the intake commits the input offsets, in its own group
        committed_offset = await wait_committed(
            kafka_bootstrap, f"{group}-intake", topics["in"], len(records)
        )
        crash = worker.app._crash_reason
    letters = await read_records(kafka_bootstrap, topics["dlq"])
    decisions = await read_decisions(kafka_bootstrap, topics["audit"])
    decided_ids = [event_id for d in decisions for event_id in d["event_ids"]]
    reasons = [read_reason(letter.headers) for letter in letters]
    by_offset = {
        reason.offset: (reason, letter) for reason, letter in zip(reasons, letters, strict=True)
    }
    wrong = [
        f"{bad.name}: expected {bad.code}, got {by_offset[offset][0].code}"
        for offset, bad in expected_at.items()
        if offset in by_offset and by_offset[offset][0].code != bad.code
    ]
    missing = [bad.name for offset, bad in expected_at.items() if offset not in by_offset]
    print(
        f"\nbad inputs: records sent={len(records)} malformed={len(malformed)} "
        f"(corpus {len(malformed) - sum(m.name.startswith('fuzz-') for m in malformed)}, "
        f"fuzz {sum(m.name.startswith('fuzz-') for m in malformed)}) good={GOOD_COUNT} "
        f"processed={stats.handled} decisions={len(decisions)} DLQ count={len(letters)} "
        f"DLQ duplicates={len(letters) - len(by_offset)} lost={len(missing)} "
        f"wrong code={len(wrong)} crashes={0 if crash is None else 1} committed={committed_offset}"
    )
    assert crash is None, crash
    assert not missing, missing
    assert not wrong, wrong
    assert len(letters) == len(malformed), "a record was dead-lettered twice, or one extra"
    assert len(by_offset) == len(letters)
    assert set(by_offset) == set(expected_at)
    for offset, (reason, letter) in by_offset.items():
        assert reason.topic == topics["in"]
        assert reason.message.strip(), expected_at[offset].name
        assert letter.value == expected_at[offset].value, expected_at[offset].name
    assert not stats.dead_lettered[str(Rejection.INTAKE_FAILED)]
    assert not stats.dead_lettered[str(Rejection.SINK_FAILED)]
    assert stats.handled == GOOD_COUNT
    assert sorted(decided_ids) == sorted(f"ok-{n}" for n in range(GOOD_COUNT))
    assert committed_offset == len(records)

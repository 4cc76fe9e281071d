"""The seen-set's bounds and the dead-letter record format."""

from __future__ import annotations

from datetime import UTC, datetime

from handlers.codec import KafkaRecord, RecordInfo
from handlers.dead_letters import dead_letter_record, original_headers, read_reason
from handlers.dedup import SeenEvents, seen_key


def test_an_event_is_seen_until_its_ttl_passes() -> None:
    seen = SeenEvents({}, ttl_seconds=10, max_entries=100)
    seen.remember("k", partition=0, now=100.0)
    assert seen.has_seen("k", now=109.0)
    assert not seen.has_seen("k", now=110.0)


def test_forgetting_removes_expired_entries_of_that_partition_only() -> None:
    table: dict = {}
    seen = SeenEvents(table, ttl_seconds=10, max_entries=100)
    seen.remember("a", partition=0, now=0.0)
    seen.remember("b", partition=1, now=0.0)
    seen.remember("c", partition=0, now=8.0)
    assert seen.forget_old(partition=0, now=12.0) == 1
    assert set(table) == {"b", "c"}


def test_the_oldest_entries_go_first_beyond_the_size_bound() -> None:
    table: dict = {}
    seen = SeenEvents(table, ttl_seconds=1000, max_entries=2)
    for index, key in enumerate(("a", "b", "c", "d")):
        seen.remember(key, partition=0, now=float(index))
    seen.forget_old(partition=0, now=5.0)
    assert set(table) == {"c", "d"}


def test_the_index_is_rebuilt_from_the_table_after_a_rebalance() -> None:
    table = {"old": [0.0, 3], "new": [50.0, 3], "other": [0.0, 4]}
    seen = SeenEvents(table, ttl_seconds=10, max_entries=100)
    seen.reset_index()
    assert seen.forget_old(partition=3, now=55.0) == 1
    assert set(table) == {"new", "other"}


def test_seen_keys_scope_the_identity_by_rule_key() -> None:
    assert seen_key("m1", ("/s", "1")) != seen_key("m2", ("/s", "1"))
    assert seen_key("m1", ("/s", "1")) != seen_key("m1", ("/s1", ""))


def test_a_dead_letter_keeps_the_original_and_appends_the_reason() -> None:
    original = KafkaRecord(
        value=b"\xff raw", headers=(("ce_id", b"1"), ("x", b"a"), ("x", b"b")), key=b"k"
    )
    letter = dead_letter_record(
        original,
        origin=RecordInfo(topic="in", partition=2, offset=41),
        code="attribute.missing",
        message="required 'source' is missing",
        at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert (letter.value, letter.key) == (original.value, original.key)
    assert original_headers(letter.headers) == original.headers
    reason = read_reason(letter.headers)
    assert (reason.code, reason.topic, reason.partition, reason.offset) == (
        "attribute.missing",
        "in",
        2,
        41,
    )
    assert reason.at == "2026-01-01T00:00:00Z"


def test_a_producer_cannot_spoof_the_reason_of_a_dead_letter() -> None:
    original = KafkaRecord(value=b"x", headers=(("tuneloop-error-code", b"all.fine"),))
    letter = dead_letter_record(
        original,
        origin=RecordInfo(topic="in", partition=0, offset=0),
        code="record.not_cloudevent",
        message="m",
        at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert read_reason(letter.headers).code == "record.not_cloudevent"
    assert original_headers(letter.headers) == original.headers


def test_long_messages_are_cut_to_keep_headers_small() -> None:
    letter = dead_letter_record(
        KafkaRecord(value=b"x"),
        origin=RecordInfo(topic="in", partition=0, offset=0),
        code="data.schema_mismatch",
        message="y" * 10_000,
        at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert len(read_reason(letter.headers).message) == 1000

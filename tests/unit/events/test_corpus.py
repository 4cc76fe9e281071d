"""Every record of the bad-record corpus is refused by the intake with its documented code."""

from __future__ import annotations

from datetime import timedelta

import pytest

from handlers.codec import KafkaRecord
from handlers.intake import admit, refuse_unknown_types
from orchestrator.errors import InvalidEventError
from orchestrator.vocabulary import Rejection, SchemaRegistry
from tests.corpus.bad_records import NOW, bad_records, good_records

LIMIT = 1_048_576
CORPUS = tuple(bad_records(max_event_bytes=LIMIT))
REGISTRY = SchemaRegistry.builtin()


def admit_record(value: bytes | None, headers, key: bytes | None = None):
    return admit(
        KafkaRecord(value=value, headers=headers, key=key),
        arrived_at=NOW,
        now=NOW,
        registry=REGISTRY,
        accepts_unknown_type=refuse_unknown_types,
        max_event_bytes=LIMIT,
        max_age=timedelta(hours=24),
    )


def test_the_corpus_has_over_a_hundred_distinct_records() -> None:
    assert len(CORPUS) >= 100
    assert len({record.name for record in CORPUS}) == len(CORPUS)


def test_every_corpus_code_is_a_documented_rejection() -> None:
    assert {record.code for record in CORPUS} <= {member.value for member in Rejection}


@pytest.mark.parametrize("record", CORPUS, ids=[record.name for record in CORPUS])
def test_bad_record_is_refused_with_its_code(record) -> None:
    with pytest.raises(InvalidEventError) as caught:
        admit_record(record.value, record.headers, record.key)
    assert caught.value.code == record.code, caught.value.message


def test_good_records_of_both_modes_are_admitted() -> None:
    for value, headers in good_records(6):
        (event,) = admit_record(value, headers)
        assert event.data["model_id"] == "chat"


def test_an_unknown_type_passes_only_where_a_rule_accepts_it() -> None:
    record = KafkaRecord(
        value=b'{"anything": 1}',
        headers=(
            ("ce_specversion", b"1.0"),
            ("ce_id", b"1"),
            ("ce_source", b"/s"),
            ("ce_type", b"com.example.custom"),
        ),
    )
    (event,) = admit(
        record,
        arrived_at=NOW,
        now=NOW,
        registry=REGISTRY,
        accepts_unknown_type=lambda event_type: event_type == "com.example.custom",
        max_event_bytes=LIMIT,
        max_age=None,
    )
    assert event.data == {"anything": 1}


def test_without_a_time_attribute_the_age_is_the_record_timestamp() -> None:
    headers = (
        ("ce_specversion", b"1.0"),
        ("ce_id", b"1"),
        ("ce_source", b"/s"),
        ("ce_type", b"io.tuneloop.data.arrived.v1"),
    )
    record = KafkaRecord(value=b'{"dataset_id": "d", "uri": "s3://d", "rows": 1}', headers=headers)
    with pytest.raises(InvalidEventError) as caught:
        admit(
            record,
            arrived_at=NOW - timedelta(days=3),
            now=NOW,
            registry=REGISTRY,
            accepts_unknown_type=refuse_unknown_types,
            max_event_bytes=LIMIT,
            max_age=timedelta(hours=24),
        )
    assert caught.value.code == "event.too_old"

"""The events of the worker benchmarks: keyed input carries the model id as its record key."""

from __future__ import annotations

import json

from bench.events import drift_record, drift_records


def test_a_keyed_event_has_its_model_id_as_record_key_and_partitionkey():
    key, value, headers = drift_record("e-1", "model-7", keyed=True)
    assert key == b"model-7"
    assert ("ce_partitionkey", b"model-7") in list(headers)
    assert json.loads(value)["model_id"] == "model-7"


def test_an_unkeyed_event_has_no_record_key_and_no_partitionkey():
    key, _, headers = drift_record("e-1", "model-7", keyed=False)
    assert key is None
    assert not [name for name, _ in headers if name == "ce_partitionkey"]


def test_a_batch_numbers_its_events_and_keeps_the_order_of_the_models():
    records = drift_records("run", ["a", "b", "a"], keyed=True)
    assert [key for key, _, _ in records] == [b"a", b"b", b"a"]
    ids = [dict(headers)["ce_id"] for _, _, headers in records]
    assert ids == [b"run-00000000", b"run-00000001", b"run-00000002"]

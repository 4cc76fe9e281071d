"""A rule key's partition is the one a Java producer would choose, for any partition count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from handlers.partitions.placing import partition_for, placed, rule_key_partition

JAVA_MURMUR2 = {
    # Utils.murmur2 of the Java client, as its users publish them (signed 32-bit ints).
    "1": -1993445489,
    "12": 126087238,
    "123": -267702483,
    "1234": -1614185708,
    "12345": -1188365604,
    "21": -973932308,
    "foobar": -790332482,
}


@pytest.mark.parametrize(("key", "java_hash"), sorted(JAVA_MURMUR2.items()))
@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 8, 12, 64])
def test_a_key_goes_where_the_java_client_sends_it(key, java_hash, partitions):
    # DefaultPartitioner: Utils.toPositive(hash) % numPartitions
    assert partition_for(key.encode(), partitions) == (java_hash & 0x7FFFFFFF) % partitions


def test_two_keys_worked_by_hand():
    # "21": -973932308 -> toPositive 1173551340 = 4 * 293387835 = 8 * 146693917 + 4
    assert partition_for(b"21", 4) == 0
    assert partition_for(b"21", 8) == 4
    # "1": -1993445489 -> toPositive 154038159, odd; = 4 * 38509539 + 3
    assert partition_for(b"1", 2) == 1
    assert partition_for(b"1", 4) == 3


@given(key=st.binary(max_size=64), partitions=st.integers(min_value=1, max_value=256))
def test_any_key_goes_where_kafka_python_would_send_it(key, partitions):
    assert partition_for(key, partitions) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions


def test_a_rule_key_is_hashed_as_its_utf8_bytes():
    assert rule_key_partition("modèle-7", 8) == partition_for("modèle-7".encode(), 8)


def test_a_topic_without_partitions_is_refused():
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for(b"m1", 0)


def test_the_candidate_that_hashes_to_the_partition_the_entry_was_on_is_its_rule_key():
    # kafka-python's murmur2 says: "m1" and "m3" are on 0 of 2, "m2" on 1.
    assert placed(["m2", "m1"], found_on=0, partitions=2) == "m1"
    assert placed(["m1", "m3"], found_on=0, partitions=2) == "m1"  # the first one that fits
    assert placed(["m2"], found_on=1, partitions=2) == "m2"


def test_an_entry_whose_candidates_all_hash_elsewhere_is_not_placed():
    assert placed(["m1", "m3"], found_on=1, partitions=2) is None
    assert placed([], found_on=0, partitions=2) is None

"""Which internal partition a rule key belongs to. Pure.

The keyed topic is written with the producer's default partitioner (aiokafka's, which is
Java's: `toPositive(murmur2(key)) % partitions`), by the intake for forwarded events and by the
worker for its signals; faust writes a Table's changelog record to the partition of the keyed
record being processed. So every record of a rule key, and every Table entry of it, is on
`partition_for(key)`. Moving to another partition count moves each key to the partition this
function gives for the new count.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka.partitioner import murmur2


def partition_for(key: bytes, partitions: int) -> int:
    """The partition, out of *partitions*, that the producer's default partitioner sends a
    record keyed *key* to."""
    if partitions <= 0:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def rule_key_partition(rule_key: str, partitions: int) -> int:
    """The partition of the keyed topic (and of every Table) that holds *rule_key*."""
    return partition_for(rule_key.encode("utf-8"), partitions)


def placed(candidates: Sequence[str], *, found_on: int, partitions: int) -> str | None:
    """Of the rule keys an entry may belong to (`entries.rule_key_candidates`), the first one
    that hashes to *found_on*, the partition (of *partitions*) the entry was found on; None
    when none does, so an entry is never moved by a rule key the worker did not file it
    under."""
    for candidate in candidates:
        if rule_key_partition(candidate, partitions) == found_on:
            return candidate
    return None

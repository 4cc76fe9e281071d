"""The input offsets a migration carries over: stage 1's own group's, else the faust group's."""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from handlers.partitions.growing import carried_input_offsets
from orchestrator.settings import KafkaSettings

KAFKA = KafkaSettings(group_id="g", topics_in=("events", "more"))


def test_stage_ones_own_group_wins_when_it_committed_any():
    intake = {TopicPartition("events", 0): 40}
    faust_group = {TopicPartition("events", 0): 12, TopicPartition("more", 0): 3}
    assert carried_input_offsets(KAFKA, intake, faust_group) == (
        "g-intake",
        {TopicPartition("events", 0): 40},
    )


def test_the_faust_group_is_used_when_stage_one_has_no_group_of_its_own_yet():
    faust_group = {TopicPartition("events", 1): 12, TopicPartition("g-tuneloop-keyed", 0): 9}
    assert carried_input_offsets(KAFKA, {}, faust_group) == (
        "g",
        {TopicPartition("events", 1): 12},
    )


def test_offsets_of_other_topics_are_never_carried():
    intake = {TopicPartition("elsewhere", 0): 5}
    assert carried_input_offsets(KAFKA, intake, {}) == (None, {})

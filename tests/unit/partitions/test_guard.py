"""A group's internal partition count is fixed: a worker with another count is refused, with
the way to grow it named."""

from __future__ import annotations

from handlers.partitions.cluster import TopicShape
from handlers.partitions.guard import changed_partitions
from orchestrator.settings import KafkaSettings


def shapes(**counts: int) -> dict[str, TopicShape]:
    return {name.replace("_", "-"): TopicShape(n, 1) for name, n in counts.items()}


def test_a_group_whose_topics_have_the_configured_count_may_start():
    topics = shapes(g_tuneloop_keyed=8, g_tuneloop_seen_changelog=8)
    assert changed_partitions(KafkaSettings(group_id="g", internal_partitions=8), topics) is None


def test_a_new_group_may_start_with_any_count():
    topics = shapes(other_tuneloop_keyed=8, events=3)
    assert changed_partitions(KafkaSettings(group_id="g", internal_partitions=16), topics) is None


def test_a_changed_count_is_refused_with_the_counts_and_the_way_to_grow():
    topics = shapes(g_tuneloop_keyed=8, g_tuneloop_seen_changelog=8, g_tuneloop_jobs_changelog=8)
    reason = changed_partitions(KafkaSettings(group_id="g", internal_partitions=16), topics)
    assert reason is not None
    assert "TUNELOOP_KAFKA_INTERNAL_PARTITIONS is 16" in reason
    assert "g-tuneloop-keyed has 8" in reason
    assert "g-tuneloop-seen-changelog has 8" in reason
    assert "Keep 8" in reason
    assert "tuneloop partitions grow --to-group NEW --partitions 16" in reason
    assert "docs/partitions.md" in reason


def test_a_changelog_alone_with_another_count_is_refused_too():
    topics = shapes(g_tuneloop_keyed=4, g_tuneloop_champions_changelog=2)
    reason = changed_partitions(KafkaSettings(group_id="g", internal_partitions=4), topics)
    assert reason is not None
    assert "g-tuneloop-champions-changelog has 2" in reason

"""Each Table entry names the rule key it was written under, so it can move with that key."""

from __future__ import annotations

from pathlib import Path

import pytest

from handlers.app import build_worker
from handlers.dedup import seen_key
from handlers.partitions.entries import KEY_SERIALIZER, TABLES, layout_of, table_of_changelog
from orchestrator.clock import FixedClock
from orchestrator.errors import ConfigError
from orchestrator.settings import KafkaSettings, Settings, WorkerSettings
from orchestrator.testing import InMemoryBackend
from tests.unit.rules.builders import at

RULES = """
runtimes: [torch-distributed]
rules:
  - name: retrain
    on: {type: io.tuneloop.drift.detected.v1}
    key: "event.data.model_id"
    launch: {runtime: torch-distributed, base_model: tiny, dataset: "file:///d.jsonl"}
"""


def rule_keys(table: str, key: str, value: object = None) -> tuple[str, ...]:
    return layout_of(table).rule_keys(key, value)


def test_a_rule_state_entry_is_keyed_by_its_rule_key():
    assert rule_keys("tuneloop-rule-state", "chat-model/7") == ("chat-model/7",)


def test_a_champion_entry_names_its_rule_key_after_the_rule():
    assert rule_keys("tuneloop-champions", "retrain/chat-model/7") == ("chat-model/7",)
    assert rule_keys("tuneloop-champions", "no-rule-name") == ()


def test_a_completion_record_names_its_rule_key_in_its_context():
    record = {"job": "retrain-m1-1a2b", "context": {"job": "retrain-m1-1a2b", "key": "m1"}}
    assert rule_keys("tuneloop-jobs", "retrain-m1-1a2b", record) == ("m1",)


def test_a_completion_record_without_a_context_names_no_rule_key():
    assert rule_keys("tuneloop-jobs", "j", {"job": "j", "context": None}) == ()
    assert rule_keys("tuneloop-jobs", "j", {"job": "j", "context": {"key": ""}}) == ()


def test_a_seen_entry_names_the_rule_key_the_intake_scoped_it_by():
    key = seen_key("m1", ("/monitors/psi", "d-1"))
    assert rule_keys("tuneloop-seen", key)[0] == "m1"


def test_a_seen_entry_whose_key_or_id_holds_a_separator_offers_each_split():
    key = "a\x1fb\x1f/src\x1fid"  # rule key "a\x1fb", or rule key "a" and id "id" after "b"?
    assert rule_keys("tuneloop-seen", key) == ("a", "a\x1fb")


def test_a_seen_entry_moves_with_its_new_partition_written_in_it():
    restamp = layout_of("tuneloop-seen").restamp
    assert restamp is not None
    assert restamp([1796406688.95, 1], 3) == [1796406688.95, 3]


def test_entries_of_the_other_tables_move_as_they_are():
    assert all(
        TABLES[name].restamp is None
        for name in ("tuneloop-rule-state", "tuneloop-jobs", "tuneloop-champions")
    )


def test_a_table_the_migration_does_not_know_is_refused_by_name():
    with pytest.raises(ConfigError, match="'tuneloop-new-thing'"):
        layout_of("tuneloop-new-thing")


@pytest.mark.parametrize(
    ("topic", "table"),
    [
        ("grp-tuneloop-seen-changelog", "tuneloop-seen"),
        ("grp-tuneloop-rule-state-changelog", "tuneloop-rule-state"),
        ("grp-tuneloop-keyed", None),
        ("other-tuneloop-seen-changelog", None),
        ("grp-__assignor-__leader", None),
    ],
)
def test_a_changelog_of_the_group_names_its_table(topic, table):
    assert table_of_changelog("grp", topic) == table


def test_every_table_a_worker_keeps_is_one_the_migration_can_move(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    clock = FixedClock(at(0))
    worker = build_worker(
        Settings(kafka=KafkaSettings(group_id="tables"), worker=WorkerSettings(rules=(rules,))),
        backend=InMemoryBackend(clock),
        clock=clock,
    )
    tables = dict(worker.app.tables)
    assert set(tables) == set(TABLES)
    for name, table in tables.items():
        assert table.key_serializer == KEY_SERIALIZER, name
        assert table.value_serializer == TABLES[name].value_serializer, name
        assert table.changelog_topic.get_topic_name() == TABLES[name].changelog("tables")

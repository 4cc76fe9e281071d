"""`TUNELOOP_HANDOFF_*`: targets and paths as JSON, checked when read."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.settings import Settings


def test_without_variables_there_is_no_target_and_the_ledger_has_its_topic():
    handoff = Settings.from_env({}).handoff

    assert dict(handoff.targets) == {}
    assert handoff.group_id == "tuneloop-handoff"
    assert handoff.topic_ledger == "tuneloop.handoff.ledger"
    assert (handoff.topic_in, handoff.topic_out) == (None, None)


def test_targets_and_paths_are_read_from_json():
    handoff = Settings.from_env(
        {
            "TUNELOOP_HANDOFF_TARGETS": (
                '{"chat": ["http://a:8000/", "http://b:8000"], "*": "https://c"}'
            ),
            "TUNELOOP_HANDOFF_PATHS": '{"s3://adapters/": "/mnt/adapters/"}',
            "TUNELOOP_HANDOFF_API_KEY": "sekret",
            "TUNELOOP_HANDOFF_RETRY_REPORT_AFTER": "2",
        }
    ).handoff

    assert dict(handoff.targets) == {
        "chat": ("http://a:8000", "http://b:8000"),
        "*": ("https://c",),
    }
    assert dict(handoff.paths) == {"s3://adapters/": "/mnt/adapters/"}
    assert handoff.retry_report_after == 2
    assert "sekret" not in repr(handoff)


@pytest.mark.parametrize(
    ("variables", "words"),
    [
        ({"TUNELOOP_HANDOFF_TARGETS": "{not json"}, "TUNELOOP_HANDOFF_TARGETS is not JSON"),
        ({"TUNELOOP_HANDOFF_TARGETS": '["http://a"]'}, "must be a JSON object"),
        ({"TUNELOOP_HANDOFF_TARGETS": '{"chat": 5}'}, "a URL or a list of URLs"),
        ({"TUNELOOP_HANDOFF_TARGETS": '{"chat": ["a:8000"]}'}, "is not an http"),
        ({"TUNELOOP_HANDOFF_PATHS": '{"s3://a/": 1}'}, "every value must be a path prefix"),
        ({"TUNELOOP_HANDOFF_RETRY_FIRST_DELAY": "0"}, "RETRY_FIRST_DELAY must be positive"),
        (
            {"TUNELOOP_HANDOFF_RETRY_MAX_DELAY": "0.5"},
            "RETRY_MAX_DELAY must be at least",
        ),
    ],
    ids=[
        "targets not JSON",
        "targets not an object",
        "servers not URLs",
        "a URL without a scheme",
        "a path that is no string",
        "no first delay",
        "a cap below the first delay",
    ],
)
def test_a_bad_variable_is_refused_by_name(variables, words):
    with pytest.raises(ConfigError, match=words):
        Settings.from_env(variables)

"""TUNELOOP_WHY_NOT_PER_MINUTE: how many why-not records one rule may write per minute."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.settings import Settings


def test_the_limit_is_ten_per_rule_per_minute_unless_set():
    assert Settings.from_env({}).worker.why_not_per_minute == 10


def test_the_limit_is_read_from_its_variable():
    settings = Settings.from_env({"TUNELOOP_WHY_NOT_PER_MINUTE": "3"})
    assert settings.worker.why_not_per_minute == 3


@pytest.mark.parametrize("value", ["0", "-1", "many"], ids=["zero", "negative", "not-a-number"])
def test_a_limit_that_is_not_a_positive_integer_refuses_to_start(value):
    with pytest.raises(ConfigError, match="TUNELOOP_WHY_NOT_PER_MINUTE"):
        Settings.from_env({"TUNELOOP_WHY_NOT_PER_MINUTE": value})

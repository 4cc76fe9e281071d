"""`tuneloop handoff` refuses to start without a server to hand adapters to."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from handlers.cli.main import app


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "TUNELOOP_HANDOFF_TARGETS names no server"),
        ({"TUNELOOP_HANDOFF_TARGETS": "{}"}, "TUNELOOP_HANDOFF_TARGETS names no server"),
        ({"TUNELOOP_HANDOFF_TARGETS": '{"*": "vllm:8000"}'}, "is not an http:// or https:// URL"),
    ],
    ids=["unset", "empty", "a target without a scheme"],
)
def test_handoff_without_a_usable_target_refuses_to_start(env, words, monkeypatch):
    monkeypatch.delenv("TUNELOOP_HANDOFF_TARGETS", raising=False)

    result = CliRunner().invoke(app, ["handoff"], env=env)

    assert result.exit_code == 1
    assert "tuneloop handoff: refusing to start" in result.output
    assert words in result.output

"""`tuneloop emit --dry-run`: the record it would send, and the events it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from handlers.cli import event_commands

# Only the event commands: the full CLI imports every area (and torch) for nothing here.
app = typer.Typer()
app.callback()(lambda: None)
event_commands.register(app)
runner = CliRunner()


def emit(*args: str):
    return runner.invoke(app, ["emit", *args, "--dry-run"], env={"TUNELOOP_KAFKA_TOPICS_IN": "in"})


def test_flags_make_a_binary_record_keyed_by_partitionkey() -> None:
    result = emit(
        "--type",
        "io.tuneloop.drift.detected.v1",
        "--source",
        "/monitors/evidently",
        "--id",
        "run-1",
        "--data",
        '{"model_id": "chat"}',
        "--key",
        "chat",
        "--ext",
        "correlationid=run-1",
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["topic"] == "in"
    assert shown["key"] == "chat"
    assert "ce_id: run-1" in shown["headers"]
    assert "ce_partitionkey: chat" in shown["headers"]
    assert "content-type: application/json" in shown["headers"]
    assert json.loads(shown["value"]) == {"model_id": "chat"}


def test_structured_mode_sends_one_json_envelope() -> None:
    result = emit("--type", "t", "--id", "1", "--mode", "structured", "--data", "[1]")
    shown = json.loads(result.output)
    assert shown["headers"] == ["content-type: application/cloudevents+json; charset=UTF-8"]
    assert json.loads(shown["value"])["data"] == [1]


def test_a_file_with_an_array_becomes_one_batch_record(tmp_path: Path) -> None:
    path = tmp_path / "events.json"
    event = {"specversion": "1.0", "source": "/s", "type": "t"}
    path.write_text(json.dumps([{**event, "id": "1"}, {**event, "id": "2"}]))
    shown = json.loads(emit("--file", str(path)).output)
    assert shown["headers"] == ["content-type: application/cloudevents-batch+json; charset=UTF-8"]
    assert [item["id"] for item in json.loads(shown["value"])] == ["1", "2"]


def test_an_event_the_intake_would_refuse_is_not_sent(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"specversion": "1.0", "source": "/s", "type": "t"}))
    result = emit("--file", str(path))
    assert result.exit_code == 1
    assert "attribute.missing" in result.output


def test_bad_extension_flag_is_refused() -> None:
    result = emit("--type", "t", "--ext", "Model=x")
    assert result.exit_code == 1
    assert "attribute.invalid_name" in result.output

"""The rule CLI on the shipped example files, through typer's runner (no services needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from handlers.cli.main import app
from handlers.codec import encode_event
from orchestrator.ledger import DecisionRecord, to_cloudevent

RULES = "docs/examples/rules.yaml"
EVENTS = "docs/examples/events.jsonl"
runner = CliRunner()


def test_check_accepts_the_example_with_a_one_line_summary():
    result = runner.invoke(app, ["check", RULES])
    assert result.exit_code == 0, result.output
    assert result.output.count("\n") == 1
    assert result.output.startswith("ok: 2 rule(s) in 1 file(s)")


def test_check_reports_each_problem_as_file_line_col_and_exits_1(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "rules:\n  - name: r\n    on: {type: io.tuneloop.drift.detected.v1}\n"
        "    windw: 6h\n    cooldown: a while\n"
        "    launch: {runtime: rt, base_model: m, dataset: d}\n"
    )
    result = runner.invoke(app, ["check", str(bad)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [
        f"{bad}:4:5: unknown key 'windw' in a rule (did you mean 'window'?)",
        f"{bad}:5:15: cooldown: bad duration 'a while': use a number and a unit s, m, h, d or w,"
        " like 90s, 30m, 6h, 2d or 1h30m",
    ]


def test_simulate_json_prints_one_record_per_line_and_reports_invalid_events():
    result = runner.invoke(app, ["simulate", "--rules", RULES, "--events", EVENTS, "--json"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert "events.jsonl:10: skipped invalid event" in result.stderr
    for record in records:
        assert {"outcome", "reason", "rule", "key", "time", "event_ids"} <= set(record)
    [launch] = [r for r in records if r["outcome"] == "launch"]
    assert launch["rule"] == "chat-drift-retrain"
    assert launch["key"] == "chat-model-7"
    assert launch["job"]["runtime"] == "torch-distributed"
    assert launch["job"]["base_model"] == "HuggingFaceTB/SmolLM2-135M"
    assert launch["job"]["dataset"] == "s3://corpora/chat-model-7/2026-03-01.jsonl"
    assert set(launch["job"]) >= {"name", "lora", "training", "resources"}
    outcomes = {(r["outcome"], r["reason"]) for r in records}
    assert {("late", None), ("suppress", "duplicate"), ("suppress", "shadow")} <= outcomes
    # An event whose data does not match its type's schema is refused as the intake would.
    assert "events.jsonl:13: skipped invalid event: type 'io.tuneloop.drift.detected.v1'" in (
        result.stderr
    )


def test_simulate_without_json_prints_a_table():
    result = runner.invoke(app, ["simulate", "--rules", RULES, "--events", EVENTS])
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].split()[:5] == ["TIME", "RULE", "KEY", "OUTCOME", "REASON"]
    assert "1 launch(es)" in result.stdout


def test_explain_tells_the_story_of_a_rule_and_key_from_simulate_records(tmp_path):
    records = tmp_path / "records.jsonl"
    simulated = runner.invoke(app, ["simulate", "--rules", RULES, "--events", EVENTS, "--json"])
    records.write_text(simulated.stdout)
    result = runner.invoke(
        app,
        [
            "explain",
            "--rule",
            "chat-drift-retrain",
            "--key",
            "chat-model-7",
            "--records",
            str(records),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "launch" in result.output
    assert "Launched 1 time(s)" in result.output
    why_not = runner.invoke(
        app,
        [
            "explain",
            "--rule",
            "chat-drift-retrain",
            "--event",
            "spoofed-1",
            "--records",
            str(records),
        ],
    )
    # The example's spoofed event comes from a laptop, which the rule's source glob refuses.
    assert why_not.exit_code == 0, why_not.output
    assert "ignore (source-mismatch)" in why_not.output
    assert "source '/laptop/bob' matches none of the rule's sources ('/monitors/*')" in (
        why_not.output
    )


def test_explain_event_alone_names_every_rule_that_decided_about_it(tmp_path):
    records = tmp_path / "records.jsonl"
    simulated = runner.invoke(app, ["simulate", "--rules", RULES, "--events", EVENTS, "--json"])
    records.write_text(simulated.stdout)
    result = runner.invoke(app, ["explain", "--event", "spoofed-1", "--records", str(records)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:2] == [
        "Event 'spoofed-1':",
        "  rule 'chat-drift-retrain': ignored it (source-mismatch)",
    ]


def test_explain_needs_a_rule_or_an_event():
    result = runner.invoke(app, ["explain", "--records", "whatever.jsonl"])
    assert result.exit_code == 2
    assert "give --rule" in result.output


def test_rule_tests_as_data_pass_and_a_wrong_expectation_fails(tmp_path):
    result = runner.invoke(app, ["test", RULES, "docs/examples/rule-tests/"])
    assert result.exit_code == 0, result.output
    assert "3 passed, 0 failed" in result.output
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        "cases:\n  - name: expects a launch that never happens\n    events:\n"
        "      - {id: d1, source: /monitors/x, type: io.tuneloop.drift.detected.v1,"
        " time: '2026-03-01T08:00:00Z', data: {model_id: m, metric: psi, value: 1,"
        " threshold: 0}}\n"
        "    expect:\n      - {rule: chat-drift-retrain, outcome: launch}\n"
    )
    failed = runner.invoke(app, ["test", RULES, str(wrong)])
    assert failed.exit_code == 1
    assert "FAIL" in failed.output
    assert "expected 'launch', got 'accumulate'" in failed.output


def test_a_rule_test_that_expects_no_why_not_records_is_not_failed_by_them(tmp_path):
    # d0's value is below its threshold, so the rule's `where` turns it away: a why-not
    # record (outcome ignore) the case does not mention, written before such records existed.
    drift = (
        "      - {{id: {id}, source: /monitors/x, type: io.tuneloop.drift.detected.v1,"
        " time: '2026-03-01T08:0{minute}:00Z', data: {{model_id: m, metric: psi,"
        " value: {value}, threshold: 0.2}}}}\n"
    )
    events = drift.format(id="d0", minute=0, value=0.1) + drift.format(id="d1", minute=1, value=1)
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text(
        "cases:\n  - name: one real drift counts\n    events:\n" + events + "    expect:\n"
        "      - {rule: chat-drift-retrain, event: d1, outcome: accumulate}\n"
    )
    asked = tmp_path / "asked.yaml"
    asked.write_text(
        "cases:\n  - name: the low drift is turned away, and says why\n    events:\n"
        + events
        + "    expect:\n"
        "      - {rule: chat-drift-retrain, event: d0, outcome: ignore, reason: where-false}\n"
        "      - {rule: chat-drift-retrain, event: d1, outcome: accumulate}\n"
    )

    for case in (quiet, asked):
        result = runner.invoke(app, ["test", RULES, str(case)])
        assert result.exit_code == 0, result.output
        assert "1 passed, 0 failed" in result.output


def test_simulate_reports_a_missing_events_file_and_exits_1(tmp_path):
    result = runner.invoke(
        app, ["simulate", "--rules", RULES, "--events", str(tmp_path / "nope.jsonl")]
    )
    assert result.exit_code == 1
    assert "cannot read" in result.stderr


def test_simulate_skips_an_untimed_event_that_comes_before_any_clock(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"specversion": "1.0", "id": "x", "source": "/monitors/a",'
        ' "type": "io.tuneloop.drift.detected.v1",'
        ' "data": {"model_id": "m", "metric": "psi", "value": 1, "threshold": 0}}\n'
    )
    result = runner.invoke(app, ["simulate", "--rules", RULES, "--events", str(events)])
    assert result.exit_code == 0
    assert "skipped event 'x'" in result.stderr


def test_check_refuses_a_bad_rule_even_among_good_files(tmp_path):
    (tmp_path / "good.yaml").write_text(Path(RULES).read_text())
    (tmp_path / "more.yaml").write_text("rules:\n  - name: chat-drift-retrain\n")
    result = runner.invoke(app, ["check", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path}/more.yaml:2:5: every rule needs `on:`" in result.output


@pytest.mark.kafka
def test_explain_reads_the_story_from_the_audit_topic(kafka_bootstrap, new_topic):
    from kafka import KafkaProducer

    topic = new_topic("audit")
    simulated = runner.invoke(app, ["simulate", "--rules", RULES, "--events", EVENTS, "--json"])
    records = [DecisionRecord.from_json(json.loads(line)) for line in simulated.stdout.splitlines()]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for record in records:
        encoded = encode_event(to_cloudevent(record))
        producer.send(topic, value=encoded.value, key=encoded.key, headers=list(encoded.headers))
    producer.send(topic, value=b"not a cloudevent")
    producer.flush()
    producer.close()
    result = runner.invoke(
        app,
        [
            "explain",
            "--rule",
            "chat-drift-retrain",
            "--key",
            "chat-model-7",
            "--bootstrap",
            kafka_bootstrap,
            "--topic",
            topic,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Launched 1 time(s)" in result.stdout
    assert "skipped" in result.stderr

"""`tuneloop explain` tells whether the job an event caused was promoted, from audit records
written as the worker writes them (the promote and decline records of the promotion gate)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from typer.testing import CliRunner

from handlers.cli.main import app
from orchestrator.ledger import DecisionRecord, Outcome, Reason

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
runner = CliRunner()


def record(outcome, reason, *, event, minutes, message="", job="ft-1"):
    return DecisionRecord(
        outcome=outcome,
        reason=reason,
        rule="drift-promote",
        rule_version="v1",
        key="m1",
        time=T0 + timedelta(minutes=minutes),
        event_ids=(event,),
        message=message,
        job_name=job,
    )


def write(tmp_path, *records):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def test_an_event_whose_job_was_promoted_says_so(tmp_path):
    records = write(
        tmp_path,
        record(Outcome.LAUNCH, None, event="e1", minutes=0),
        record(
            Outcome.PROMOTE,
            Reason.NO_CHAMPION,
            event="e1",
            minutes=5,
            message="no champion yet: the first adapter is promoted (eval_loss 1.5)",
        ),
    )

    result = runner.invoke(app, ["explain", "--event", "e1", "--records", str(records)])

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1] == (
        "  rule 'drift-promote' for key 'm1': promoted the adapter of the job it caused"
        " (no-champion)"
    )
    assert "promote (no-champion)" in lines[-1]
    assert "the first adapter is promoted (eval_loss 1.5)" in lines[-1]


def test_the_story_of_a_key_ends_with_why_its_last_adapter_was_declined(tmp_path):
    declined = "eval_loss 1.8 against the champion's 1.5: worse"
    records = write(
        tmp_path,
        record(Outcome.LAUNCH, None, event="e1", minutes=0),
        record(Outcome.PROMOTE, Reason.NO_CHAMPION, event="e1", minutes=5),
        record(Outcome.LAUNCH, None, event="e2", minutes=10, job="ft-2"),
        record(Outcome.DECLINE, Reason.NOT_BETTER, event="e2", minutes=15, message=declined),
    )

    result = runner.invoke(
        app,
        ["explain", "--rule", "drift-promote", "--key", "m1", "--records", str(records)],
    )

    assert result.exit_code == 0, result.output
    assert "Launched 2 time(s); last job ft-2" in result.output
    assert f"Last decision: decline (not-better): {declined}" in result.output

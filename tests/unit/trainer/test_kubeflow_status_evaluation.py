"""The evaluation's scores reach Kubeflow's trainerStatus in the final report, against the
named STAND-IN status server (`stand_in_status_server.py`), within the API's bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.trainer.stand_in_status_server import StandInStatusServer
from tests.unit.trainer.test_kubeflow_status import (
    Clock,
    _metrics,
    _reporter,
    assert_is_an_update_trainjob_status_request,
)


@pytest.fixture
def server(tmp_path: Path):
    stand_in = StandInStatusServer().start(tmp_path)
    yield stand_in
    stand_in.stop()


def test_the_final_report_carries_both_adapters_scores_and_the_gates_eval_loss(server):
    reporter, _ = _reporter(server, Clock())
    reporter.emit("started", total_steps=2)
    reporter.emit(
        "completed",
        metrics={
            "eval_loss_after": 0.75,
            "eval_loss": 0.5,
            "perplexity": 1.6487212707001282,
            "token_accuracy": 0.625,
            "champion_eval_loss": 0.875,
            "champion_perplexity": 2.398875293967098,
            "champion_token_accuracy": 0.5,
        },
    )

    final = server.received[-1].body
    assert_is_an_update_trainjob_status_request(final)
    metrics = _metrics(final)
    assert metrics["eval_loss"] == "0.5", "the evaluation's loss, not the Trainer's"
    assert metrics["eval_loss_after"] == "0.75"
    assert metrics["perplexity"] == "1.6487212707001282"
    assert metrics["token_accuracy"] == "0.625"
    assert metrics["champion_eval_loss"] == "0.875"
    assert metrics["champion_perplexity"] == "2.398875293967098"
    assert metrics["champion_token_accuracy"] == "0.5"


def test_a_run_that_did_not_evaluate_reports_the_trainers_loss_as_eval_loss(server):
    reporter, _ = _reporter(server, Clock())
    reporter.emit("completed", metrics={"eval_loss_after": 0.75})

    assert _metrics(server.received[-1].body)["eval_loss"] == "0.75"


def test_why_the_champion_could_not_be_evaluated_is_reported_as_text_of_at_most_64(server):
    reason = "no complete published adapter at s3://adapters/ft-0 (no manifest, or a file missing)"
    reporter, _ = _reporter(server, Clock())
    reporter.emit("completed", metrics={"eval_loss": 0.5, "champion_error": reason})

    final = server.received[-1].body
    assert_is_an_update_trainjob_status_request(final)
    assert _metrics(final)["champion_error"] == reason[:64]

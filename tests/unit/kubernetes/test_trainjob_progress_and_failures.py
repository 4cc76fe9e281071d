"""What the worker reads from a TrainJob's status: the trainer's progress and a failure's log
tail. The objects below are written by hand in the shapes the Trainer (v2.3.0 `TrainerStatus`)
and the kubelet write."""

from __future__ import annotations

from typing import Any

from runtimes.kubernetes.failures import failed_container, failure_message
from runtimes.kubernetes.progress import progress_of


def trainjob(trainer_status: dict[str, Any] | None) -> dict[str, Any]:
    status = {} if trainer_status is None else {"trainerStatus": trainer_status}
    return {"metadata": {"name": "job"}, "status": status}


def pod(name: str, *, exit_code: int, message: str | None, finished: str) -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": exit_code, "finishedAt": finished}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": name},
        "status": {"containerStatuses": [{"name": "node", "state": {"terminated": terminated}}]},
    }


def test_a_trainer_report_becomes_progress_with_its_metrics_as_numbers() -> None:
    report = trainjob(
        {
            "progressPercentage": 40,
            "estimatedRemainingSeconds": 12,
            "metrics": [{"name": "train_loss", "value": "0.5"}, {"name": "step", "value": "3"}],
            "lastUpdatedTime": "2026-12-03T17:00:00Z",
        }
    )

    assert progress_of(report) == {
        "percent": 40,
        "eta_seconds": 12,
        "train_loss": 0.5,
        "step": 3,
        "updated_at": "2026-12-03T17:00:00Z",
    }


def test_a_trainjob_without_a_trainer_report_has_no_progress() -> None:
    assert progress_of(trainjob(None)) == {}
    assert progress_of(trainjob({})) == {}


def test_a_failure_names_the_container_that_failed_first_and_its_log_tail() -> None:
    pods = [
        pod(
            "job-node-0-1", exit_code=1, message="peer went away\n", finished="2026-12-03T17:00:09Z"
        ),
        pod(
            "job-node-0-0",
            exit_code=1,
            message="Traceback ...\nDatasetNotFoundError: x\n",
            finished="2026-12-03T17:00:05Z",
        ),
    ]

    assert failure_message("jobset failed", failed_container(pods)) == (
        "jobset failed\njob-node-0-0/node exited with code 1 and said:\n"
        "Traceback ...\nDatasetNotFoundError: x"
    )


def test_a_failure_without_a_termination_message_keeps_the_controllers_message() -> None:
    pods = [
        pod("job-node-0-0", exit_code=1, message=None, finished="2026-12-03T17:00:05Z"),
        pod("job-node-0-1", exit_code=0, message="fine", finished="2026-12-03T17:00:05Z"),
    ]

    assert failure_message("jobset failed", failed_container(pods)) == "jobset failed"
    assert failure_message(None, failed_container([])) is None

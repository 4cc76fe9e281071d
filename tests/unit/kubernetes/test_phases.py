"""Phases from TrainJob status, as the Trainer v2.3.0 controller writes it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.jobs.model import JobPhase
from runtimes.kubernetes.backend import phase_of

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
CREATED = (NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")


def trainjob(status=None):
    obj = {"metadata": {"name": "ft", "creationTimestamp": CREATED}}
    if status is not None:
        obj["status"] = status
    return obj


def condition(kind, status="True", reason="R", message="m", at=CREATED):
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
    }


def phase(obj, timeout=3600.0):
    return phase_of(obj, now=NOW, jobset_timeout=timeout)


def test_created_job_without_status_is_pending():
    assert phase(trainjob()) == (JobPhase.PENDING, None, None)


def test_active_trainer_job_is_running():
    status = {"jobsStatus": [{"name": "node", "active": 2, "ready": 2}]}
    assert phase(trainjob(status))[0] is JobPhase.RUNNING


def test_active_initializer_alone_is_still_pending():
    status = {
        "jobsStatus": [
            {"name": "dataset-initializer", "active": 1},
            {"name": "node", "active": 0},
        ]
    }
    assert phase(trainjob(status))[0] is JobPhase.PENDING


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("Complete", JobPhase.SUCCEEDED),
        ("Failed", JobPhase.FAILED),
        ("Suspended", JobPhase.SUSPENDED),
    ],
)
def test_conditions_decide_final_and_suspended_phases(kind, expected):
    status = {"conditions": [condition(kind, reason="Why", message="because")]}
    assert phase(trainjob(status)) == (expected, "Why", "because")


def test_failed_wins_over_an_earlier_suspended_condition():
    status = {"conditions": [condition("Suspended", "False"), condition("Failed", reason="X")]}
    assert phase(trainjob(status))[0] is JobPhase.FAILED


def test_resumed_job_is_not_suspended():
    status = {"conditions": [condition("Suspended", "False", reason="Resumed")]}
    assert phase(trainjob(status))[0] is JobPhase.PENDING


def test_no_jobset_after_the_timeout_fails_with_reason():
    got, reason, message = phase(trainjob(), timeout=60)
    assert got is JobPhase.FAILED
    assert reason == "JobSetNotCreated"
    assert "TrainJobResourcesCreationFailed" in message


def test_the_jobset_timeout_counts_from_the_last_resume():
    resumed = (NOW - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"conditions": [condition("Suspended", "False", at=resumed)]}
    assert phase(trainjob(status), timeout=60)[0] is JobPhase.PENDING

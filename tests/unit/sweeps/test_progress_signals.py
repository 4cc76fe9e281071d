"""A job's progress reaches the key's worker: the signal carries the trainer's report, and
each new step is a new signal (the keyed topic dedupes by id)."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator import signals
from orchestrator.jobs.model import JobPhase, JobRef, Observation

AT = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def running(progress: dict[str, object]) -> Observation:
    return Observation(
        job=JobRef(name="j-1", backend="local"),
        phase=JobPhase.RUNNING,
        at=AT,
        reason="Progress",
        progress=progress,
    )


def test_a_progress_report_travels_with_its_step_in_the_id():
    report = {"step": 20, "loss": 2.5, "total_steps": 300, "final": False}
    event = signals.observation_event(running(report), key="m1")
    assert event.id == "j-1.running.step-20"
    read = signals.read_signal(event)
    assert isinstance(read, Observation)
    assert dict(read.progress) == report


def test_a_phase_change_keeps_its_id_and_carries_no_report():
    event = signals.observation_event(running({}), key="m1")
    assert event.id == "j-1.running"
    read = signals.read_signal(event)
    assert isinstance(read, Observation)
    assert dict(read.progress) == {}

"""On Kubernetes a trial's losses come through Kubeflow's status channel: what the trainer
POSTs becomes `status.trainerStatus`, which the backend reads back as progress. This follows
one report, written here as the Trainer stores it, to the trial's state in its sweep."""

from __future__ import annotations

from orchestrator import signals
from orchestrator.jobs.model import JobPhase, JobRef, Observation
from orchestrator.sweeps import driving, machine
from orchestrator.sweeps.suggesting import PURE
from runtimes.kubernetes.progress import progress_of
from tests.unit.sweeps.builders import BASE, SWEEP, at, grid_spec


def trainjob(*, step: str, train_loss: str) -> dict[str, object]:
    """A TrainJob whose trainer reported *train_loss* at *step* (values are strings there)."""
    metrics = [
        {"name": "train_loss", "value": train_loss},
        {"name": "step", "value": step},
        {"name": "total_steps", "value": "300"},
    ]
    return {
        "status": {
            "trainerStatus": {
                "progressPercentage": 6,
                "metrics": metrics,
                "lastUpdatedTime": "2026-03-01T12:00:05Z",
            }
        }
    }


def test_a_trainer_status_report_feeds_the_trial_s_losses():
    state, _ = machine.start(grid_spec(), name=SWEEP, base=BASE, now=at(0), suggesters=PURE)
    job = state.trials[0].job
    report = progress_of(trainjob(step="20", train_loss="2.5"))
    observed = Observation(
        job=JobRef(name=job, backend="kubernetes", namespace="ml"),
        phase=JobPhase.RUNNING,
        at=at(5),
        reason="Progress",
        progress=report,
    )
    # Through the keyed topic, as the worker's observation pump sends it.
    delivered = signals.read_signal(signals.observation_event(observed, key="m1"))
    assert isinstance(delivered, Observation)

    step = driving.observe({SWEEP: state}, delivered, suggesters=PURE)

    trial = step.sweeps[SWEEP].trial_of(job)
    assert trial is not None
    assert trial.step == 20
    assert trial.losses == ((20, 2.5),)

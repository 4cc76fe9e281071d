"""A sweep as a whole, where its trials are tracked: the service tells the sweep tracker
before it launches a sweep's trials and after the sweep's result went out; the MLflow
tracker's params and metrics of a sweep, written out by hand.

Stand-ins: `RecordingTracker` below (it records what it was told, and how many jobs the
backend had been asked for by then), and the service world of test_sweep_service.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from orchestrator.ledger import Outcome
from orchestrator.service import Orchestrator, RetryPolicy
from orchestrator.sweeps.spec import Range, Scale
from orchestrator.sweeps.state import (
    EndReason,
    SweepEnd,
    SweepState,
    SweepStatus,
    Trial,
    TrialState,
)
from runtimes.tracking.sweeps import sweep_metrics, sweep_params
from tests.unit.sweeps.builders import BASE, SWEEP, T0, grid_spec, median
from tests.unit.sweeps.test_sweep_service import (
    SWEEP_COMPLETED,
    World,
    drift,
    progress,
    send,
    success,
)


class RecordingTracker:
    """Stand-in `SweepTracker`: (call, sweep name, jobs launched so far, result published)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.calls: list[tuple[str, str, int, bool]] = []

    def _note(self, call: str, sweep: SweepState) -> None:
        published = bool(self.world.out(SWEEP_COMPLETED))
        self.calls.append((call, sweep.name, len(self.world.backend.job_names), published))

    async def started(self, sweep: SweepState) -> None:
        self._note("started", sweep)

    async def ended(self, sweep: SweepState) -> None:
        assert sweep.end is not None
        self._note("ended", sweep)


async def test_the_tracker_hears_of_a_sweep_before_its_trials_launch_and_after_its_result():
    world = World()
    tracker = RecordingTracker(world)
    orch = with_tracker(world, tracker)
    (key,) = await orch.keys_for(drift(1))
    records = await orch.handle(key, drift(1))
    (sweep,) = [r.job_name for r in records if r.outcome is Outcome.LAUNCH and r.reason is None]
    await send(orch, progress(world.trial(0), 10, 2.0))
    await send(orch, progress(world.trial(1), 10, 2.2))
    await send(orch, success(world.trial(0), 1.0))
    await send(orch, success(world.trial(1), 1.1))
    await send(orch, progress(world.trial(3), 10, 3.0))  # pruned: trial 3 is behind
    await send(orch, success(world.trial(2), 0.8))

    assert tracker.calls == [
        ("started", sweep, 0, False),  # before trials 0 and 1
        ("started", sweep, 2, False),  # before trial 2 (trial 0 done)
        ("started", sweep, 3, False),  # before trial 3
        ("ended", sweep, 4, True),
    ]


def with_tracker(world: World, tracker: RecordingTracker) -> Orchestrator:
    async def sleep(seconds: float) -> None:
        return None

    return Orchestrator(
        rules=world.rules,
        backend=world.backend,
        publisher=world.publisher,
        states=world.states,
        completions=world.completions,
        champions=world.champions,
        clock=world.clock,
        audit_topic="audit",
        output_topic="out",
        retry=RetryPolicy(initial_delay=0.1),
        sleep=sleep,
        sweep_tracker=tracker,
    )


def ended_sweep() -> SweepState:
    spec = grid_spec(median=median(min_trials=2, start_step=10), max_failed=3)
    spec = replace(
        spec,
        parameters=(
            *spec.parameters,
            replace(spec.parameters[0], path="lora.dropout", domain=Range(0.0, 0.2, Scale.LINEAR)),
        ),
    )
    trials = (
        Trial(0, "j0", {"training.learning_rate": 1e-3}, T0, TrialState.COMPLETED, metric=1.0),
        Trial(1, "j1", {"training.learning_rate": 2e-3}, T0, TrialState.COMPLETED, metric=0.7),
        Trial(2, "j2", {"training.learning_rate": 5e-4}, T0, TrialState.PRUNED),
        Trial(3, "j3", {"training.learning_rate": 1e-9}, T0, TrialState.FAILED),
    )
    end = SweepEnd(
        SweepStatus.SUCCEEDED, EndReason.MAX_TRIALS, "done", T0 + timedelta(hours=1), best=1
    )
    return SweepState(name=SWEEP, spec=spec, base=BASE, started_at=T0, trials=trials, end=end)


def test_a_sweep_s_params_are_its_spec_flattened():
    assert sweep_params(ended_sweep()) == {
        "objective.metric": "eval_loss",
        "objective.mode": "min",
        "algorithm.name": "grid",
        "algorithm.seed": "0",
        "parameters.training.learning_rate": '{"values":[0.001,0.002,0.0005,1e-09,0.003,0.004]}',
        "parameters.lora.dropout": '{"min":0.0,"max":0.2,"scale":"linear","integer":false}',
        "parallel": "2",
        "max_trials": "4",
        "max_failed": "3",
        "median.min_trials": "2",
        "median.start_step": "10",
    }


def test_an_ended_sweep_s_metrics_are_its_best_trial_its_objective_and_its_counts():
    assert sweep_metrics(ended_sweep()) == {
        "trials": 4.0,
        "trials_completed": 2.0,
        "trials_pruned": 1.0,
        "trials_failed": 1.0,
        "best_trial": 1.0,
        "eval_loss": 0.7,
    }


def test_a_sweep_without_a_best_trial_has_only_its_counts():
    sweep = ended_sweep()
    assert sweep.end is not None
    failed = replace(sweep, end=replace(sweep.end, status=SweepStatus.FAILED, best=None))
    assert "best_trial" not in sweep_metrics(failed)
    assert "eval_loss" not in sweep_metrics(failed)

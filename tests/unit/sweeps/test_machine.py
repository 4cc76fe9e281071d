"""The sweep state machine, driven by hand-written observations.

The spec is a grid over hand-picked learning rates (`builders.LEARNING_RATES`), so which
trial trains at which rate, and so what each action must be, follows from the test's own
construction.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from orchestrator.jobs.naming import is_valid_job_name
from orchestrator.jobs.promotion import Mode
from orchestrator.sweeps import machine
from orchestrator.sweeps.machine import Cancel, Ended, Launch
from orchestrator.sweeps.spec import Choice, Objective, Parameter
from orchestrator.sweeps.state import EndReason, SweepState, SweepStatus, TrialState
from orchestrator.sweeps.suggesting import PURE
from tests.unit.sweeps.builders import BASE, LEARNING_RATES, SWEEP, at, grid_spec, median


def start(**changes):
    return machine.start(grid_spec(**changes), name=SWEEP, base=BASE, now=at(0), suggesters=PURE)


def job(state: SweepState, index: int) -> str:
    return state.trials[index].job


def succeed(state, index, eval_loss, *, when=60.0, **metrics):
    return machine.finished(
        state,
        job(state, index),
        succeeded=True,
        metrics={"eval_loss": eval_loss, **metrics} if eval_loss is not None else metrics,
        adapter_uri=f"file:///adapters/{index}",
        backend="local",
        now=at(when),
        suggesters=PURE,
    )


def fail(state, index, *, when=60.0):
    return machine.finished(
        state,
        job(state, index),
        succeeded=False,
        reason="OutOfMemory: the trainer ran out of memory",
        now=at(when),
        suggesters=PURE,
    )


def report(state, index, step, loss, *, when=30.0):
    return machine.progress(
        state, job(state, index), step=step, loss=loss, now=at(when), suggesters=PURE
    )


def launched(actions) -> list[float]:
    return [a.request.training.learning_rate for a in actions if isinstance(a, Launch)]


def cancelled(actions) -> list[tuple[str, TrialState]]:
    return [(a.job, a.state) for a in actions if isinstance(a, Cancel)]


def ended(actions):
    ends = [a.end for a in actions if isinstance(a, Ended)]
    assert len(ends) <= 1
    return ends[0] if ends else None


def test_a_sweep_starts_as_many_trials_as_may_run_at_once():
    state, actions = start()
    assert launched(actions) == [1e-3, 2e-3]
    names = [a.request.name for a in actions]
    assert names == [job(state, 0), job(state, 1)]
    assert len(set(names)) == 2
    assert all(is_valid_job_name(name) and SWEEP not in name for name in names)
    # Everything but the name and the swept field is the launch decision's job.
    first = actions[0].request
    assert replace(first, name=BASE.name, training=BASE.training) == BASE
    assert [t.state for t in state.trials] == [TrialState.RUNNING, TrialState.RUNNING]


def test_a_finished_trial_makes_room_for_the_next():
    state, _ = start()
    state, actions = succeed(state, 0, 1.0)
    assert launched(actions) == [5e-4]
    assert state.trials[0].state is TrialState.COMPLETED
    assert state.trials[0].metric == 1.0
    assert state.trials[0].adapter_uri == "file:///adapters/0"


def test_the_sweep_ends_once_every_trial_finished_and_names_the_best():
    state, _ = start()
    state, _ = succeed(state, 0, 1.0)
    state, _ = succeed(state, 1, 0.9)
    state, _ = succeed(state, 2, 1.2)
    state, actions = succeed(state, 3, 2.0, when=120)
    end = ended(actions)
    assert end.status is SweepStatus.SUCCEEDED
    assert end.reason is EndReason.MAX_TRIALS
    assert end.best == 1
    assert end.at == at(120)
    assert end.message == "all 4 trials finished; best: trial 1 (eval_loss 0.9)"
    assert state.end == end
    # An ended sweep takes no more input.
    assert machine.tick(state, now=at(10_000), suggesters=PURE) == (state, ())


def test_a_larger_score_is_better_when_the_objective_says_max():
    state, _ = start(objective=Objective(metric="token_accuracy", mode=Mode.MAX))
    for index, accuracy in enumerate((0.5, 0.7, 0.6, 0.1)):
        state, actions = succeed(state, index, None, token_accuracy=accuracy)
    assert ended(actions).best == 1


def test_reaching_the_goal_ends_the_sweep_and_cancels_what_still_runs():
    state, _ = start(objective=Objective(metric="eval_loss", goal=0.95))
    state, actions = succeed(state, 1, 0.9)
    assert launched(actions) == []
    assert cancelled(actions) == [(job(state, 0), TrialState.CANCELLED)]
    end = ended(actions)
    assert (end.status, end.reason, end.best) == (SweepStatus.SUCCEEDED, EndReason.GOAL_REACHED, 1)
    assert end.message.startswith("trial 1 reached the goal: eval_loss 0.9 (goal 0.95, min)")
    assert state.trials[0].state is TrialState.CANCELLED


def test_max_failed_failures_end_the_sweep_as_failed():
    state, _ = start(max_failed=2)
    state, actions = fail(state, 0)
    assert launched(actions) == [5e-4]  # one failure is not yet too many
    state, actions = fail(state, 1)
    end = ended(actions)
    assert (end.status, end.reason) == (SweepStatus.FAILED, EndReason.MAX_FAILED)
    assert end.message == "2 trials failed (max_failed 2); no trial completed with a eval_loss"
    assert cancelled(actions) == [(job(state, 2), TrialState.CANCELLED)]
    assert state.trials[0].reason == "OutOfMemory: the trainer ran out of memory"


def test_a_sweep_whose_trials_all_failed_fails_without_max_failed():
    state, _ = start()
    for index in range(4):
        state, actions = fail(state, index)
    end = ended(actions)
    assert (end.status, end.reason, end.best) == (SweepStatus.FAILED, EndReason.MAX_TRIALS, None)


def test_the_budget_ends_the_sweep_when_its_time_is_up():
    state, _ = start(budget=timedelta(hours=1))
    assert state.deadline == at(3600)
    state, actions = machine.tick(state, now=at(3599), suggesters=PURE)
    assert actions == ()
    state, actions = machine.tick(state, now=at(3600), suggesters=PURE)
    assert cancelled(actions) == [
        (job(state, 0), TrialState.CANCELLED),
        (job(state, 1), TrialState.CANCELLED),
    ]
    end = ended(actions)
    assert (end.status, end.reason) == (SweepStatus.FAILED, EndReason.BUDGET)
    assert state.deadline is None


def test_a_trial_that_reports_no_objective_cannot_be_the_best():
    state, _ = start(max_trials=2)
    state, _ = succeed(state, 0, None)
    state, actions = succeed(state, 1, 1.5)
    assert state.trials[0].reason == "it reported no eval_loss: it cannot be ranked"
    assert ended(actions).best == 1


def test_a_grid_that_runs_out_ends_the_sweep_before_max_trials():
    grid = (Parameter("lora.r", Choice((4, 8))),)
    state, actions = start(parameters=grid, max_trials=4)
    assert [a.request.lora.r for a in actions] == [4, 8]
    state, _ = succeed(state, 0, 1.0)
    state, actions = succeed(state, 1, 1.1)
    assert ended(actions).message == "all 2 trials finished; best: trial 0 (eval_loss 1)"


# --- the median rule ------------------------------------------------------------------


def two_completed(**changes):
    """Trials 0 and 1 reported losses and completed; trials 2 (5e-4) and 3 (1e-9) run."""
    state, _ = start(**{"median": median(min_trials=2), **changes})
    state, _ = report(state, 0, 10, 2.0)
    state, _ = report(state, 0, 20, 1.5)
    state, _ = report(state, 1, 10, 2.2)
    state, _ = report(state, 1, 20, 1.7)
    state, _ = succeed(state, 0, 1.0)
    state, actions = succeed(state, 1, 1.1)
    assert launched(actions) == [1e-9]
    return state


def test_a_trial_behind_the_median_of_the_completed_ones_is_pruned():
    state = two_completed()
    state, actions = report(state, 3, 10, 3.0, when=90)
    assert cancelled(actions) == [(job(state, 3), TrialState.PRUNED)]
    trial = state.trials[3]
    assert trial.state is TrialState.PRUNED
    assert trial.finished_at == at(90)
    # The median of the completed trials' best by step 10: (2.0 + 2.2) / 2.
    assert trial.reason == (
        "its best train_loss 3 by step 10 is worse than the median 2.1 of 2 completed trials "
        "by that step"
    )


def test_a_trial_ahead_of_the_median_goes_on():
    state = two_completed()
    state, actions = report(state, 2, 10, 2.05)
    assert actions == ()
    assert state.trials[2].state is TrialState.RUNNING


def test_no_trial_is_judged_before_the_start_step():
    state = two_completed(median=median(min_trials=2, start_step=15))
    state, actions = report(state, 3, 10, 3.0)
    assert actions == ()
    state, actions = report(state, 3, 20, 3.0)
    assert cancelled(actions) == [(job(state, 3), TrialState.PRUNED)]


def test_no_trial_is_judged_before_min_trials_completed():
    state, _ = start(median=median(min_trials=2))
    state, _ = report(state, 0, 10, 2.0)
    state, _ = succeed(state, 0, 1.0)
    state, actions = report(state, 1, 10, 9.0)
    assert actions == ()


def test_the_last_trial_pruned_ends_the_sweep():
    state = two_completed()
    state, _ = succeed(state, 2, 0.8)
    state, actions = report(state, 3, 10, 3.0)
    assert cancelled(actions) == [(job(state, 3), TrialState.PRUNED)]
    end = ended(actions)
    assert (end.reason, end.best) == (EndReason.MAX_TRIALS, 2)


def test_a_pruned_trial_that_ends_afterwards_stays_pruned():
    state = two_completed()
    state, _ = report(state, 3, 10, 3.0)
    for finish in (fail, lambda s, i: succeed(s, i, 0.1)):
        later, actions = finish(state, 3)
        assert (later, actions) == (state, ())


def test_a_step_reported_again_or_out_of_order_changes_nothing():
    state, _ = start()
    state, _ = report(state, 0, 20, 1.5)
    again, actions = report(state, 0, 20, 1.0)
    assert (again, actions) == (state, ())
    earlier, actions = report(state, 0, 10, 0.5)
    assert (earlier, actions) == (state, ())


# --- replays ------------------------------------------------------------------------------


@pytest.mark.parametrize("rounds", [1, 3, 6], ids=["after-start", "mid-sweep", "near-the-end"])
def test_a_stored_sweep_decides_what_the_live_one_did(rounds):
    """What a worker restarted from the stored (JSON) state decides for the next input is
    what the one that kept running decided: the same trials, names and parameters."""
    state, _ = start(median=median(min_trials=2))
    inputs = [
        lambda s: report(s, 0, 10, 2.0),
        lambda s: succeed(s, 0, 1.0),
        lambda s: report(s, 1, 10, 2.5),
        lambda s: succeed(s, 1, 1.1),
        lambda s: report(s, 2, 10, 1.9),
        lambda s: report(s, 3, 10, 4.0),
        lambda s: succeed(s, 2, 0.9),
    ]
    for step in inputs[:rounds]:
        state, _ = step(state)
    stored = SweepState.from_json(state.to_json())
    assert stored == state
    for step in inputs[rounds:]:
        live, live_actions = step(state)
        replayed, replayed_actions = step(stored)
        assert (replayed, replayed_actions) == (live, live_actions)
        state = stored = live
    assert state.end is not None


def test_the_learning_rates_come_in_the_grid_s_order():
    state, _ = start(max_trials=6, parallel=6)
    assert [t.parameters["training.learning_rate"] for t in state.trials] == list(LEARNING_RATES)

"""The median rule on hand-made trials, the losses a trial keeps, and trial names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.jobs.naming import MAX_LENGTH, is_valid_job_name, job_name, trial_name
from orchestrator.sweeps.spec import MedianStopping
from orchestrator.sweeps.state import MAX_POINTS, Trial, TrialState, with_loss
from orchestrator.sweeps.stopping import behind
from tests.unit.sweeps.builders import T0


def trial(index, points, *, state=TrialState.RUNNING, step=None):
    last = points[-1][0] if points else None
    return Trial(
        index=index,
        job=f"t{index}",
        parameters={},
        launched_at=T0,
        state=state,
        losses=tuple(points),
        step=step if step is not None else last,
    )


DONE = TrialState.COMPLETED


def test_the_median_compares_bests_up_to_the_same_step():
    completed = [
        trial(0, [(5, 3.0), (10, 2.0), (50, 0.5)], state=DONE),
        trial(1, [(8, 2.6), (40, 0.4)], state=DONE),
        trial(2, [(10, 2.2)], state=DONE),
    ]
    # By step 10 the completed bests are 2.0, 2.6 and 2.2: the median is 2.2.
    assert behind(MedianStopping(min_trials=3), trial(3, [(10, 2.2)]), completed) is None
    assert behind(MedianStopping(min_trials=3), trial(3, [(10, 2.3)]), completed) == (
        "its best train_loss 2.3 by step 10 is worse than the median 2.2 of 3 completed "
        "trials by that step"
    )


def test_running_pruned_and_silent_trials_are_no_reference():
    others = [
        trial(0, [(10, 1.0)], state=DONE),
        trial(1, [(10, 0.1)], state=TrialState.PRUNED),
        trial(2, [(10, 0.1)]),
        trial(3, [(30, 0.1)], state=DONE),  # nothing reported by step 10
    ]
    assert behind(MedianStopping(min_trials=2), trial(4, [(10, 5.0)]), others) is None
    assert behind(MedianStopping(min_trials=1), trial(4, [(10, 5.0)]), others) is not None


def test_a_trial_that_reported_no_loss_is_not_judged():
    completed = [trial(0, [(10, 1.0)], state=DONE)]
    assert behind(MedianStopping(min_trials=1), trial(1, [], step=10), completed) is None


def test_a_trial_keeps_only_the_steps_where_its_best_improved():
    kept = trial(0, [])
    for step, loss in [(1, 3.0), (2, 3.5), (3, 2.0), (4, 2.0), (5, 1.0), (6, 4.0)]:
        kept = with_loss(kept, step=step, loss=loss)
    assert kept.losses == ((1, 3.0), (3, 2.0), (5, 1.0))
    assert kept.step == 6
    assert [kept.best_loss(until=s) for s in (0, 1, 2, 4, 9)] == [None, 3.0, 3.0, 2.0, 1.0]


def test_a_long_run_s_losses_stay_bounded():
    kept = trial(0, [])
    for step in range(1, 5001):
        kept = with_loss(kept, step=step, loss=10.0 - step / 1000)
    assert len(kept.losses) <= MAX_POINTS
    assert kept.losses[0] == (1, 9.999)
    assert kept.losses[-1] == (5000, 5.0)


@given(st.text(min_size=1, max_size=60), st.text(max_size=60), st.integers(0, 10_000))
def test_trial_names_are_valid_distinct_and_stable(rule, key, index):
    sweep = job_name(rule=rule, key=key, window_event_ids=["e"])
    name = trial_name(sweep=sweep, index=index)
    assert is_valid_job_name(name)
    assert len(name) <= MAX_LENGTH
    assert name == trial_name(sweep=sweep, index=index)
    assert name != trial_name(sweep=sweep, index=index + 1)
    assert name != sweep

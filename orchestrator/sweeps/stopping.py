"""Early stopping: the median rule (Golovin et al., "Google Vizier", 2017; Katib's
`medianstop`).

A running trial is pruned at step *s* when its best training loss up to *s* is strictly worse
than the median of the completed trials' best training losses up to *s*, once at least
`min_trials` completed trials reported a loss by then and *s* is at least `start_step`.
Comparing bests up to the same step, rather than the values at exactly that step, makes the
rule indifferent to how often each trial happened to report.

Called by `machine.py` whenever a trial reports progress. Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.sweeps.spec import INTERMEDIATE_METRIC, MedianStopping
from orchestrator.sweeps.state import Trial, TrialState


def behind(rule: MedianStopping, trial: Trial, trials: Sequence[Trial]) -> str | None:
    """Why *trial* should be pruned now (None: it should go on), given every trial of its
    sweep in *trials*."""
    step = trial.step
    if step is None or step < rule.start_step:
        return None
    own = trial.best_loss(until=step)
    if own is None:
        return None
    references = [
        best
        for other in trials
        if other.state is TrialState.COMPLETED and other.index != trial.index
        if (best := other.best_loss(until=step)) is not None
    ]
    if len(references) < rule.min_trials:
        return None
    median = statistics.median(references)
    if own <= median:
        return None
    return (
        f"its best {INTERMEDIATE_METRIC} {own:.6g} by step {step} is worse than the median "
        f"{median:.6g} of {len(references)} completed trials by that step"
    )

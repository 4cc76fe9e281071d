"""Values the sweep tests build on: a base job, a spec, and a clock that moves by hand."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.jobs.model import TrainingRequest
from orchestrator.sweeps.spec import (
    Algorithm,
    Choice,
    MedianStopping,
    Objective,
    Parameter,
    SweepSpec,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SWEEP = "sweep-m1-0123456789"

BASE = TrainingRequest(
    name=SWEEP,
    rule="sweep",
    rule_version="v1",
    key="m1",
    decision_id="d-1",
    causing_event_ids=("e1",),
    runtime="local",
    base_model="tiny",
    dataset="file:///data.jsonl",
)

LEARNING_RATES = (1e-3, 2e-3, 5e-4, 1e-9, 3e-3, 4e-3)


def grid_spec(**changes: Any) -> SweepSpec:
    """A grid over `LEARNING_RATES`, in that order: trial *i* trains at the *i*-th rate."""
    spec = SweepSpec(
        parameters=(Parameter("training.learning_rate", Choice(LEARNING_RATES)),),
        objective=Objective(metric="eval_loss"),
        algorithm=Algorithm.GRID,
        parallel=2,
        max_trials=4,
    )
    return replace(spec, **changes)


def median(min_trials: int = 2, start_step: int = 0) -> MedianStopping:
    return MedianStopping(min_trials=min_trials, start_step=start_step)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)

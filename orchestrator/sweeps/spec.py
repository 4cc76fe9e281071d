"""What a `sweep:` block says, as frozen values with one JSON form.

Built by `orchestrator/rules/sweep_parsing.py` from a rule file (which reports every problem
with FILE:LINE:COL); carried by `LaunchTemplate.sweep`, and copied into the `SweepState` when a
sweep starts, so that a rule reloaded mid-sweep does not change the sweep already running.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from orchestrator.jobs.promotion import METRICS, Mode

OBJECTIVE_METRICS = METRICS
"""The metrics a sweep may optimise: the final scores the trainer reports for every run with a
held-out split (the ones a promotion gate compares), each with its usual direction."""

INTERMEDIATE_METRIC = "train_loss"
"""What the median rule compares while trials run: the trainer's training loss, which it
reports every logging step (local backend: progress lines; Kubernetes: `trainerStatus`)."""


class Algorithm(enum.StrEnum):
    """How the next trial's parameters are chosen."""

    RANDOM = "random"
    """Independent draws from each parameter's domain, seeded per trial."""
    GRID = "grid"
    """Every combination of the parameters' `values`, in order."""
    TPE = "tpe"
    """optuna's Tree-structured Parzen Estimator, told every finished trial."""


class Scale(enum.StrEnum):
    LINEAR = "linear"
    LOG = "log"


@dataclass(frozen=True, slots=True)
class Objective:
    """The final metric that ranks trials, and an optional goal that ends the sweep early."""

    metric: str = "eval_loss"
    mode: Mode = Mode.MIN
    goal: float | None = None
    """A trial that completes with a score at least this good ends the sweep."""

    def better(self, candidate: float, than: float) -> bool:
        """Whether *candidate* is strictly better than *than* in this objective's direction."""
        return candidate < than if self.mode is Mode.MIN else candidate > than

    def reached(self, value: float) -> bool:
        """Whether *value* meets the goal (never, without one)."""
        if self.goal is None:
            return False
        return value <= self.goal if self.mode is Mode.MIN else value >= self.goal


@dataclass(frozen=True, slots=True)
class Range:
    """A parameter drawn between `low` and `high` (both included)."""

    low: float
    high: float
    scale: Scale = Scale.LINEAR
    integer: bool = False
    """Whole numbers only (the field is an integer, such as `lora.r`)."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A parameter taking one of `values` (numbers, true/false or lists of module names)."""

    values: tuple[Any, ...]


Domain = Range | Choice


@dataclass(frozen=True, slots=True)
class Parameter:
    """One launch field a sweep varies, by its path (`training.learning_rate`)."""

    path: str
    domain: Domain


@dataclass(frozen=True, slots=True)
class MedianStopping:
    """Prune a running trial whose best training loss so far is worse than the median of the
    completed trials' best at the same step (Katib's and Vizier's median stopping rule)."""

    min_trials: int = 3
    """Completed trials needed (with a loss reported by that step) before any is pruned."""
    start_step: int = 0
    """No trial is judged before this step (early losses say little)."""


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A rule's `sweep:` block."""

    parameters: tuple[Parameter, ...]
    objective: Objective = Objective()
    algorithm: Algorithm = Algorithm.RANDOM
    seed: int = 0
    parallel: int = 1
    """Trials running at once, at most."""
    max_trials: int = 1
    """Trials launched in all, at most (a grid may have fewer)."""
    max_failed: int | None = None
    """The sweep ends as failed once this many trials failed (None: only when all did)."""
    budget: timedelta | None = None
    """Wall-clock time the whole sweep may take; past it, running trials are cancelled."""
    median: MedianStopping | None = None

    def __post_init__(self) -> None:
        if self.objective.metric not in OBJECTIVE_METRICS:
            raise ValueError(f"unknown objective metric {self.objective.metric!r}")
        if self.parallel < 1 or self.max_trials < 1 or self.parallel > self.max_trials:
            raise ValueError("need 1 <= parallel <= max_trials")

    def to_json(self) -> dict[str, Any]:
        return {
            "objective": {
                "metric": self.objective.metric,
                "mode": self.objective.mode.value,
                "goal": self.objective.goal,
            },
            "algorithm": {"name": self.algorithm.value, "seed": self.seed},
            "parameters": {p.path: _domain_to_json(p.domain) for p in self.parameters},
            "parallel": self.parallel,
            "max_trials": self.max_trials,
            "max_failed": self.max_failed,
            "budget_seconds": self.budget.total_seconds() if self.budget is not None else None,
            "median": None
            if self.median is None
            else {"min_trials": self.median.min_trials, "start_step": self.median.start_step},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepSpec:
        """The inverse of `to_json`.

        Raises:
            ValueError: a field is missing or invalid.
        """
        try:
            objective = data["objective"]
            median = data.get("median")
            budget = data.get("budget_seconds")
            return cls(
                objective=Objective(
                    metric=str(objective["metric"]),
                    mode=Mode(objective["mode"]),
                    goal=_optional_float(objective.get("goal")),
                ),
                algorithm=Algorithm(data["algorithm"]["name"]),
                seed=int(data["algorithm"]["seed"]),
                parameters=tuple(
                    Parameter(path=str(path), domain=_domain_from_json(domain))
                    for path, domain in data["parameters"].items()
                ),
                parallel=int(data["parallel"]),
                max_trials=int(data["max_trials"]),
                max_failed=None if data.get("max_failed") is None else int(data["max_failed"]),
                budget=None if budget is None else timedelta(seconds=float(budget)),
                median=None
                if median is None
                else MedianStopping(
                    min_trials=int(median["min_trials"]), start_step=int(median["start_step"])
                ),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a sweep spec: {exc!r}") from exc


def _domain_to_json(domain: Domain) -> dict[str, Any]:
    if isinstance(domain, Choice):
        return {"values": [list(v) if isinstance(v, tuple) else v for v in domain.values]}
    return {
        "min": domain.low,
        "max": domain.high,
        "scale": domain.scale.value,
        "integer": domain.integer,
    }


def _domain_from_json(data: Mapping[str, Any]) -> Domain:
    if "values" in data:
        return Choice(tuple(tuple(v) if isinstance(v, list) else v for v in data["values"]))
    return Range(
        low=float(data["min"]),
        high=float(data["max"]),
        scale=Scale(data.get("scale", "linear")),
        integer=bool(data.get("integer", False)),
    )


def _optional_float(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number

"""TPE through optuna: the `Suggester` of `algorithm: tpe` (`orchestrator/sweeps/suggesting.py`).

The composition root (`handlers/app.py`) hands `OptunaTpeSuggester()` to the service as the
suggester of `Algorithm.TPE`. Each call builds a fresh in-memory study, tells it every trial of
the sweep so far (from the sweep's state, which lives in the key's changelog: there is no side
database to lose or to disagree with), and asks it for one trial:

- completed trials with a score are `COMPLETE` with that value; pruned ones `PRUNED` with their
  training losses as intermediate values; failed, cancelled or unscored ones `FAIL` (TPE skips
  them); running ones `RUNNING`, which TPE's constant liar treats as bad so parallel trials
  spread out instead of all asking for the same point;
- the sampler is seeded with the sweep's seed and the trial's index, so the same history gives
  the same parameters for the same trial (what a worker replaying after a crash relies on) and
  two trials never repeat the same random draws;
- the first `startup_trials(spec)` trials are random, as optuna's are (its default 10, lowered
  to half the sweep for small sweeps, so that a 6-trial sweep is not random throughout).

A `values` domain becomes a categorical over the values' positions (optuna's choices must be
plain scalars; a value may be a list of module names).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from orchestrator.jobs.promotion import Mode
from orchestrator.sweeps.spec import Choice, Range, Scale, SweepSpec
from orchestrator.sweeps.state import Trial
from orchestrator.sweeps.state import TrialState as SweepTrialState

OPTUNA_STARTUP_TRIALS = 10
"""optuna's default number of random trials before TPE models the history."""


def startup_trials(spec: SweepSpec) -> int:
    """How many of *spec*'s trials are drawn at random before TPE takes over."""
    return max(1, min(OPTUNA_STARTUP_TRIALS, spec.max_trials // 2))


class OptunaTpeSuggester:
    """optuna's `TPESampler`, its history rebuilt from the sweep's state on every call."""

    def __init__(self) -> None:
        # One "A new study created in memory" line per suggestion would drown the worker's log.
        optuna.logging.set_verbosity(optuna.logging.WARNING)

    def suggest(
        self, spec: SweepSpec, trials: Sequence[Trial], index: int
    ) -> Mapping[str, Any] | None:
        distributions = {p.path: _distribution(p.domain) for p in spec.parameters}
        with warnings.catch_warnings():
            # Arguments optuna marks experimental in some releases (constant_liar): pinned.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=_seed(spec.seed, index),
                n_startup_trials=startup_trials(spec),
                constant_liar=True,
            )
        direction = (
            StudyDirection.MINIMIZE if spec.objective.mode is Mode.MIN else StudyDirection.MAXIMIZE
        )
        study = optuna.create_study(direction=direction, sampler=sampler)
        for trial in trials:
            study.add_trial(_frozen(trial, spec, distributions))
        asked = study.ask(distributions)
        return {p.path: _value(p.domain, asked.params[p.path]) for p in spec.parameters}


def _seed(seed: int, index: int) -> int:
    digest = hashlib.sha256(f"tuneloop-sweep/{seed}/{index}".encode()).hexdigest()
    return int(digest[:8], 16)


def _distribution(domain: Range | Choice) -> BaseDistribution:
    if isinstance(domain, Choice):
        return CategoricalDistribution(choices=tuple(range(len(domain.values))))
    log = domain.scale is Scale.LOG
    if domain.integer:
        return IntDistribution(low=int(domain.low), high=int(domain.high), log=log)
    return FloatDistribution(low=domain.low, high=domain.high, log=log)


def _value(domain: Range | Choice, raw: Any) -> Any:
    if isinstance(domain, Choice):
        return domain.values[int(raw)]
    return int(raw) if domain.integer else float(raw)


def _raw(domain: Range | Choice, value: Any) -> Any:
    if isinstance(domain, Choice):
        return domain.values.index(value)
    return int(value) if domain.integer else float(value)


def _frozen(
    trial: Trial, spec: SweepSpec, distributions: Mapping[str, BaseDistribution]
) -> FrozenTrial:
    domains = {p.path: p.domain for p in spec.parameters}
    params = {path: _raw(domains[path], value) for path, value in trial.parameters.items()}
    if trial.state is SweepTrialState.COMPLETED and trial.metric is not None:
        state, value = TrialState.COMPLETE, trial.metric
    elif trial.state is SweepTrialState.PRUNED:
        state, value = TrialState.PRUNED, None
    elif trial.state is SweepTrialState.RUNNING:
        state, value = TrialState.RUNNING, None
    else:
        state, value = TrialState.FAIL, None
    return optuna.trial.create_trial(
        state=state,
        value=value,
        params=params,
        distributions=dict(distributions),
        intermediate_values={step: loss for step, loss in trial.losses},
    )

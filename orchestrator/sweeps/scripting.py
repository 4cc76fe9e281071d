"""Trial outcomes written as data, for `tuneloop simulate --assume-metrics FILE` and rule tests.

A simulation has no trainer, so what each trial of a sweep reports is scripted: the first
entry that matches a trial says which training losses it reports at which steps, and then
either its final metrics (it succeeds) or why it fails. A trial no entry matches succeeds
with no metrics (so it cannot be ranked).

    trials:
      - parameters: {training.learning_rate: 1.0e-9}   # matches trials with these values
        losses: {10: 5.8, 20: 5.8}                      # step: training loss
        metrics: {eval_loss: 5.8}
      - trial: 0                                        # matches trial 0
        failed: "OutOfMemory: the trainer ran out of memory"
      - losses: {10: 5.5, 20: 5.2}                      # matches every other trial
        metrics: {eval_loss: 5.2}
        duration: 20m                                   # default: --assume-duration

Losses are reported evenly over the trial's duration, in step order; the end comes at the
end of it. `rules/simulation.py` plays them. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from orchestrator.sweeps.state import Trial

_ENTRY_KEYS = frozenset({"trial", "parameters", "losses", "metrics", "failed", "duration"})


def _no_items() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ScriptedTrial:
    """What the trials one entry matches report."""

    trial: int | None = None
    parameters: Mapping[str, Any] = field(default_factory=_no_items)
    losses: tuple[tuple[int, float], ...] = ()
    metrics: Mapping[str, float] = field(default_factory=_no_items)
    failed: str | None = None
    duration: timedelta | None = None

    def matches(self, trial: Trial) -> bool:
        if self.trial is not None and self.trial != trial.index:
            return False
        return all(
            path in trial.parameters and _same(trial.parameters[path], value)
            for path, value in self.parameters.items()
        )


@dataclass(frozen=True, slots=True)
class TrialScript:
    """Every entry, in the order written: the first that matches a trial is its outcome."""

    entries: tuple[ScriptedTrial, ...] = ()

    def outcome_of(self, trial: Trial) -> ScriptedTrial:
        return next((e for e in self.entries if e.matches(trial)), ScriptedTrial())


def parse_script(data: Any, *, parse_duration: Callable[[Any], timedelta]) -> TrialScript:
    """The script in *data* (a mapping with `trials:`, or the list of entries itself);
    *parse_duration* reads a `duration` (`rules/durations.parse_duration`).

    Raises:
        ValueError: what is wrong, and where (`trials[2].losses: ...`).
    """
    entries = data.get("trials") if isinstance(data, Mapping) else data
    if not isinstance(entries, list):
        raise ValueError("expected `trials:` with a list of entries")
    return TrialScript(
        tuple(_entry(item, f"trials[{i}]", parse_duration) for i, item in enumerate(entries))
    )


def _entry(item: Any, where: str, parse_duration: Callable[[Any], timedelta]) -> ScriptedTrial:
    if not isinstance(item, Mapping):
        raise ValueError(f"{where}: expected a mapping")
    unknown = sorted(set(item) - _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    if "metrics" in item and "failed" in item:
        raise ValueError(f"{where}: a trial either succeeds (metrics) or fails (failed)")
    trial = item.get("trial")
    if trial is not None and (isinstance(trial, bool) or not isinstance(trial, int)):
        raise ValueError(f"{where}.trial: expected a trial index, got {trial!r}")
    parameters = item.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise ValueError(f"{where}.parameters: expected a mapping of path: value")
    losses = item.get("losses") or {}
    if not isinstance(losses, Mapping) or not all(
        _whole(step) is not None and _number(loss) for step, loss in losses.items()
    ):
        raise ValueError(f"{where}.losses: expected a mapping of step: training loss")
    metrics = item.get("metrics") or {}
    if not isinstance(metrics, Mapping) or not all(_number(v) for v in metrics.values()):
        raise ValueError(f"{where}.metrics: expected a mapping of metric: number")
    failed = item.get("failed")
    if failed is not None and not isinstance(failed, str):
        raise ValueError(f"{where}.failed: expected the failure's reason (text)")
    duration = None
    if "duration" in item:
        try:
            duration = parse_duration(item["duration"])
        except ValueError as exc:
            raise ValueError(f"{where}.duration: {exc}") from None
    return ScriptedTrial(
        trial=trial,
        parameters={k: tuple(v) if isinstance(v, list) else v for k, v in parameters.items()},
        losses=tuple(sorted((int(step), float(loss)) for step, loss in losses.items())),
        metrics={str(k): float(v) for k, v in metrics.items()},
        failed=failed,
        duration=duration,
    )


def _same(value: Any, wanted: Any) -> bool:
    if _number(value) and _number(wanted):
        return math.isclose(float(value), float(wanted), rel_tol=1e-9, abs_tol=0.0)
    return bool(value == wanted)


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None

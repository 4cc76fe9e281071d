"""`launch.sweep`: the rule-file block of a hyperparameter sweep → `SweepSpec`.

`parsing.py` calls `parse_sweep` for a launch with a `sweep:` key and hands it the located
YAML mapping (its keys and values know their line and column) and the function that records
a problem, so every problem here is reported as FILE:LINE:COL like the rest of the file. What
a sweep may vary is `orchestrator/sweeps/parameters.py`'s; each value and range end is checked
with the same checks a launch field's value gets (`templating.check_value`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Protocol

from orchestrator.jobs.promotion import Mode
from orchestrator.rules.durations import DurationError, parse_duration
from orchestrator.rules.templating import Template, TemplateError, check_value
from orchestrator.sweeps import parameters
from orchestrator.sweeps.parameters import Kind
from orchestrator.sweeps.spec import (
    OBJECTIVE_METRICS,
    Algorithm,
    Choice,
    MedianStopping,
    Objective,
    Parameter,
    Range,
    Scale,
    SweepSpec,
)
from orchestrator.sweeps.suggesting import grid_size

Mark = tuple[int, int]
Report = Callable[[Mark, str], None]
"""Records one problem at a (line, column) of the file being parsed."""

SWEEP_KEYS = (
    "objective",
    "algorithm",
    "parameters",
    "parallel",
    "max_trials",
    "max_failed",
    "budget",
    "early_stopping",
)
EXAMPLE = (
    "{objective: {metric: eval_loss}, parameters: {training.learning_rate: "
    "{min: 1e-5, max: 1e-3, scale: log}}, max_trials: 4}"
)


class Located(Protocol):
    """A YAML mapping that knows where its keys and values are (`parsing.Loc`)."""

    mark: Mark
    key_marks: dict[str, Mark]
    value_marks: dict[str, Mark]

    def __iter__(self) -> Iterator[str]: ...
    def __contains__(self, key: object) -> bool: ...
    def __getitem__(self, key: str) -> Any: ...
    def get(self, key: str, default: Any = None) -> Any: ...


def _is_located(value: Any) -> bool:
    return isinstance(value, Mapping) and hasattr(value, "value_marks")


class _Checker:
    """Collects the problems of one `sweep:` block."""

    def __init__(self, report: Report) -> None:
        self._report = report
        self.count = 0

    def add(self, mark: Mark, message: str) -> None:
        self.count += 1
        self._report(mark, message)

    def keys(self, mapping: Located, allowed: tuple[str, ...], where: str) -> None:
        for name in mapping:
            if name not in allowed:
                self.add(
                    mapping.key_marks[name],
                    f"unknown key {name!r} in {where}{_hint(name, allowed)}",
                )

    def mapping(self, parent: Located, name: str, example: str) -> Located | None:
        if name not in parent:
            return None
        value = parent[name]
        if not _is_located(value):
            self.add(parent.value_marks[name], f"{name} must be a mapping such as {example}")
            return None
        located: Located = value
        return located

    def whole(
        self, mapping: Located, name: str, *, minimum: int, default: int | None
    ) -> int | None:
        if name not in mapping or mapping[name] is None:
            return default
        value = mapping[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.add(
                mapping.value_marks[name],
                f"sweep {name} must be a whole number ≥ {minimum}, got {value!r}",
            )
            return default
        return value


def parse_sweep(
    value: Any,
    *,
    mark: Mark,
    report: Report,
    training: Mapping[str, Template],
) -> SweepSpec | None:
    """The `SweepSpec` of a launch's `sweep:` *value* (at *mark*), or None after reporting
    every problem through *report*. *training* is the launch's `training:` templates (a
    literal `eval_fraction: 0` leaves no held-out examples to rank trials by)."""
    check = _Checker(report)
    if not _is_located(value):
        check.add(mark, f"sweep must be a mapping such as {EXAMPLE}")
        return None
    sweep: Located = value
    check.keys(sweep, SWEEP_KEYS, "sweep")
    objective = _objective(check, sweep)
    algorithm, seed = _algorithm(check, sweep)
    swept = _parameters(check, sweep)
    parallel, max_trials = _trials(check, sweep, algorithm, swept)
    max_failed = check.whole(sweep, "max_failed", minimum=1, default=None)
    budget = _budget(check, sweep)
    median = _early_stopping(check, sweep)
    if algorithm is Algorithm.GRID:
        _check_grid(check, sweep, swept)
    fraction = training.get("eval_fraction")
    if fraction is not None and fraction.is_literal and fraction.literal == 0:
        check.add(
            mark,
            f"a sweep ranks trials by {objective.metric} on held-out examples, but "
            "training.eval_fraction 0 holds none out: raise it",
        )
    if check.count or max_trials is None or not swept:
        return None
    return SweepSpec(
        parameters=swept,
        objective=objective,
        algorithm=algorithm,
        seed=seed,
        parallel=parallel,
        max_trials=max_trials,
        max_failed=max_failed,
        budget=budget,
        median=median,
    )


def _trials(
    check: _Checker, sweep: Located, algorithm: Algorithm, swept: tuple[Parameter, ...]
) -> tuple[int, int | None]:
    """`parallel` and `max_trials` (a grid's default: every point)."""
    parallel = check.whole(sweep, "parallel", minimum=1, default=1) or 1
    default_trials = None
    if algorithm is Algorithm.GRID and swept and all(isinstance(p.domain, Choice) for p in swept):
        default_trials = grid_size(SweepSpec(parameters=swept))
    max_trials = check.whole(sweep, "max_trials", minimum=1, default=default_trials)
    if max_trials is None and "max_trials" not in sweep:
        check.add(
            sweep.mark,
            "sweep needs `max_trials` (how many trials to run in all; a grid runs every point "
            "unless told fewer)",
        )
    elif max_trials is not None and max_trials < parallel:
        check.add(
            sweep.value_marks["max_trials"] if "max_trials" in sweep else sweep.mark,
            f"max_trials ({max_trials}) is less than parallel ({parallel}): no more than "
            "max_trials trials ever run, so lower parallel",
        )
    return parallel, max_trials


def _budget(check: _Checker, sweep: Located) -> timedelta | None:
    if "budget" not in sweep:
        return None
    try:
        budget = parse_duration(sweep["budget"])
    except DurationError as exc:
        check.add(sweep.value_marks["budget"], f"budget: {exc}")
        return None
    if budget <= timedelta(0):
        check.add(sweep.value_marks["budget"], "budget must be longer than 0s")
        return None
    return budget


def _check_grid(check: _Checker, sweep: Located, swept: tuple[Parameter, ...]) -> None:
    for parameter in swept:
        if not isinstance(parameter.domain, Choice):
            check.add(
                sweep["parameters"].value_marks[parameter.path],
                f"a grid tries listed values: give {parameter.path} `values: [...]`, "
                "not min/max (or use algorithm random or tpe)",
            )


def _objective(check: _Checker, sweep: Located) -> Objective:
    value = check.mapping(sweep, "objective", "{metric: eval_loss, mode: min, goal: 0.8}")
    if value is None:
        return Objective()
    check.keys(value, ("metric", "mode", "goal"), "objective")
    metric = value.get("metric", "eval_loss")
    if metric not in OBJECTIVE_METRICS:
        check.add(
            value.value_marks["metric"],
            f"objective.metric must be one of {', '.join(OBJECTIVE_METRICS)} (the scores the "
            f"trainer reports at the end of a run), got {metric!r}"
            + (_hint(metric, OBJECTIVE_METRICS) if isinstance(metric, str) else ""),
        )
        return Objective()
    mode = value.get("mode", OBJECTIVE_METRICS[metric].value)
    if mode not in [m.value for m in Mode]:
        check.add(value.value_marks["mode"], f"objective.mode must be min or max, got {mode!r}")
        mode = OBJECTIVE_METRICS[metric].value
    goal = value.get("goal")
    if goal is not None and not _is_number(goal):
        check.add(value.value_marks["goal"], f"objective.goal must be a number, got {goal!r}")
        goal = None
    return Objective(metric=metric, mode=Mode(mode), goal=None if goal is None else float(goal))


def _algorithm(check: _Checker, sweep: Located) -> tuple[Algorithm, int]:
    if "algorithm" not in sweep:
        return Algorithm.RANDOM, 0
    value = sweep["algorithm"]
    names = [a.value for a in Algorithm]
    if isinstance(value, str):
        name, seed, where = value, 0, sweep.value_marks["algorithm"]
    elif _is_located(value):
        located: Located = value
        check.keys(located, ("name", "seed"), "algorithm")
        name = located.get("name", Algorithm.RANDOM.value)
        where = located.value_marks.get("name", located.mark)
        seed = check.whole(located, "seed", minimum=0, default=0) or 0
    else:
        check.add(
            sweep.value_marks["algorithm"],
            "algorithm must be a name (random, grid, tpe) or a mapping such as "
            "{name: tpe, seed: 7}",
        )
        return Algorithm.RANDOM, 0
    if name not in names:
        check.add(
            where,
            f"algorithm must be one of {', '.join(names)}, got {name!r}"
            + (_hint(name, names) if isinstance(name, str) else ""),
        )
        return Algorithm.RANDOM, seed
    return Algorithm(name), seed


def _parameters(check: _Checker, sweep: Located) -> tuple[Parameter, ...]:
    if "parameters" not in sweep:
        check.add(sweep.mark, "sweep needs `parameters` (the launch fields to vary, by path)")
        return ()
    value = check.mapping(sweep, "parameters", "{training.learning_rate: {min: 1e-5, max: 1e-3}}")
    if value is None:
        return ()
    found = []
    for path in value:
        key_mark, value_mark = value.key_marks[path], value.value_marks[path]
        refused = parameters.refusal(path)
        if refused is not None:
            check.add(key_mark, f"a sweep cannot vary {path}: {refused}")
            continue
        kind = parameters.FIELDS.get(path)
        if kind is None:
            check.add(
                key_mark,
                f"unknown parameter {path!r}: a sweep varies one of "
                f"{', '.join(parameters.FIELDS)}{_hint(path, parameters.FIELDS)}",
            )
            continue
        domain = _domain(check, path, kind, value[path], value_mark)
        if domain is not None:
            found.append(Parameter(path=path, domain=domain))
    if not found and not check.count:
        check.add(value.mark, "sweep.parameters is empty: name at least one field to vary")
    return tuple(found)


def _domain(
    check: _Checker, path: str, kind: Kind, value: Any, mark: Mark
) -> Range | Choice | None:
    if not _is_located(value):
        check.add(
            mark,
            f"{path} must be a mapping: {{values: [...]}} or {{min: ..., max: ..., scale: "
            "linear|log}}",
        )
        return None
    domain: Located = value
    section, field = path.split(".", 1)
    if "values" in domain:
        check.keys(domain, ("values",), path)
        return _choice(check, path, section, field, domain)
    check.keys(domain, ("min", "max", "scale"), path)
    return _range(check, path, kind, domain, mark)


def _range(check: _Checker, path: str, kind: Kind, domain: Located, mark: Mark) -> Range | None:
    if kind in (Kind.FLAG, Kind.NAMES):
        check.add(mark, f"{path} takes listed values only: {{values: [...]}}")
        return None
    if "min" not in domain or "max" not in domain:
        check.add(mark, f"{path} needs `values: [...]`, or both `min` and `max`")
        return None
    before = check.count
    low, high = (_range_end(check, path, kind, domain, end) for end in ("min", "max"))
    scale = domain.get("scale", Scale.LINEAR.value)
    if scale not in [s.value for s in Scale]:
        check.add(domain.value_marks["scale"], f"{path}.scale must be linear or log, got {scale!r}")
    if low is not None and high is not None:
        if not low < high:
            check.add(
                domain.value_marks["max"], f"{path}: max ({high:g}) must be more than min ({low:g})"
            )
        elif scale == Scale.LOG.value and low <= 0:
            check.add(domain.value_marks["min"], f"{path}: a log scale needs min > 0, got {low:g}")
    if check.count > before or low is None or high is None:
        return None
    return Range(low=low, high=high, scale=Scale(scale), integer=kind is Kind.INTEGER)


def _range_end(check: _Checker, path: str, kind: Kind, domain: Located, end: str) -> float | None:
    """`min` or `max` of a range, checked as a value of the field it bounds."""
    number = domain[end]
    where = domain.value_marks[end]
    if not _is_number(number):
        check.add(where, f"{path}.{end} must be a number, got {number!r}")
        return None
    if kind is Kind.INTEGER and int(number) != number:
        check.add(where, f"{path}.{end} must be a whole number ({path} is one), got {number!r}")
        return None
    section, field = path.split(".", 1)
    try:
        check_value(section, field, int(number) if kind is Kind.INTEGER else number)
    except TemplateError as exc:
        check.add(where, f"{path}.{end}: {exc}")
        return None
    return float(number)


def _choice(check: _Checker, path: str, section: str, field: str, domain: Located) -> Choice | None:
    values = domain["values"]
    where = domain.value_marks["values"]
    if not isinstance(values, list) or not values:
        check.add(where, f"{path}.values must be a non-empty list")
        return None
    marks = getattr(values, "marks", [where] * len(values))
    checked: list[Any] = []
    for item, item_mark in zip(values, marks, strict=True):
        try:
            value = check_value(section, field, list(item) if isinstance(item, list) else item)
        except TemplateError as exc:
            check.add(item_mark, f"{path}.values: {exc}")
            return None
        if value in checked:
            check.add(item_mark, f"{path}.values lists {item!r} twice")
            return None
        checked.append(value)
    return Choice(tuple(checked))


def _early_stopping(check: _Checker, sweep: Located) -> MedianStopping | None:
    value = check.mapping(sweep, "early_stopping", "{median: {min_trials: 3, start_step: 20}}")
    if value is None:
        return None
    check.keys(value, ("median",), "early_stopping")
    median = check.mapping(value, "median", "{min_trials: 3, start_step: 20}")
    if median is None:
        if "median" not in value:
            check.add(value.mark, "early_stopping needs a rule: median: {min_trials, start_step}")
        return None
    check.keys(median, ("min_trials", "start_step"), "median")
    min_trials = check.whole(median, "min_trials", minimum=1, default=3) or 3
    start_step = check.whole(median, "start_step", minimum=0, default=0) or 0
    return MedianStopping(min_trials=min_trials, start_step=start_step)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _hint(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""

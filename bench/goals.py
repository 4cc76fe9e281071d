"""Whether a benchmark row met its goal, read from the goal's own text.

`bench/__main__.py` calls `met(row)` for every row and prints the answer in the `met` column
of the table (and of docs/performance.md), so a missed goal is flagged rather than left for
the reader to compare by eye. A goal is written as one comparison, optionally followed by
words that say what it is about:

    ">= 1x"                   the row's ratio (value / baseline) is at least 1
    "<= 1.5x bare create"     the ratio is at most 1.5; the words are for the reader
    "<= 100 ms"               the row's value, which must be in ms, is at most 100

A number followed by `x` is compared with the ratio; any other unit with the value, and then
it must be the row's unit, so that a goal in ms is never checked against a value in seconds.
A row without a goal, or whose goal starts with "context", is context: its `met` is blank.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

CONTEXT = "context"
"""A goal starting with this word is no goal: the row is there to explain the others."""

_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "≥": operator.ge,
    "≤": operator.le,
}
_GOAL = re.compile(r"^\s*(>=|<=|≥|≤|>|<)\s*([0-9]+(?:\.[0-9]+)?)\s*(x\b|[^\s\d][^\s]*)")


class UncheckableGoalError(ValueError):
    """A goal the bench cannot check: fix the benchmark's goal text, the run is reported failed."""


@dataclass(frozen=True, slots=True)
class Goal:
    """One comparison: the row's ratio (when `unit` is "x") or value against `threshold`."""

    comparison: str
    threshold: float
    unit: str

    @property
    def on_ratio(self) -> bool:
        return self.unit == "x"

    def holds(self, measured: float) -> bool:
        """Whether *measured* meets the goal; a missing measure (NaN) never does."""
        if math.isnan(measured):
            return False
        return _COMPARISONS[self.comparison](measured, self.threshold)


def parse(text: str) -> Goal | None:
    """The goal in *text*, or None for a context row.

    Raises:
        UncheckableGoalError: the text is neither empty, context, nor a comparison.
    """
    if not text.strip() or text.strip().lower().startswith(CONTEXT):
        return None
    found = _GOAL.match(text)
    if found is None:
        raise UncheckableGoalError(
            f"goal {text!r} is not a comparison such as '>= 0.5x' or '<= 100 ms'"
        )
    comparison, threshold, unit = found.groups()
    return Goal(comparison, float(threshold), unit)


def met(row: Mapping[str, object]) -> str:
    """ "yes" or "no" for a row with a goal, "" for a context row.

    Raises:
        UncheckableGoalError: the goal cannot be read, its unit is not the row's, or the row
            lacks the number the goal compares.
    """
    goal = parse(str(row.get("goal") or ""))
    if goal is None:
        return ""
    field = "ratio" if goal.on_ratio else "value"
    if not goal.on_ratio and goal.unit != row.get("unit"):
        raise UncheckableGoalError(
            f"goal {row.get('goal')!r} is in {goal.unit}, the row's value in {row.get('unit')}"
        )
    measured = row.get(field)
    if not isinstance(measured, int | float):
        raise UncheckableGoalError(f"goal {row.get('goal')!r} needs the row's {field}")
    return "yes" if goal.holds(float(measured)) else "no"

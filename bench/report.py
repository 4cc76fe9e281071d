"""The table of `make bench` and the page it writes, docs/performance.md.

Called by `bench/__main__.py` once every benchmark has run. Each row gets its `met` column
here, from its goal (`bench/goals.py`), so the printed table and the page always agree.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

from bench import goals

COLUMNS = ("benchmark", "measure", "value", "unit", "baseline", "ratio", "goal", "met", "notes")


def cell(value: object) -> str:
    """A value as table text: 3 significant digits, thousands grouped, pipes escaped."""
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "" if value is None else str(value).replace("|", "\\|")


def with_met(row: Mapping[str, object]) -> tuple[dict[str, object], bool]:
    """The row with its `met` column, and whether its goal could be checked (`?` if not)."""
    try:
        return {**row, "met": goals.met(row)}, True
    except goals.UncheckableGoalError as exc:
        print(f"bench: {row.get('benchmark')}: {exc}", file=sys.stderr)
        return {**row, "met": "?"}, False


def table(rows: Iterable[Mapping[str, object]]) -> tuple[str, int]:
    """The Markdown table of *rows* with their `met` column, and how many goals were unreadable."""
    checked = [with_met(row) for row in rows]
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(" --- " for _ in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in COLUMNS) + " |" for row, _ in checked]
    return "\n".join(lines), sum(1 for _, readable in checked if not readable)


def page(text: str, *, date: str, machine: str, versions: str) -> str:
    """docs/performance.md around the table *text*."""
    return (
        "# Performance\n\n"
        "Written by `make bench` (`python -m bench`); do not edit by hand.\n"
        "Every ratio compares two measurements taken in the same run on the same machine.\n"
        "`met` says whether a row met its goal (a comparison on its ratio or value, see\n"
        "`bench/goals.py`); it is blank for rows that are context.\n\n"
        f"- date: {date}\n"
        f"- machine: {machine}\n"
        f"- versions: {versions}\n\n"
        f"{text}\n"
    )

"""The table of `make bench` and the page it writes, docs/performance.md.

Called by `bench/__main__.py` once every benchmark has run. Each row gets its `met` column
here, from its goal (`bench/goals.py`), so the printed table and the page always agree.

An area's `run` returns its rows, or `Results`: rows plus `Section`s of text that the page
carries under the table (the worker's profile, `bench/worker.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bench import goals


@dataclass(frozen=True, slots=True)
class Section:
    """A part of docs/performance.md under the table: a `## title` and Markdown text."""

    title: str
    body: str


@dataclass(frozen=True, slots=True)
class Results:
    """What an area measured: table rows, and sections for the page."""

    rows: list[dict[str, object]]
    sections: list[Section] = field(default_factory=list)


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


def met_summary(rows: Iterable[Mapping[str, object]]) -> str:
    """One line: how many goals were met, and which were not (by benchmark and measure)."""
    judged = 0
    missed = []
    for row in rows:
        try:
            answer = goals.met(row)
        except goals.UncheckableGoalError:  # `table` reports it; here it is neither
            continue
        judged += answer in ("yes", "no")
        if answer == "no":
            missed.append(f"{row.get('benchmark')}: {row.get('measure')}")
    line = f"Goals met: {judged - len(missed)} of {judged}."
    return line + (" Not met: " + "; ".join(missed) + "." if missed else "")


def page(
    text: str,
    *,
    date: str,
    machine: str,
    versions: str,
    timings: str = "",
    summary: str = "",
    sections: Sequence[Section] = (),
) -> str:
    """docs/performance.md around the table *text*, with *summary* under it and then
    *sections*."""
    facts = f"- date: {date}\n- machine: {machine}\n- versions: {versions}\n"
    facts += f"- time per area: {timings}\n" if timings else ""
    extra = f"\n{summary}\n" if summary else ""
    extra += "".join(f"\n## {s.title}\n\n{s.body.rstrip()}\n" for s in sections)
    return (
        "# Performance\n\n"
        "Written by `make bench` (`python -m bench`); do not edit by hand.\n"
        "Every ratio compares two measurements taken in the same run on the same machine.\n"
        "`met` says whether a row met its goal (a comparison on its ratio or value, see\n"
        "`bench/goals.py`); it is blank for rows that are context.\n"
        "Why the goals that are not met are not, and what the profiles say each costs:\n"
        "[hot-path.md](hot-path.md) (written by hand, with the date of each figure).\n\n"
        f"{facts}\n"
        f"{text}\n"
        f"{extra}"
    )

"""The `met` column of `make bench`: computed from each row's goal, never typed by hand."""

from __future__ import annotations

import math

import pytest

from bench import goals, report


def _row(goal: str, *, value: float = 50.0, unit: str = "ms", ratio: float = 0.8) -> dict:
    return {
        "benchmark": "b",
        "measure": "m",
        "value": value,
        "unit": unit,
        "ratio": ratio,
        "baseline": 1.0,
        "goal": goal,
    }


@pytest.mark.parametrize(
    ("goal", "ratio", "expected"),
    [
        (">= 0.5x", 0.8, "yes"),
        (">= 1x", 0.8, "no"),
        (">= 1.0x", 1.0, "yes"),
        ("<= 1.5x bare create", 1.6, "no"),
        ("<= 1.5x bare create", 1.2, "yes"),
        ("≤ 3x json.loads", 2.9, "yes"),
        (">= 1x the offered rate", 0.81, "no"),
    ],
    ids=[
        "above-minimum",
        "below-minimum",
        "exactly-minimum",
        "above-maximum",
        "within-maximum",
        "unicode-comparison",
        "words-after-the-unit",
    ],
)
def test_a_goal_in_x_is_checked_against_the_ratio(goal, ratio, expected):
    assert goals.met(_row(goal, ratio=ratio)) == expected


def test_a_goal_in_the_rows_unit_is_checked_against_the_value():
    assert goals.met(_row("<= 100 ms", value=99.0, ratio=50.0)) == "yes"
    assert goals.met(_row("<= 100 ms", value=4400.0, ratio=0.1)) == "no"


def test_a_missing_measurement_never_meets_its_goal():
    assert goals.met(_row("<= 100 ms", value=math.nan)) == "no"


@pytest.mark.parametrize(
    "goal",
    ["", "context: < 1 leaves headroom", "Context"],
    ids=["empty", "context-with-words", "capitalised"],
)
def test_context_rows_have_a_blank_met(goal):
    assert goals.met(_row(goal)) == ""


@pytest.mark.parametrize(
    ("row", "complaint"),
    [
        (_row("p99 <= 100 ms"), "not a comparison"),
        (_row("<= 100 ms", unit="s"), "in ms"),
        (_row(">= 5"), "not a comparison"),
        ({"benchmark": "b", "goal": ">= 1x"}, "ratio"),
    ],
    ids=["words-before-the-comparison", "unit-not-the-rows", "no-unit", "no-ratio"],
)
def test_a_goal_that_cannot_be_checked_is_an_error(row, complaint):
    with pytest.raises(goals.UncheckableGoalError, match=complaint):
        goals.met(row)


def test_the_table_has_a_met_column_filled_from_each_goal():
    text, unreadable = report.table(
        [_row(">= 1x", ratio=1.25), _row(">= 1x", ratio=0.5), _row("context: the share")]
    )
    header, _, *lines = [
        [cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines()
    ]
    met = header.index("met")
    assert [cells[met] for cells in lines] == ["yes", "no", ""]
    assert unreadable == 0


def test_an_unreadable_goal_is_counted_and_marked_in_the_table():
    text, unreadable = report.table([_row("fast enough")])
    assert unreadable == 1
    assert "| fast enough | ? |" in text


def test_the_page_carries_the_table_and_explains_met():
    text, _ = report.table([_row(">= 1x", ratio=2.0)])
    written = report.page(text, date="2026-12-03 16:00 UTC", machine="m", versions="v")
    assert written.startswith("# Performance\n")
    assert "| goal | met | notes |" in written
    assert "`met` says whether a row met its goal" in written


def test_the_summary_counts_met_goals_and_names_the_missed_ones():
    rows = [
        {**_row(">= 1x", ratio=2.0), "measure": "fast"},
        {**_row(">= 1x", ratio=0.5), "measure": "slow"},
        {**_row("context: the share"), "measure": "share"},
    ]
    assert report.met_summary(rows) == "Goals met: 1 of 2. Not met: b: slow."


def test_the_page_carries_the_sections_under_the_table_and_the_time_per_area():
    text, _ = report.table([_row(">= 1x", ratio=2.0)])
    written = report.page(
        text,
        date="d",
        machine="m",
        versions="v",
        timings="worker 50 s",
        summary="Goals met: 1 of 1.",
        sections=[report.Section("Profile: the worker under load", "| # | function |\n")],
    )
    assert "- time per area: worker 50 s\n" in written
    table_at = written.index("| goal | met | notes |")
    summary_at = written.index("Goals met: 1 of 1.")
    section_at = written.index("## Profile: the worker under load\n\n| # | function |")
    assert table_at < summary_at < section_at

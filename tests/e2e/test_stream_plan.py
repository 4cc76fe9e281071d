"""The fault suites' oracle, checked: the stream plan knows which models must launch.

The fault suites (`test_fault_*.py`) compare the TrainJobs a crashed and restarted worker made
with `PlannedStream.must_launch`, which the plan computes from its own construction. These
tests check that bookkeeping against the events themselves and against the rule file, and
then hold `tuneloop simulate` (the engine, replayed) to the same answer: one more
implementation that must agree with the plan, not the source of the suites' expectations.
No broker and no API server are needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.rules import loading
from tests.e2e.harness import (
    FAULT_RULES,
    REPO,
    RULE_COUNT,
    RULE_WINDOW,
    StreamPlan,
    make_stream,
    write_jsonl,
)

SHORT_SUITE_PLANS = {
    "kill -9": StreamPlan(seed=1, events=2000, launch_share=0.3),
    "two workers": StreamPlan(seed=3, events=800, launch_share=0.4),
    "broker restart": StreamPlan(seed=5, events=800, launch_share=0.4),
    "API outage": StreamPlan(seed=7, events=800, launch_share=0.4),
}
"""The plans of the short fault suites (`make test`), by suite."""


def test_the_plan_counts_exactly_the_alarms_above_threshold_it_sent_each_model():
    stream = make_stream(StreamPlan(seed=11, events=600))
    above = Counter(str(e.subject) for e in stream.events if e.data["value"] > e.data["threshold"])
    assert {key: n for key, n in stream.qualifying.items() if n} == dict(above)
    assert set(stream.qualifying) == {e.subject for e in stream.events}


def test_no_model_is_sent_more_qualifying_alarms_than_one_launch_takes():
    stream = make_stream(StreamPlan(seed=12, events=3000, launch_share=0.9))
    assert max(stream.qualifying.values()) == RULE_COUNT
    assert stream.must_launch == {k for k, n in stream.qualifying.items() if n == RULE_COUNT}


def test_a_soak_sized_stream_fits_in_one_rule_window():
    events = make_stream(StreamPlan(seed=13, events=10_000)).events
    first, last = events[0].time, events[-1].time
    assert first is not None
    assert last is not None
    assert last - first < RULE_WINDOW


def test_the_plan_uses_the_count_and_window_of_the_fault_suites_rule_file(tmp_path: Path):
    path = tmp_path / "rules.yaml"
    path.write_text(FAULT_RULES)
    (rule,) = loading.load_rules([path]).rules
    assert (rule.count, rule.window) == (RULE_COUNT, RULE_WINDOW)


def test_the_same_plan_makes_the_same_stream():
    plan = StreamPlan(seed=14, events=300)
    first, second = make_stream(plan), make_stream(plan)
    assert [e.id for e in first.events] == [e.id for e in second.events]
    assert [e.data for e in first.events] == [e.data for e in second.events]
    assert first.must_launch == second.must_launch


def simulated_launches(tmp_path: Path, plan: StreamPlan) -> list[str]:
    """The key of every launch `tuneloop simulate --json` decides for *plan*'s stream."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(FAULT_RULES)
    events = write_jsonl(make_stream(plan).events, tmp_path / "events.jsonl")
    answer = subprocess.run(
        [
            *(sys.executable, "-m", "handlers.cli.main", "simulate"),
            *("--rules", str(rules), "--events", str(events), "--json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert answer.returncode == 0, answer.stderr
    records = [json.loads(line) for line in answer.stdout.splitlines() if line.strip()]
    return [r["key"] for r in records if r["outcome"] == "launch"]


@pytest.mark.parametrize("plan", SHORT_SUITE_PLANS.values(), ids=SHORT_SUITE_PLANS.keys())
def test_simulate_launches_each_key_the_plan_must_launch_exactly_once_and_no_other(
    tmp_path: Path, plan: StreamPlan
):
    launched = simulated_launches(tmp_path, plan)
    must_launch = make_stream(plan).must_launch
    assert len(launched) == len(set(launched)), "simulate launched a key twice"
    assert set(launched) == must_launch

"""docs/sweeps.md's examples do what the page says: the rule parses to the sweep it
describes, the scripted trials play out as its walk-through tells, and its rule test passes
through `tuneloop test`.

The expected decisions are the page's own story (written by hand there and here), not the
simulation's output read back.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from typer.testing import CliRunner

from handlers.cli.main import app
from orchestrator.events import CloudEvent
from orchestrator.jobs.promotion import Mode
from orchestrator.ledger import Outcome, Reason
from orchestrator.rules.durations import parse_duration
from orchestrator.rules.parsing import Source, parse_files
from orchestrator.rules.simulation import simulate
from orchestrator.sweeps.scripting import parse_script
from orchestrator.sweeps.spec import (
    Algorithm,
    Choice,
    MedianStopping,
    Objective,
    Parameter,
    Range,
    Scale,
)
from orchestrator.sweeps.suggesting import PURE
from runtimes.sweeps.optuna_tpe import OptunaTpeSuggester

PAGE = Path(__file__).resolve().parents[3] / "docs" / "sweeps.md"
FENCE = re.compile(r"^```yaml\n(.*?)^```", re.DOTALL | re.MULTILINE)
SUGGESTERS = {**PURE, Algorithm.TPE: OptunaTpeSuggester()}
T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def block(top_key: str) -> str:
    """The page's YAML block whose document has *top_key* at its top."""
    (found,) = [
        body
        for body in FENCE.findall(PAGE.read_text(encoding="utf-8"))
        if top_key in (yaml.safe_load(body) or {})
    ]
    return str(found)


def drift() -> CloudEvent:
    return CloudEvent(
        id="d1",
        source="/monitors/eval",
        type="io.tuneloop.drift.detected.v1",
        time=T0,
        datacontenttype="application/json",
        data={"model_id": "m7", "metric": "psi", "value": 0.3, "threshold": 0.2},
    )


def test_the_page_s_rule_is_the_sweep_its_table_describes():
    (rule,) = parse_files([Source("sweeps.md", block("rules"))]).rules
    spec = rule.launch.sweep
    assert spec.objective == Objective("eval_loss", Mode.MIN, 0.8)
    assert (spec.algorithm, spec.seed) == (Algorithm.TPE, 7)
    assert spec.parameters == (
        Parameter("training.learning_rate", Range(1e-5, 1e-3, Scale.LOG)),
        Parameter("lora.r", Choice((8, 16, 32))),
        Parameter("lora.alpha", Choice((16, 32))),
    )
    assert (spec.parallel, spec.max_trials, spec.max_failed) == (2, 6, 2)
    assert spec.budget == timedelta(hours=8)
    assert spec.median == MedianStopping(min_trials=3, start_step=20)


def test_the_walk_through_happens_as_the_page_tells_it():
    rules = parse_files([Source("sweeps.md", block("rules"))])
    script = parse_script(yaml.safe_load(block("trials")), parse_duration=parse_duration)
    records = simulate(
        rules,
        [drift()],
        assume_duration=timedelta(hours=1),
        assume_metrics=script,
        suggesters=SUGGESTERS,
    )
    story = [(r.outcome, r.reason, r.time - T0) for r in records if r.outcome is not Outcome.IGNORE]
    minutes = timedelta(minutes=1)
    assert story == [
        (Outcome.LAUNCH, None, 0 * minutes),  # the sweep
        (Outcome.LAUNCH, Reason.TRIAL, 0 * minutes),  # trials 0 and 1
        (Outcome.LAUNCH, Reason.TRIAL, 0 * minutes),
        (Outcome.LAUNCH, Reason.TRIAL, 30 * minutes),  # 0 and 1 completed: trials 2 and 3
        (Outcome.LAUNCH, Reason.TRIAL, 30 * minutes),
        (Outcome.LAUNCH, Reason.TRIAL, 60 * minutes),  # 2 completed: trial 4
        (Outcome.CANCEL, Reason.PRUNED, 60 * minutes),  # trial 3 behind the median
        (Outcome.LAUNCH, Reason.TRIAL, 60 * minutes),  # trial 5 in its place
        (Outcome.CANCEL, Reason.SWEEP_ENDED, 80 * minutes),  # trial 4 reached the goal
        (Outcome.CONCLUDE, Reason.GOAL_REACHED, 80 * minutes),
    ]
    trials = [r for r in records if r.reason is Reason.TRIAL]
    pruned = next(r for r in records if r.reason is Reason.PRUNED)
    concluded = records[-1]
    assert pruned.job_name == trials[3].job_name
    assert "2.9 by step 30 is worse than the median 1.4 of 3 completed trials" in pruned.message
    assert concluded.job_name == trials[4].job_name
    assert len({r.job_name for r in trials}) == 6
    # Each trial's job is the rule's launch with the parameters its message names.
    for record in trials:
        assert record.job is not None
        assert f"lora.r={record.job.lora.r}" in record.message
        assert 1e-5 <= record.job.training.learning_rate <= 1e-3


def test_the_page_s_rule_test_passes(tmp_path):
    (tmp_path / "rules.yaml").write_text(block("rules"))
    (tmp_path / "tests.yaml").write_text(block("cases"))
    result = CliRunner().invoke(
        app, ["test", str(tmp_path / "rules.yaml"), str(tmp_path / "tests.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert result.output.endswith("1 passed, 0 failed\n")


def test_simulate_takes_the_trial_script_from_a_file(tmp_path):
    (tmp_path / "rules.yaml").write_text(block("rules"))
    (tmp_path / "trials.yaml").write_text(block("trials"))
    event = {
        "specversion": "1.0",
        "id": "d1",
        "source": "/monitors/eval",
        "type": "io.tuneloop.drift.detected.v1",
        "time": "2026-03-01T08:00:00Z",
        "data": {"model_id": "m7", "metric": "psi", "value": 0.3, "threshold": 0.2},
    }
    (tmp_path / "events.jsonl").write_text(json.dumps(event) + "\n")
    arguments = ["simulate", "--rules", str(tmp_path / "rules.yaml")]
    arguments += ["--events", str(tmp_path / "events.jsonl"), "--json"]
    result = CliRunner().invoke(
        app, [*arguments, "--assume-metrics", str(tmp_path / "trials.yaml")]
    )
    assert result.exit_code == 0, result.output
    last = json.loads(result.stdout.splitlines()[-1])
    assert (last["outcome"], last["reason"]) == ("conclude", "goal-reached")

    (tmp_path / "bad.yaml").write_text("trials:\n  - {trial: 1, metrics: {eval_loss: low}}\n")
    result = CliRunner().invoke(app, [*arguments, "--assume-metrics", str(tmp_path / "bad.yaml")])
    assert result.exit_code == 1
    assert "not a trial script: trials[0].metrics: expected a mapping of metric: number" in (
        result.output
    )


def test_explain_follows_the_alarm_to_the_end_of_its_sweep(tmp_path):
    (tmp_path / "rules.yaml").write_text(block("rules"))
    (tmp_path / "trials.yaml").write_text(block("trials"))
    event = {
        "specversion": "1.0",
        "id": "d1",
        "source": "/monitors/eval",
        "type": "io.tuneloop.drift.detected.v1",
        "time": "2026-03-01T08:00:00Z",
        "data": {"model_id": "m7", "metric": "psi", "value": 0.3, "threshold": 0.2},
    }
    (tmp_path / "events.jsonl").write_text(json.dumps(event) + "\n")
    result = CliRunner().invoke(
        app,
        [
            "explain",
            "--event",
            "d1",
            "--rules",
            str(tmp_path / "rules.yaml"),
            "--events",
            str(tmp_path / "events.jsonl"),
            "--assume-metrics",
            str(tmp_path / "trials.yaml"),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert (
        lines[1] == "  rule 'sweep-on-drift' for key 'm7': ended the sweep it caused (goal-reached)"
    )
    assert sum("launch (trial)" in line for line in lines) == 6

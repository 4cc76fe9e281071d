"""Rule files: what loads, and the FILE:LINE:COL problems `tuneloop check` reports."""

from __future__ import annotations

import textwrap
from datetime import timedelta

import pytest

from orchestrator.errors import ConfigError
from orchestrator.rules import loading
from orchestrator.rules.durations import DurationError, format_duration, parse_duration
from orchestrator.rules.model import Concurrency, Mode
from orchestrator.rules.parsing import RuleFileError, Source, parse_files

GOOD = """\
rules:
  - name: r
    on: {type: io.tuneloop.drift.detected.v1}
    key: event.data.model_id
    launch: {runtime: rt, base_model: m, dataset: d}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(RuleFileError) as caught:
        parse_files([Source("f.yaml", textwrap.dedent(text))])
    return [str(p) for p in caught.value.problems]


def test_the_example_rule_file_loads():
    rules = loading.load_rules(["docs/examples/rules.yaml"])
    drift = rules.rule("chat-drift-retrain")
    assert drift.count == 3
    assert drift.window == timedelta(hours=6)
    assert drift.cooldown == timedelta(hours=24)
    assert drift.concurrency is Concurrency.FORBID
    assert drift.joins[0].type == "io.tuneloop.data.arrived.v1"
    assert rules.rule("rows-refresh").mode is Mode.SHADOW
    assert rules.runtimes == {"torch-distributed", "torch-local"}
    assert rules.limits.max_concurrent_jobs == 4


def test_a_rule_version_changes_only_when_its_text_does():
    first = parse_files([Source("f.yaml", GOOD)])
    same = parse_files([Source("g.yaml", GOOD + "\n# a comment\n")])
    changed = parse_files([Source("f.yaml", GOOD.replace("dataset: d", "dataset: e"))])
    assert first.rules[0].version == same.rules[0].version
    assert first.rules[0].version != changed.rules[0].version


def test_rule_errors_are_a_config_error():
    with pytest.raises(ConfigError):
        parse_files([Source("f.yaml", "rules: 3\n")])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rules: [\n", "f.yaml:2:1: bad YAML"),
        (
            GOOD.replace("    key:", "    kee:"),
            "f.yaml:4:5: unknown key 'kee' in a rule (did you mean 'key'?)",
        ),
        (
            GOOD.replace("event.data.model_id", "event.data.model_id +"),
            "f.yaml:4:31: key: CEL syntax error",
        ),
        (
            GOOD.replace("event.data.model_id", "evnt.data.model_id"),
            "f.yaml:4:10: key: unknown variable 'evnt'",
        ),
        (
            GOOD.replace("    key: event.data.model_id", "    key: event.source + 1"),
            "f.yaml:4:10: key: CEL type error",
        ),
        (
            GOOD.replace("    key: event.data.model_id", "    window: 6 hours"),
            "f.yaml:4:13: window: bad duration '6 hours'",
        ),
        (
            GOOD + GOOD.replace("rules:\n", ""),
            "f.yaml:6:5: duplicate rule name 'r' (first defined at f.yaml:2:5)",
        ),
        (
            GOOD.replace("drift.detected", "drift.detectd"),
            "f.yaml:3:16: unknown event type 'io.tuneloop.drift.detectd.v1' "
            "(did you mean 'io.tuneloop.drift.detected.v1'?)",
        ),
        (
            "runtimes: [a]\n" + GOOD.replace("runtime: rt", "runtime: \"${ 'b' }\""),
            "f.yaml:6:23: runtime 'b' is outside the allowlist (a)",
        ),
        (
            "runtimes: [a]\n" + GOOD,
            "f.yaml:6:23: runtime 'rt' is outside this file's allowlist (a)",
        ),
        (
            GOOD.replace("runtime: rt", 'runtime: "${ event.data.rt }"'),
            "f.yaml:5:23: a templated runtime needs an allowlist",
        ),
        (
            GOOD.replace(
                "    launch",
                "    join: [{type: io.tuneloop.data.arrived.v1, within: 0s}]\n    launch",
            ),
            "f.yaml:5:56: this join can never match: `within` is 0s",
        ),
        (
            GOOD.replace(
                "    launch", "    join: [{type: io.tuneloop.drift.detected.v1}]\n    launch"
            ),
            "f.yaml:5:19: this join can never add a condition",
        ),
        (
            GOOD.replace(
                "    launch",
                "    join: [{type: io.tuneloop.data.arrived.v1, key: \"'x'\"}]\n    launch",
            ),
            "f.yaml:5:53: this join can never match: its key",
        ),
        (
            GOOD.replace("    key: event.data.model_id", "    on2: 1"),
            "f.yaml:4:5: unknown key 'on2' in a rule (did you mean 'on'?)",
        ),
        (GOOD.replace("name: r", "name: Bad_Name"), "f.yaml:2:11: bad rule name 'Bad_Name'"),
        (
            GOOD.replace("    key: event.data.model_id", "    concurrency: forbidd"),
            "f.yaml:4:18: concurrency must be one of forbid, queue, replace, got 'forbidd' "
            "(did you mean 'forbid'?)",
        ),
        (
            GOOD.replace("dataset: d}", "dataset: d, lora: {r: two}}"),
            "f.yaml:5:64: lora.r must be a whole number",
        ),
        (
            GOOD.replace("on: {type", 'on: {where: "event.source", type'),
            "f.yaml:3:17: where must be a boolean",
        ),
    ],
    ids=[
        "bad-yaml",
        "unknown-key",
        "cel-syntax",
        "cel-unknown-variable",
        "cel-type",
        "bad-duration",
        "duplicate-name",
        "unknown-event-type",
        "templated-runtime-outside-allowlist",
        "literal-runtime-outside-allowlist",
        "templated-runtime-without-allowlist",
        "join-within-zero",
        "join-on-own-type",
        "join-constant-key",
        "on-is-a-key-not-a-boolean",
        "bad-rule-name",
        "bad-enum",
        "bad-lora-type",
        "where-not-boolean",
    ],
)
def test_problems_are_reported_with_file_line_and_column(text, expected):
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


def test_every_problem_is_reported_not_just_the_first():
    text = GOOD.replace("    key: event.data.model_id", "    kee: 1\n    window: soon")
    assert len(problems(text)) == 2


def test_yaml_1_1_surprises_are_avoided():
    rules = parse_files(
        [
            Source(
                "f.yaml",
                GOOD.replace("dataset: d}", "dataset: d, training: {learning_rate: 2e-4}}"),
            )
        ]
    )
    assert rules.rules[0].launch.training["learning_rate"].literal == 2e-4


def test_defaults_apply_to_every_rule_and_rules_override_them():
    text = (
        "defaults:\n  cooldown: 1h\n  launch: {base_model: base}\n"
        + GOOD.replace("base_model: m, ", "")
        + GOOD.replace("rules:\n", "")
        .replace("name: r", "name: s")
        .replace("    key:", "    cooldown: 2h\n    key:")
    )
    rules = parse_files([Source("f.yaml", text)])
    assert rules.rule("r").cooldown == timedelta(hours=1)
    assert rules.rule("s").cooldown == timedelta(hours=2)
    assert rules.rule("r").launch.base_model.literal == "base"


def test_a_directory_loads_every_yaml_file(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yml").write_text(GOOD.replace("name: r", "name: s"))
    assert [r.name for r in loading.load_rules([tmp_path]).rules] == ["r", "s"]


def test_a_missing_path_is_a_problem_not_a_crash(tmp_path):
    with pytest.raises(RuleFileError, match="no such file"):
        loading.load_rules([tmp_path / "nope.yaml"])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("6h", 21600), ("2d", 172800), ("1h30m", 5400)],
)
def test_durations_parse_and_print_back(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert parse_duration(format_duration(timedelta(seconds=seconds))) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "5", "5 m", "m5", "1.5h", None, 3])
def test_bad_durations_are_refused(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_a_data_field_a_typo_away_from_the_schema_is_reported_with_a_suggestion():
    text = GOOD.replace(
        "on: {type: io.tuneloop.drift.detected.v1}",
        'on: {type: io.tuneloop.drift.detected.v1, where: "event.data.treshold > 1"}',
    )
    assert problems(text) == [
        "f.yaml:3:66: where: event.data.treshold is not a field of "
        "io.tuneloop.drift.detected.v1 (did you mean 'threshold'?)"
    ]


def test_extra_data_fields_the_schema_does_not_name_are_allowed():
    text = GOOD.replace(
        "on: {type: io.tuneloop.drift.detected.v1}",
        "on: {type: io.tuneloop.drift.detected.v1, where: \"event.data.team == 'nlp'\"}",
    )
    assert parse_files([Source("f.yaml", text)]).rules[0].on.where is not None

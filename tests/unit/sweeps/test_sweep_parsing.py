"""A rule's `sweep:` block: what it means, its defaults, and the problems `check` reports."""

from __future__ import annotations

import textwrap
from datetime import timedelta

import pytest

from orchestrator.jobs.promotion import Mode
from orchestrator.rules.parsing import RuleFileError, Source, parse_files
from orchestrator.sweeps.spec import (
    Algorithm,
    Choice,
    MedianStopping,
    Objective,
    Parameter,
    Range,
    Scale,
    SweepSpec,
)

RULE = """\
rules:
  - name: r
    on: {{type: io.tuneloop.drift.detected.v1}}
    key: event.data.model_id
{rule}    launch:
      runtime: rt
      base_model: m
      dataset: d
{launch}
"""


def parse(launch: str, rule: str = ""):
    text = RULE.format(launch=textwrap.indent(textwrap.dedent(launch), "      "), rule=rule)
    return parse_files([Source("f.yaml", text)]).rules[0]


def problems(launch: str, rule: str = "") -> list[str]:
    with pytest.raises(RuleFileError) as caught:
        parse(launch, rule)
    return [str(problem) for problem in caught.value.problems]


ISSUE_EXAMPLE = """\
sweep:
  objective: {metric: eval_loss, mode: min, goal: 0.8}
  algorithm: {name: tpe, seed: 7}
  parameters:
    training.learning_rate: {min: 1e-5, max: 1e-3, scale: log}
    lora.r: {values: [8, 16, 32]}
    lora.alpha: {values: [16, 32]}
  parallel: 2
  max_trials: 6
  max_failed: 2
  budget: 2h
  early_stopping: {median: {min_trials: 3, start_step: 20}}
"""


def test_the_issue_s_example_means_what_it_says():
    assert parse(ISSUE_EXAMPLE).launch.sweep == SweepSpec(
        objective=Objective(metric="eval_loss", mode=Mode.MIN, goal=0.8),
        algorithm=Algorithm.TPE,
        seed=7,
        parameters=(
            Parameter("training.learning_rate", Range(1e-5, 1e-3, Scale.LOG)),
            Parameter("lora.r", Choice((8, 16, 32))),
            Parameter("lora.alpha", Choice((16, 32))),
        ),
        parallel=2,
        max_trials=6,
        max_failed=2,
        budget=timedelta(hours=2),
        median=MedianStopping(min_trials=3, start_step=20),
    )


def test_a_rule_without_a_sweep_launches_one_job():
    assert parse("").launch.sweep is None


def test_the_defaults_random_one_at_a_time_eval_loss_down_no_stopping_rule():
    spec = parse(
        """\
        sweep:
          parameters: {lora.dropout: {min: 0.0, max: 0.2}}
          max_trials: 3
        """
    ).launch.sweep
    assert spec == SweepSpec(
        parameters=(Parameter("lora.dropout", Range(0.0, 0.2)),),
        objective=Objective("eval_loss", Mode.MIN, None),
        algorithm=Algorithm.RANDOM,
        seed=0,
        parallel=1,
        max_trials=3,
    )


def test_an_objective_takes_its_metric_s_usual_direction():
    spec = parse(
        """\
        sweep:
          objective: {metric: token_accuracy}
          algorithm: random
          parameters: {training.epochs: {values: [1, 2]}}
          max_trials: 2
        """
    ).launch.sweep
    assert spec.objective == Objective("token_accuracy", Mode.MAX, None)


def test_a_grid_runs_every_point_unless_told_fewer():
    spec = parse(
        """\
        sweep:
          algorithm: grid
          parameters:
            lora.r: {values: [4, 8, 16]}
            training.packing: {values: [true, false]}
            lora.target_modules: {values: [[q_proj], [q_proj, v_proj]]}
        """
    ).launch.sweep
    assert spec.max_trials == 12
    assert spec.parameters[2].domain == Choice((("q_proj",), ("q_proj", "v_proj")))


def test_integer_fields_are_drawn_as_whole_numbers():
    spec = parse(
        """\
        sweep:
          parameters: {lora.r: {min: 4, max: 64, scale: log}}
          max_trials: 2
        """
    ).launch.sweep
    assert spec.parameters[0].domain == Range(4.0, 64.0, Scale.LOG, integer=True)


# (the sweep block on one line, the text the problem points at, the message). The column
# expected is where that text first appears on the line: the test's own reading of its input.
CASES = [
    (
        "not-a-mapping",
        "sweep: 3",
        "3",
        "sweep must be a mapping such as {objective: {metric: eval_loss}, parameters: "
        "{training.learning_rate: {min: 1e-5, max: 1e-3, scale: log}}, max_trials: 4}",
    ),
    (
        "no-parameters",
        "sweep: {max_trials: 2}",
        "{max_trials",
        "sweep needs `parameters` (the launch fields to vary, by path)",
    ),
    (
        "no-max-trials",
        "sweep: {parameters: {lora.r: {values: [8]}}}",
        "{parameters",
        "sweep needs `max_trials` (how many trials to run in all; a grid runs every point "
        "unless told fewer)",
    ),
    (
        "unknown-parameter",
        "sweep: {parameters: {training.lr: {min: 1, max: 2}}, max_trials: 2}",
        "training.lr",
        "unknown parameter 'training.lr': a sweep varies one of lora.r, lora.alpha, "
        "lora.dropout, lora.target_modules, training.learning_rate, training.epochs, "
        "training.max_steps, training.batch_size, training.gradient_accumulation_steps, "
        "training.max_seq_length, training.packing (did you mean 'training.epochs'?)",
    ),
    (
        "image",
        "sweep: {parameters: {image: {values: [a, b]}}, max_trials: 2}",
        "image",
        "a sweep cannot vary image: a launch spec has no image: the runtime fixes it, so no "
        "template can vary it",
    ),
    (
        "command",
        "sweep: {parameters: {command: {values: [a, b]}}, max_trials: 2}",
        "command",
        "a sweep cannot vary command: a launch spec has no command: the runtime fixes it, so "
        "no template can vary it",
    ),
    (
        "runtime",
        "sweep: {parameters: {runtime: {values: [a, b]}}, max_trials: 2}",
        "runtime",
        "a sweep cannot vary runtime: it is fixed for every trial: a sweep varies lora.* and "
        "training.* hyperparameters; the runtime (a ClusterTrainingRuntime) is where trials "
        "run",
    ),
    (
        "resources",
        "sweep: {parameters: {resources.nodes: {values: [1, 2]}}, max_trials: 2}",
        "resources.nodes",
        "a sweep cannot vary resources.nodes: it is fixed for every trial: a sweep varies "
        "lora.* and training.* hyperparameters",
    ),
    (
        "seed-changes-the-split",
        "sweep: {parameters: {training.seed: {values: [1, 2]}}, max_trials: 2}",
        "training.seed",
        "a sweep cannot vary training.seed: it changes the held-out split the objective is "
        "measured on (the trainer draws it with the seed and eval_fraction), so trials would "
        "be scored on different examples",
    ),
    (
        "empty-range",
        "sweep: {parameters: {lora.alpha: {min: 32, max: 16}}, max_trials: 2}",
        "16}",
        "lora.alpha: max (16) must be more than min (32)",
    ),
    (
        "fractional-integer-bound",
        "sweep: {parameters: {lora.r: {min: 2.5, max: 16}}, max_trials: 2}",
        "2.5",
        "lora.r.min must be a whole number (lora.r is one), got 2.5",
    ),
    (
        "bound-outside-the-field",
        "sweep: {parameters: {training.learning_rate: {min: 0, max: 1}}, max_trials: 2}",
        "0, max",
        "training.learning_rate.min: training.learning_rate must be more than 0.0, got 0",
    ),
    (
        "log-scale-from-zero",
        "sweep: {parameters: {lora.dropout: {min: 0, max: 0.5, scale: log}}, max_trials: 2}",
        "0, max",
        "lora.dropout: a log scale needs min > 0, got 0",
    ),
    (
        "unknown-scale",
        "sweep: {parameters: {lora.dropout: {min: 0, max: 0.5, scale: cubic}}, max_trials: 2}",
        "cubic",
        "lora.dropout.scale must be linear or log, got 'cubic'",
    ),
    (
        "flag-as-range",
        "sweep: {parameters: {training.packing: {min: 0, max: 1}}, max_trials: 2}",
        "{min: 0",
        "training.packing takes listed values only: {values: [...]}",
    ),
    (
        "duplicate-value",
        "sweep: {parameters: {lora.r: {values: [8, 8]}}, max_trials: 2}",
        "8]",
        "lora.r.values lists 8 twice",
    ),
    (
        "no-values",
        "sweep: {parameters: {lora.r: {values: []}}, max_trials: 2}",
        "[]",
        "lora.r.values must be a non-empty list",
    ),
    (
        "fewer-trials-than-parallel",
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 2, parallel: 3}",
        "2, parallel",
        "max_trials (2) is less than parallel (3): no more than max_trials trials ever run, "
        "so lower parallel",
    ),
    (
        "bad-budget",
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 2, budget: 2 hours}",
        "2 hours",
        "budget: bad duration '2 hours': use a number and a unit s, m, h, d or w, like 90s, "
        "30m, 6h, 2d or 1h30m",
    ),
    (
        "max-failed-zero",
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 2, max_failed: 0}",
        "0}",
        "sweep max_failed must be a whole number ≥ 1, got 0",
    ),
    (
        "grid-over-a-range",
        "sweep: {parameters: {lora.dropout: {min: 0, max: 0.2}}, max_trials: 2, algorithm: grid}",
        "{min: 0",
        "a grid tries listed values: give lora.dropout `values: [...]`, not min/max (or use "
        "algorithm random or tpe)",
    ),
    (
        "unknown-algorithm",
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 2, algorithm: bayes}",
        "bayes",
        "algorithm must be one of random, grid, tpe, got 'bayes'",
    ),
    (
        "unknown-objective",
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 2, objective: {metric: loss}}",
        "loss}",
        "objective.metric must be one of eval_loss, perplexity, token_accuracy (the scores "
        "the trainer reports at the end of a run), got 'loss' (did you mean 'eval_loss'?)",
    ),
    (
        "typo-in-median",
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 2, "
        "early_stopping: {median: {min_trial: 2}}}",
        "min_trial:",
        "unknown key 'min_trial' in median (did you mean 'min_trials'?)",
    ),
    (
        "unknown-key",
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 2, trials: 3}",
        "trials: 3",
        "unknown key 'trials' in sweep (did you mean 'max_trials'?)",
    ),
]


@pytest.mark.parametrize(
    ("sweep", "at", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_check_names_each_problem_where_it_is(sweep, at, message):
    line = "      " + sweep  # the launch block's indent on line 9 of RULE
    assert problems(sweep) == [f"f.yaml:9:{line.index(at) + 1}: {message}"]


def test_a_sweep_needs_held_out_examples_to_rank_its_trials():
    assert problems(
        """\
        training: {eval_fraction: 0}
        sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 1}
        """
    ) == [
        "f.yaml:10:14: a sweep ranks trials by eval_loss on held-out examples, but "
        "training.eval_fraction 0 holds none out: raise it"
    ]


def test_a_sweep_is_not_replaced_halfway():
    assert problems(
        "sweep: {parameters: {lora.r: {values: [8]}}, max_trials: 1}",
        rule="    concurrency: replace\n",
    ) == [
        "f.yaml:5:18: concurrency replace would cancel a sweep halfway: a rule with a sweep "
        "takes forbid or queue"
    ]


def test_a_spec_survives_its_json_form():
    spec = parse(ISSUE_EXAMPLE).launch.sweep
    assert SweepSpec.from_json(spec.to_json()) == spec
    grid = parse(
        """\
        sweep:
          algorithm: grid
          parameters: {lora.target_modules: {values: [[q_proj], [q_proj, v_proj]]}}
        """
    ).launch.sweep
    assert SweepSpec.from_json(grid.to_json()) == grid

"""The pure suggesters: seeded draws within each domain, and a grid in order."""

from __future__ import annotations

import math

import pytest

from orchestrator.sweeps.spec import Algorithm, Choice, Parameter, Range, Scale, SweepSpec
from orchestrator.sweeps.suggesting import GridSuggester, RandomSuggester, grid_size

SPEC = SweepSpec(
    parameters=(
        Parameter("training.learning_rate", Range(1e-5, 1e-3, Scale.LOG)),
        Parameter("lora.dropout", Range(0.0, 0.2)),
        Parameter("lora.r", Range(4, 64, Scale.LOG, integer=True)),
        Parameter("training.batch_size", Range(2, 5, integer=True)),
        Parameter("lora.alpha", Choice((16, 32))),
    ),
    seed=7,
    max_trials=50,
)


def test_random_draws_depend_on_the_seed_and_the_trial_only():
    suggester = RandomSuggester()
    first = [suggester.suggest(SPEC, (), index) for index in range(50)]
    again = [RandomSuggester().suggest(SPEC, (), index) for index in range(50)]
    assert first == again
    assert len({tuple(sorted(p.items())) for p in first}) == 50
    other_seed = SweepSpec(parameters=SPEC.parameters, seed=8, max_trials=50)
    assert suggester.suggest(other_seed, (), 0) != first[0]


def test_random_draws_stay_within_their_domains():
    for index in range(200):
        drawn = RandomSuggester().suggest(SPEC, (), index)
        assert 1e-5 <= drawn["training.learning_rate"] <= 1e-3
        assert 0.0 <= drawn["lora.dropout"] <= 0.2
        assert isinstance(drawn["lora.r"], int)
        assert 4 <= drawn["lora.r"] <= 64
        assert drawn["training.batch_size"] in (2, 3, 4, 5)
        assert drawn["lora.alpha"] in (16, 32)


def test_a_log_scale_spreads_draws_over_the_decades():
    rates = [RandomSuggester().suggest(SPEC, (), i)["training.learning_rate"] for i in range(400)]
    decades = [sum(1 for r in rates if low <= r < low * 10) for low in (1e-5, 1e-4)]
    # Uniform in log space: about half the draws in each decade (a linear scale puts ~90 %
    # in the upper one).
    assert all(140 <= count <= 260 for count in decades), decades
    assert math.isclose(sum(decades), 400)


def test_a_grid_hands_out_every_point_in_order_then_nothing():
    grid = SweepSpec(
        parameters=(
            Parameter("lora.r", Choice((8, 16))),
            Parameter("lora.alpha", Choice((1, 2, 3))),
        ),
        algorithm=Algorithm.GRID,
        max_trials=6,
    )
    points = [GridSuggester().suggest(grid, (), i) for i in range(7)]
    assert points == [
        {"lora.r": 8, "lora.alpha": 1},
        {"lora.r": 8, "lora.alpha": 2},
        {"lora.r": 8, "lora.alpha": 3},
        {"lora.r": 16, "lora.alpha": 1},
        {"lora.r": 16, "lora.alpha": 2},
        {"lora.r": 16, "lora.alpha": 3},
        None,
    ]
    assert grid_size(grid) == 6


def test_a_grid_over_a_range_is_refused():
    with pytest.raises(ValueError, match=r"a grid needs `values` for lora\.dropout"):
        GridSuggester().suggest(SweepSpec(parameters=(SPEC.parameters[1],)), (), 0)

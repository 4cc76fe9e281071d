"""Choosing each trial's parameters: the `Suggester` port, and the two that need no library.

`machine.py` asks `suggest(spec, trials, index)` each time a trial may start. A suggester is a
pure function of its arguments: the same sweep state gives the same parameters for trial
*index*, which is what lets a sweep replayed after a crash relaunch the same trials (by the
same names) instead of new ones. So a suggester keeps no history of its own; it is handed
every trial so far, finished or not, each time.

- `RandomSuggester`: every parameter drawn from its domain by a generator seeded with the
  sweep's seed and the trial's index (Python's `random.Random` with a text seed is the same
  on every platform and run).
- `GridSuggester`: the cartesian product of the parameters' `values`, in the order written;
  `None` once every point has been handed out.
- TPE lives in `runtimes/sweeps/optuna_tpe.py` (optuna is a library the core does not
  import); the composition root hands it in as the suggester of `Algorithm.TPE`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from orchestrator.sweeps.spec import Algorithm, Choice, Range, Scale, SweepSpec
from orchestrator.sweeps.state import Trial


class Suggester(Protocol):
    """Chooses the parameters of the next trial."""

    def suggest(
        self, spec: SweepSpec, trials: Sequence[Trial], index: int
    ) -> Mapping[str, Any] | None:
        """The parameters (path → value) of trial *index*, given every trial so far; None
        when there is nothing left to try. The same arguments always give the same answer."""
        ...


class RandomSuggester:
    """Independent seeded draws (see the module docstring)."""

    def suggest(
        self, spec: SweepSpec, trials: Sequence[Trial], index: int
    ) -> Mapping[str, Any] | None:
        # Seeded per sweep and trial: reproducible, not a secret.
        rng = random.Random(f"tuneloop-sweep/{spec.seed}/{index}")  # noqa: S311
        return {p.path: draw(p.domain, rng) for p in spec.parameters}


class GridSuggester:
    """Every combination of the parameters' values, in order (see the module docstring)."""

    def suggest(
        self, spec: SweepSpec, trials: Sequence[Trial], index: int
    ) -> Mapping[str, Any] | None:
        axes = []
        for parameter in spec.parameters:
            if not isinstance(parameter.domain, Choice):
                raise ValueError(f"a grid needs `values` for {parameter.path}, not a range")
            axes.append(parameter.domain.values)
        point = next(itertools.islice(itertools.product(*axes), index, None), None)
        if point is None:
            return None
        return dict(zip((p.path for p in spec.parameters), point, strict=True))


def grid_size(spec: SweepSpec) -> int:
    """How many points a grid over *spec*'s parameters has (each must have `values`)."""
    return math.prod(len(p.domain.values) for p in spec.parameters if isinstance(p.domain, Choice))


def draw(domain: Range | Choice, rng: random.Random) -> Any:
    """One value of *domain*, drawn with *rng*."""
    if isinstance(domain, Choice):
        return domain.values[rng.randrange(len(domain.values))]
    if domain.integer:
        low, high = math.ceil(domain.low), math.floor(domain.high)
        if domain.scale is Scale.LOG:
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
            return min(high, max(low, round(value)))
        return rng.randint(low, high)
    if domain.scale is Scale.LOG:
        return math.exp(rng.uniform(math.log(domain.low), math.log(domain.high)))
    return rng.uniform(domain.low, domain.high)


Suggesters = Mapping[Algorithm, Suggester]

PURE: Suggesters = MappingProxyType(
    {Algorithm.RANDOM: RandomSuggester(), Algorithm.GRID: GridSuggester()}
)
"""The suggesters that need no library; the composition root adds `Algorithm.TPE`."""

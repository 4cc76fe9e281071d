"""The launch fields a sweep may vary, and a trial's job from the sweep's base job.

A parameter's path names a field of the launch spec: `lora.<field>` or `training.<field>`
(`orchestrator/jobs/model.py`). `orchestrator/rules/sweep_parsing.py` checks paths against
`FIELDS` and explains every path it refuses (`REFUSED`); `machine.py` calls `apply` to make
each trial's request. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from orchestrator.jobs.model import TrainingRequest


class Kind(enum.Enum):
    """What values a field takes, which decides the domains it may have."""

    INTEGER = "integer"
    """Whole numbers: `values`, or `min`/`max` drawn as whole numbers."""
    NUMBER = "number"
    """Numbers: `values`, or `min`/`max` on a linear or log scale."""
    FLAG = "flag"
    """true or false: `values` only."""
    NAMES = "names"
    """A list of module names: `values` only (each value a list)."""


FIELDS: Mapping[str, Kind] = MappingProxyType(
    {
        "lora.r": Kind.INTEGER,
        "lora.alpha": Kind.INTEGER,
        "lora.dropout": Kind.NUMBER,
        "lora.target_modules": Kind.NAMES,
        "training.learning_rate": Kind.NUMBER,
        "training.epochs": Kind.NUMBER,
        "training.max_steps": Kind.INTEGER,
        "training.batch_size": Kind.INTEGER,
        "training.gradient_accumulation_steps": Kind.INTEGER,
        "training.max_seq_length": Kind.INTEGER,
        "training.packing": Kind.FLAG,
    }
)
"""Every field a sweep may vary, by path."""

_SPLIT = (
    "it changes the held-out split the objective is measured on (the trainer draws it with the "
    "seed and eval_fraction), so trials would be scored on different examples"
)
_NOT_A_HYPERPARAMETER = (
    "it is fixed for every trial: a sweep varies lora.* and training.* hyperparameters"
)
REFUSED: Mapping[str, str] = MappingProxyType(
    {
        "training.seed": _SPLIT,
        "training.eval_fraction": _SPLIT,
        "runtime": _NOT_A_HYPERPARAMETER
        + "; the runtime (a ClusterTrainingRuntime) is where trials run",
        "image": "a launch spec has no image: the runtime fixes it, so no template can vary it",
        "command": "a launch spec has no command: the runtime fixes it, so no template can vary it",
        "base_model": _NOT_A_HYPERPARAMETER,
        "dataset": _NOT_A_HYPERPARAMETER,
        "output_uri": _NOT_A_HYPERPARAMETER,
        "deadline": _NOT_A_HYPERPARAMETER,
        "promote": _NOT_A_HYPERPARAMETER,
        "resources": _NOT_A_HYPERPARAMETER,
    }
)
"""Paths a sweep may not vary, with why; `resources.*` is refused by its section."""


def refusal(path: str) -> str | None:
    """Why *path* cannot be swept (None: it is not one of the refused paths)."""
    if path in REFUSED:
        return REFUSED[path]
    section = path.split(".", 1)[0]
    return REFUSED.get(section) if section == "resources" else None


def apply(base: TrainingRequest, parameters: Mapping[str, Any], *, name: str) -> TrainingRequest:
    """The job of one trial: *base* with each of *parameters* set, named *name*.

    Raises:
        KeyError: a path is not in `FIELDS` (the parser refuses such a sweep).
    """
    lora: dict[str, Any] = {}
    training: dict[str, Any] = {}
    for path, value in parameters.items():
        kind = FIELDS[path]
        section, field = path.split(".", 1)
        (lora if section == "lora" else training)[field] = _typed(kind, value)
    return replace(
        base,
        name=name,
        lora=replace(base.lora, **lora),
        training=replace(base.training, **training),
    )


def _typed(kind: Kind, value: Any) -> Any:
    if kind is Kind.INTEGER:
        return int(value)
    if kind is Kind.NUMBER:
        return float(value)
    if kind is Kind.NAMES:
        return tuple(value)
    return bool(value)

"""`${ CEL }` interpolation in launch specs, and the type checks on what it produces.

`parsing.py` turns each launch value into a `Template`; `rendering.py` renders the launch spec
of a firing rule with `Template.render` and `check_value`, which give plain, type-checked
values for `TrainingRequest`. Templates produce data only: the launch spec has no field that
names an image or a command, and a rendered `runtime` must be in the rule file's allowlist.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from orchestrator.rules.expressions import Activation, EvaluationError, Expression


class TemplateError(ValueError):
    """A template cannot be rendered into a valid value (evaluation failed or wrong type)."""


@dataclass(frozen=True, slots=True)
class Template:
    """A launch value: a literal, one `${ expr }` (keeps the expression's type), or text
    with `${ }` parts (always a string)."""

    parts: tuple[str | Expression, ...]
    literal: Any = None

    @property
    def is_literal(self) -> bool:
        return not any(isinstance(part, Expression) for part in self.parts)

    def render(self, activation: Activation) -> Any:
        if self.is_literal:
            return self.literal
        try:
            if len(self.parts) == 1 and isinstance(self.parts[0], Expression):
                return self.parts[0].evaluate(activation)
            return "".join(
                part if isinstance(part, str) else _as_text(part.evaluate(activation))
                for part in self.parts
            )
        except EvaluationError as exc:
            raise TemplateError(str(exc)) from exc


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def split_template(text: str) -> tuple[tuple[int, int, int], ...]:
    """Split *text* into `(kind, start, end)` spans: kind 0 is literal text, kind 1 the
    source of a `${ }` expression (without the braces).

    Raises:
        TemplateError: an unclosed `${`.
    """
    spans: list[tuple[int, int, int]] = []
    position = 0
    while True:
        start = text.find("${", position)
        if start < 0:
            if position < len(text):
                spans.append((0, position, len(text)))
            break
        if start > position:
            spans.append((0, position, start))
        end = _closing_brace(text, start + 2)
        spans.append((1, start + 2, end))
        position = end + 1
    return tuple(spans)


def _closing_brace(text: str, index: int) -> int:
    depth = 0
    quote: str | None = None
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return index
            depth -= 1
        index += 1
    raise TemplateError("unclosed '${': add the closing '}'")


# What each launch field accepts. A checker returns the value to use or raises TemplateError.
Checker = Callable[[str, Any], Any]


def _integer(minimum: int) -> Checker:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise TemplateError(f"{name} must be a whole number, got {value!r}")
        if value < minimum:
            raise TemplateError(f"{name} must be at least {minimum}, got {value!r}")
        return int(value)

    return check


def _number(*, above: float | None = None, below: float | None = None) -> Checker:
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TemplateError(f"{name} must be a number, got {value!r}")
        if above is not None and not value > above:
            raise TemplateError(f"{name} must be more than {above}, got {value!r}")
        if below is not None and not value < below:
            raise TemplateError(f"{name} must be less than {below}, got {value!r}")
        return float(value)

    return check


def _optional(inner: Checker) -> Checker:
    def check(name: str, value: Any) -> Any:
        return None if value is None else inner(name, value)

    return check


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TemplateError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TemplateError(f"{name} must be true or false, got {value!r}")
    return value


def _names(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise TemplateError(f"{name} must be a list of module names, got {value!r}")
    return tuple(value)


LORA_FIELDS: Mapping[str, Checker] = {
    "r": _integer(1),
    "alpha": _integer(1),
    "dropout": _number(above=-1e-12, below=1.0),
    "target_modules": _optional(_names),
}
TRAINING_FIELDS: Mapping[str, Checker] = {
    "epochs": _number(above=0.0),
    "learning_rate": _number(above=0.0),
    "max_steps": _optional(_integer(1)),
    "batch_size": _integer(1),
    "gradient_accumulation_steps": _integer(1),
    "max_seq_length": _integer(8),
    "seed": _integer(0),
    "eval_fraction": _number(above=-1e-12, below=1.0),
    "packing": _flag,
}
RESOURCE_FIELDS: Mapping[str, Checker] = {
    "nodes": _integer(1),
    "gpus_per_node": _integer(0),
    "cpu": _optional(_text),
    "memory": _optional(_text),
}


def _location(name: str, value: Any) -> str:
    # A rule like `dataset: "file:///data/${ key }.jsonl"` confines the producer's text to a
    # directory; a `..` segment (plain or percent-encoded) would walk out of it.
    text = _text(name, value)
    if ".." in unquote(text).replace("\\", "/").split("/"):
        raise TemplateError(f"{name} must not contain a '..' path segment, got {text[:200]!r}")
    return text


TEXT_FIELDS: Mapping[str, Checker] = {
    "runtime": _text,
    "base_model": _text,
    "dataset": _location,
    "output_uri": _optional(_location),
}


def check_value(section: str, name: str, value: Any) -> Any:
    """Type-check one rendered launch value; *section* is `lora`, `training`, `resources` or
    `` for the top-level text fields."""
    table = {
        "lora": LORA_FIELDS,
        "training": TRAINING_FIELDS,
        "resources": RESOURCE_FIELDS,
        "": TEXT_FIELDS,
    }[section]
    label = f"{section}.{name}" if section else name
    return table[name](label, value)

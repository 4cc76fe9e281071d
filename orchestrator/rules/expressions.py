"""CEL expressions of rule files: compiled once at load, evaluated against one context per event.

`parsing.py` compiles every `where`, `key`, `sum.of`, join key and `${ }` template through
`compile_expression`, which also does the static checks `tuneloop check` reports (syntax,
unknown variables, obvious type errors). `matching.py` builds one `Activation` per event and
evaluates the `where`, key and `sum.of` of every relevant rule against it; `rendering.py`
builds one per launch for its templates.

Expressions in the simple subset (paths, literals, comparisons, `&&`, `||`, `!`) are
evaluated in Python by `fastpath.py` with CEL's semantics; the CEL context, which costs far
more to build than evaluating such an expression (see docs/performance.md), is built only when
some expression needs CEL, and holds only the parts of `event.data` that some expression of
the rule set reads.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orchestrator.events import CloudEvent
from orchestrator.rules.fastpath import Evaluator, FastPathError, NeedsCel, compile_simple


def _cel_without_its_shell() -> types.ModuleType:
    """The `cel` package, imported without `cel.cli`, its interactive shell.

    `cel/__init__.py` (common-expression-language 0.10) imports the shell before its bindings,
    and the shell imports typer, prompt_toolkit, pygments and rich: 60-200 ms of every
    worker's and command's start, for a module tuneloop never uses. A placeholder stands in
    for `cel.cli` while the package is imported and is dropped afterwards, so an explicit
    `import cel.cli` (or `python -m cel`) still loads the real shell.
    """
    if "cel" in sys.modules:
        return sys.modules["cel"]
    placeholder = types.ModuleType("cel.cli")
    sys.modules["cel.cli"] = placeholder
    try:
        import cel
    finally:
        if sys.modules.get("cel.cli") is placeholder:
            del sys.modules["cel.cli"]
    return cel


if TYPE_CHECKING:
    import cel
else:
    cel = _cel_without_its_shell()

EVENT_ATTRIBUTES = ("id", "source", "type", "specversion", "subject", "time", "data")
_MACRO_BINDING = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")
_DATA_FIELD = re.compile(r"\bevent\.data\.([A-Za-z_]\w*)")
_SYNTAX_POSITION = re.compile(r"<input>:(\d+):(\d+):\s*(.*)")


class ExpressionError(ValueError):
    """An expression does not compile or fails a static check.

    `line` and `column` are 1-based positions inside the expression text (None when the
    problem is the expression as a whole), so the parser can point into the rule file.
    """

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


class EvaluationError(ValueError):
    """An expression failed on one event (missing field, wrong type): the decision says so."""


@dataclass(frozen=True, slots=True)
class Expression:
    """One compiled CEL expression and what it reads."""

    source: str
    program: Any = field(repr=False, compare=False)
    variables: frozenset[str] = frozenset()
    data_fields: frozenset[str] | None = frozenset()
    """Top-level `event.data` fields it reads; None when it reads `event.data` as a whole."""
    fast: Evaluator | None = field(default=None, repr=False, compare=False)
    """Set when the expression is in the simple subset `fastpath` evaluates in Python."""

    def evaluate(self, activation: Activation) -> Any:
        """The value of the expression for *activation*.

        Raises:
            EvaluationError: a field is missing or an operation does not apply to the types.
        """
        if self.fast is not None:
            try:
                return self.fast(activation.variables)
            except FastPathError as exc:
                raise EvaluationError(f"{self.source}: {exc}") from exc
            except NeedsCel:
                pass
        try:
            return self.program.execute(activation.context())
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise EvaluationError(f"{self.source}: {_describe(exc)}") from exc


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"no such field {exc.args[0]!r}" if exc.args else "no such field"
    text = str(exc)
    return text.split(". CEL does not coerce", 1)[0]


class Activation:
    """The variables one evaluation sees, converted to CEL once and reused by every rule.

    *data_fields* are the top-level `event.data` fields that some expression reads (None: all
    may be read). Only the CEL conversion, which costs per field, uses it: the fast path reads
    the fields it needs and is not slowed down by the others.
    """

    __slots__ = ("_context", "_data_fields", "variables")

    def __init__(
        self, variables: Mapping[str, Any], *, data_fields: frozenset[str] | None = None
    ) -> None:
        self.variables = variables
        self._data_fields = data_fields
        self._context: Any = None

    def context(self) -> Any:
        if self._context is None:
            variables = dict(self.variables)
            event = variables.get("event")
            if self._data_fields is not None and isinstance(event, Mapping):
                data = event.get("data")
                if isinstance(data, Mapping):
                    narrowed = {name: data[name] for name in self._data_fields if name in data}
                    variables["event"] = {**event, "data": narrowed}
            self._context = cel.Context(variables)
        return self._context


def event_variables(
    event: CloudEvent, *, time: datetime, data_fields: frozenset[str] | None
) -> dict[str, Any]:
    """`event` as rule expressions see it: attributes, extensions, and (the read part of) data.

    *data_fields* narrows `data` to the fields some expression reads (None keeps all of it).
    """
    data = event.data
    if data_fields is not None and isinstance(data, Mapping):
        data = {name: data[name] for name in data_fields if name in data}
    attributes = {
        "id": event.id,
        "source": event.source,
        "type": event.type,
        "specversion": event.specversion,
        "subject": event.subject if event.subject is not None else "",
        "time": time,
        "data": data if data is not None else {},
    }
    # Attributes win over extensions of the same name.
    return {**event.extensions, **attributes} if event.extensions else attributes


def compile_expression(source: str, *, allowed: frozenset[str]) -> Expression:
    """Compile *source*, refusing syntax errors and variables outside *allowed*.

    Raises:
        ExpressionError: with the position inside *source* when CEL gives one.
    """
    if not isinstance(source, str) or not source.strip():
        raise ExpressionError("expression is empty")
    try:
        program = cel.compile(source)
    except (ValueError, RuntimeError) as exc:
        text = str(exc)
        found = _SYNTAX_POSITION.search(text)
        if found:
            message = found.group(3).split("\n")[0].strip()
            raise ExpressionError(
                f"CEL syntax error: {message}", line=int(found.group(1)), column=int(found.group(2))
            ) from exc
        raise ExpressionError(f"CEL syntax error: {text.splitlines()[0]}") from exc
    bound = set(_MACRO_BINDING.findall(source))
    variables = frozenset(program.variables()) - bound
    unknown = sorted(variables - allowed)
    if unknown:
        known = ", ".join(sorted(allowed))
        raise ExpressionError(f"unknown variable {unknown[0]!r} in {source!r} (known: {known})")
    return Expression(
        source=source,
        program=program,
        variables=variables,
        data_fields=_data_fields(source),
        fast=compile_simple(source),
    )


def _data_fields(source: str) -> frozenset[str] | None:
    # Any mention of `event.data` not followed by `.field` (e.g. `has(event.data.x)` is fine,
    # but `event.data` alone or `event.data["x"]`) means the whole payload is needed.
    fields = _DATA_FIELD.findall(source)
    mentions = len(re.findall(r"\bevent\.data\b", source))
    if mentions != len(fields):
        return None
    return frozenset(fields)


def probe(expression: Expression, variables: Mapping[str, Any]) -> Any:
    """Evaluate *expression* on placeholder variables to find type errors at load time.

    Returns the value, or None when the expression needs real data to decide (a missing
    field is expected on placeholders; a type error on attributes alone is not).

    Raises:
        ExpressionError: the expression cannot work whatever the event.
    """
    try:
        return expression.program.execute(cel.Context(dict(variables)))
    except KeyError:
        return None
    except (TypeError, ValueError, RuntimeError) as exc:
        if expression.data_fields is None or expression.data_fields:
            return None
        raise ExpressionError(f"CEL type error in {expression.source!r}: {_describe(exc)}") from exc


def placeholder_event() -> dict[str, Any]:
    """An event with every attribute present and empty data, for `probe`."""
    return {
        "id": "placeholder",
        "source": "/placeholder",
        "type": "placeholder",
        "specversion": "1.0",
        "subject": "",
        "time": datetime(2000, 1, 1, tzinfo=UTC),
        "data": {},
    }

"""A Python evaluator for the common, simple subset of CEL, with CEL's semantics.

Most rule expressions are field paths, literals, comparisons and `&&`/`||`/`!`.
`expressions.compile_expression` compiles those with `compile_simple` into closures over plain
Python values and leaves everything else (functions, arithmetic, macros, lists, maps) to the
`common-expression-language` package, whose per-event context is what this saves building (see
docs/performance.md). `tests/unit/rules/test_fastpath.py` checks, with hypothesis, that both
give the same value or both fail.

CEL semantics kept: a missing field is an error; `&&` and `||` absorb an error on either side
when the other side decides; comparing values of different kinds is an error for `<`, `<=`,
`>`, `>=` and `false` for `==`; numbers compare across int and double; booleans are not numbers.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

Evaluator = Callable[[Mapping[str, Any]], Any]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\.\d+(?:[eE][-+]?\d+)?|\d+)
      | (?P<string>"(?:[^"\\\n]|\\["\\'])*"|'(?:[^'\\\n]|\\["\\'])*')
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>&&|\|\||==|!=|<=|>=|[<>!().\[\]-])
    )""",
    re.VERBOSE,
)


class FastPathError(Exception):
    """Raised at evaluation, with CEL's meaning: no such field, or no such overload."""


class NeedsCel(Exception):  # noqa: N818 - a signal to the caller, not an error
    """This evaluation met values outside the subset (lists or maps compared): use CEL."""


class _UnsupportedError(Exception):
    """The expression uses something outside the subset: let CEL evaluate it."""


def _tokens(source: str) -> list[tuple[str, str]]:
    tokens = []
    position = 0
    while position < len(source):
        if source[position:].strip() == "":
            break
        found = _TOKEN.match(source, position)
        if not found or found.end() == position:
            raise _UnsupportedError(source[position:])
        kind = found.lastgroup
        assert kind is not None
        tokens.append((kind, found.group(kind)))
        position = found.end()
    return tokens


def compile_simple(source: str) -> Evaluator | None:
    """A Python evaluator for *source*, or None when it is outside the subset."""
    try:
        parser = _Parser(_tokens(source))
        evaluator = parser.expression()
        if parser.position != len(parser.tokens):
            return None
        return evaluator
    except _UnsupportedError:
        return None


class _Parser:
    """Precedence climbing over the subset: || < && < comparisons < unary < selection."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.position = 0

    def peek(self) -> str | None:
        return self.tokens[self.position][1] if self.position < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.position >= len(self.tokens):
            raise _UnsupportedError("unexpected end")
        token = self.tokens[self.position]
        self.position += 1
        return token

    def expression(self) -> Evaluator:
        left = self.conjunction()
        while self.peek() == "||":
            self.take()
            left = _or(left, self.conjunction())
        return left

    def conjunction(self) -> Evaluator:
        left = self.comparison()
        while self.peek() == "&&":
            self.take()
            left = _and(left, self.comparison())
        return left

    def comparison(self) -> Evaluator:
        left = self.unary()
        operator = self.peek()
        if operator is not None and operator in _COMPARE:
            self.take()
            right = self.unary()
            if self.peek() in _COMPARE:
                raise _UnsupportedError("chained comparison")
            return _COMPARE[operator](left, right)
        return left

    def unary(self) -> Evaluator:
        if self.peek() == "!":
            self.take()
            return _not(self.unary())
        if self.peek() == "-":
            self.take()
            kind, text = self.take()
            if kind != "number":
                raise _UnsupportedError("unary minus on a non-literal")
            return self.selection(_Literal(-_number(text)))
        return self.selection(self.primary())

    def primary(self) -> Evaluator:
        kind, text = self.take()
        if kind == "number":
            return _Literal(_number(text))
        if kind == "string":
            return _Literal(_string(text))
        if kind == "name":
            if text in ("true", "false", "null"):
                return _Literal({"true": True, "false": False, "null": None}[text])
            if self.peek() == "(":
                raise _UnsupportedError("function call")
            return _variable(text)
        if text == "(":
            inner = self.expression()
            if self.take()[1] != ")":
                raise _UnsupportedError("unbalanced parenthesis")
            return inner
        raise _UnsupportedError(text)

    def selection(self, target: Evaluator) -> Evaluator:
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                kind, name = self.take()
                if kind != "name" or self.peek() == "(":
                    raise _UnsupportedError("method call")
                target = _select(target, name)
            else:
                kind, text = self.take()
                if kind != "string" or self.take()[1] != "]":
                    raise _UnsupportedError("non-string index")
                target = _select(target, _string(text))
        return target


def _number(text: str) -> int | float:
    if text.isdigit():
        return int(text)
    return float(text)


def _string(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\([\"\\'])", r"\1", body)


def _field(container: Any, name: str) -> Any:
    """`container.name` as CEL selects it: a map's entry, or the error CEL gives."""
    if not isinstance(container, Mapping):
        raise FastPathError(f"no such field {name!r}")
    try:
        return container[name]
    except KeyError:
        raise FastPathError(f"no such field {name!r}") from None


class _Path:
    """`a.b['c'].d`: a variable and the fields selected from it, walked one field at a time."""

    __slots__ = ("names",)

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def __call__(self, variables: Mapping[str, Any]) -> Any:
        first, *rest = self.names
        if first not in variables:
            raise FastPathError(f"undeclared reference to {first!r}")
        value = variables[first]
        for name in rest:
            value = _field(value, name)
        return value


class _Literal:
    """A constant."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, variables: Mapping[str, Any]) -> Any:
        return self.value


def _variable(name: str) -> Evaluator:
    return _Path((name,))


def _select(target: Evaluator, name: str) -> Evaluator:
    if isinstance(target, _Path):
        return _Path((*target.names, name))
    return lambda variables: _field(target(variables), name)


def _kind(value: Any) -> str:  # noqa: PLR0911 - one return per CEL kind
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, datetime):
        return "timestamp"
    if value is None:
        return "null"
    if isinstance(value, bytes):
        return "bytes"
    return "other"


def _equal(left: Any, right: Any) -> bool:
    kind = _kind(left)
    if kind != _kind(right):
        return False
    if kind == "other":
        raise NeedsCel  # lists and maps compare element-wise with CEL's own rules
    return bool(left == right)


def _ordered(operator: Callable[[Any, Any], bool]) -> Callable[[Evaluator, Evaluator], Evaluator]:
    def compare(a: Any, b: Any) -> bool:
        kind = _kind(a)
        if kind != _kind(b) or kind in ("null", "other"):
            raise FastPathError("no such overload")
        return operator(a, b)

    def build(left: Evaluator, right: Evaluator) -> Evaluator:
        return lambda variables: compare(left(variables), right(variables))

    return build


def _eq(left: Evaluator, right: Evaluator) -> Evaluator:
    return lambda variables: _equal(left(variables), right(variables))


def _ne(left: Evaluator, right: Evaluator) -> Evaluator:
    return lambda variables: not _equal(left(variables), right(variables))


_COMPARE: Mapping[str, Callable[[Evaluator, Evaluator], Evaluator]] = {
    "==": _eq,
    "!=": _ne,
    "<": _ordered(operator.lt),
    "<=": _ordered(operator.le),
    ">": _ordered(operator.gt),
    ">=": _ordered(operator.ge),
}


def _boolean(evaluator: Evaluator, variables: Mapping[str, Any]) -> bool | FastPathError:
    """The operand's value, or the error it raised (CEL's logic operators absorb errors)."""
    try:
        value = evaluator(variables)
    except FastPathError as exc:
        return exc
    if not isinstance(value, bool):
        return FastPathError("no such overload")
    return value


def _and(left: Evaluator, right: Evaluator) -> Evaluator:
    def value(variables: Mapping[str, Any]) -> bool:
        a = _boolean(left, variables)
        if a is False:
            return False
        b = _boolean(right, variables)
        if b is False:
            return False
        if isinstance(a, FastPathError):
            raise a
        if isinstance(b, FastPathError):
            raise b
        return True

    return value


def _or(left: Evaluator, right: Evaluator) -> Evaluator:
    def value(variables: Mapping[str, Any]) -> bool:
        a = _boolean(left, variables)
        if a is True:
            return True
        b = _boolean(right, variables)
        if b is True:
            return True
        if isinstance(a, FastPathError):
            raise a
        if isinstance(b, FastPathError):
            raise b
        return False

    return value


def _not(operand: Evaluator) -> Evaluator:
    def value(variables: Mapping[str, Any]) -> bool:
        result = operand(variables)
        if not isinstance(result, bool):
            raise FastPathError("no such overload")
        return not result

    return value

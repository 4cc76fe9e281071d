"""A quick "certainly valid" for `SchemaRegistry.validate`: a JSON Schema turned into closures.

The intake validates the data of every event. jsonschema walks a schema with generic
machinery (a new validator object per property it descends into, type-checker lookups), which
made it most of the intake's CPU time per record (`make bench`, docs/performance.md). The
built-in schemas use a few keywords only; a closure per keyword does the same tests far faster.

The compiled check answers only "valid for certain" (True) or "not sure" (False). On False
the registry asks jsonschema, which decides and writes the message. So a check may be
stricter than jsonschema (a float `3.0` for `"integer"`, a NaN against `"minimum"` take the
slow way) but must never accept what jsonschema refuses; the tests hold it to that. A schema
with a keyword not handled here, or of another draft, gets no check and always goes through
jsonschema; keywords jsonschema does not know (`description`, `x-...`) are ignored by both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from numbers import Number
from typing import Any

ProvesValid = Callable[[Any], bool]
"""True: the instance is valid for certain; False: ask jsonschema."""

FormatCheck = Callable[[str], bool]
"""Whether a string has a format (e.g. `date-time`); the registry's own rule."""


class _UnsupportedError(Exception):
    """The schema uses a keyword (or form of one) that only jsonschema handles."""


def compile_schema(
    schema: Mapping[str, Any] | bool,
    *,
    known_keywords: Collection[str],
    formats: Mapping[str, FormatCheck],
    checked_formats: Collection[str],
) -> ProvesValid | None:
    """A quick check for *schema*, or None when only jsonschema can judge it.

    Args:
        schema: a schema that passed the validator's `check_schema`.
        known_keywords: the keywords the jsonschema validator class acts on (its
            `VALIDATORS`); any other member is an annotation to both.
        formats: the formats checked here, by name.
        checked_formats: every format the jsonschema format checker knows; a format in it
            but not in *formats* makes the schema uncompilable, one in neither is ignored
            (as jsonschema ignores formats its checker does not know).
    """
    try:
        return _Compiler(known_keywords, formats, checked_formats).compile(schema)
    except _UnsupportedError:
        return None


_TYPES: Mapping[str, ProvesValid] = {
    "string": lambda value: isinstance(value, str),
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    # bool is an int to Python but not to JSON Schema. Only int and float count here; other
    # numbers (Decimal, an integral float for "integer") are jsonschema's to judge.
    "integer": lambda value: type(value) is int,
    "number": lambda value: type(value) is int or type(value) is float,
}


_PLAIN_NUMBERS = (int, float)
"""The number types compared here (exact types: bool is not one)."""


def _not_a_number(value: object) -> bool:
    # jsonschema's number keywords (minimum, ...) skip what is not a JSON number; other
    # Number types (Decimal, Fraction) are left to it.
    return isinstance(value, bool) or not isinstance(value, Number)


class _Compiler:
    def __init__(
        self,
        known_keywords: Collection[str],
        formats: Mapping[str, FormatCheck],
        checked_formats: Collection[str],
    ) -> None:
        self.known_keywords = frozenset(known_keywords)
        self.formats = formats
        self.checked_formats = frozenset(checked_formats)

    def compile(self, schema: Mapping[str, Any] | bool) -> ProvesValid:
        if schema is True:
            return lambda value: True
        if schema is False or not isinstance(schema, Mapping):
            raise _UnsupportedError()
        checks: list[ProvesValid] = []
        for keyword, argument in schema.items():
            if keyword not in self.known_keywords:
                continue  # an annotation, e.g. description, examples, $id
            checks.append(self.keyword(keyword, argument, schema))
        if not checks:
            return lambda value: True
        if len(checks) == 1:
            return checks[0]
        every = tuple(checks)

        # Plain loops rather than all()/any() over generators: about twice as fast here, and
        # these run for every member of every event.
        def proves_all(value: object) -> bool:
            for check in every:  # noqa: SIM110
                if not check(value):
                    return False
            return True

        return proves_all

    def keyword(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        compile_keyword = _KEYWORDS.get(keyword)
        if compile_keyword is None:
            raise _UnsupportedError(keyword)
        return compile_keyword(self, keyword, argument, schema)

    def type_check(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        names = [argument] if isinstance(argument, str) else list(argument)
        if not names or any(name not in _TYPES for name in names):
            raise _UnsupportedError("type")
        if len(names) == 1:
            return _TYPES[names[0]]
        alternatives = tuple(_TYPES[name] for name in names)

        def proves_any(value: object) -> bool:
            for check in alternatives:  # noqa: SIM110
                if check(value):
                    return True
            return False

        return proves_any

    def required(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        names = frozenset(argument)
        return lambda value: not isinstance(value, dict) or value.keys() >= names

    def properties(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        members = tuple((name, self.compile(subschema)) for name, subschema in argument.items())

        def proves_valid(value: object) -> bool:
            if not isinstance(value, dict):
                return True
            for name, check in members:  # noqa: SIM110
                if name in value and not check(value[name]):
                    return False
            return True

        return proves_valid

    def additional_properties(
        self, keyword: str, argument: Any, schema: Mapping[str, Any]
    ) -> ProvesValid:
        if "patternProperties" in schema:
            raise _UnsupportedError("additionalProperties with patternProperties")
        declared = frozenset(schema.get("properties", ()))
        if argument is False:
            return lambda value: not isinstance(value, dict) or value.keys() <= declared
        check = self.compile(argument)
        return lambda value: (
            not isinstance(value, dict)
            or all(check(member) for name, member in value.items() if name not in declared)
        )

    def items(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        if "prefixItems" in schema or not isinstance(argument, Mapping | bool):
            raise _UnsupportedError("items")
        check = self.compile(argument)
        return lambda value: not isinstance(value, list) or all(check(item) for item in value)

    def enum(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        # Strings and null only: jsonschema compares other values with its own rules
        # (1 != True); null equals only null there, as `is None` does here.
        choices = [argument] if keyword == "const" else argument
        if not all(choice is None or isinstance(choice, str) for choice in choices):
            raise _UnsupportedError("enum")
        allowed = frozenset(choice for choice in choices if choice is not None)
        if len(allowed) == len(choices):
            return lambda value: isinstance(value, str) and value in allowed
        return lambda value: value is None or (isinstance(value, str) and value in allowed)

    def format(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        check = self.formats.get(argument)
        if check is None:
            if argument in self.checked_formats:
                raise _UnsupportedError(f"format {argument}")
            return lambda value: True
        return lambda value: not isinstance(value, str) or check(value)

    def pattern(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        # jsonschema calls re.search with the pattern text; a compiled one searches the same.
        try:
            search = re.compile(argument).search
        except (re.error, TypeError):
            raise _UnsupportedError("pattern") from None
        return lambda value: not isinstance(value, str) or search(value) is not None

    def length(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        if type(argument) is not int:
            raise _UnsupportedError(keyword)
        limit: int = argument
        if keyword == "minLength":
            return lambda value: not isinstance(value, str) or len(value) >= limit
        return lambda value: not isinstance(value, str) or len(value) <= limit

    def bound(self, keyword: str, argument: Any, schema: Mapping[str, Any]) -> ProvesValid:
        if type(argument) not in _PLAIN_NUMBERS:
            raise _UnsupportedError(keyword)
        limit: float = argument
        compare: Callable[[Any], bool] = {
            "minimum": lambda value: value >= limit,
            "maximum": lambda value: value <= limit,
            "exclusiveMinimum": lambda value: value > limit,
            "exclusiveMaximum": lambda value: value < limit,
        }[keyword]
        return lambda value: (
            compare(value) if type(value) in _PLAIN_NUMBERS else _not_a_number(value)
        )


_KeywordCompiler = Callable[[_Compiler, str, Any, Mapping[str, Any]], ProvesValid]

_KEYWORDS: Mapping[str, _KeywordCompiler] = {
    "type": _Compiler.type_check,
    "required": _Compiler.required,
    "properties": _Compiler.properties,
    "additionalProperties": _Compiler.additional_properties,
    "items": _Compiler.items,
    "enum": _Compiler.enum,
    "const": _Compiler.enum,
    "format": _Compiler.format,
    "pattern": _Compiler.pattern,
    "minLength": _Compiler.length,
    "maxLength": _Compiler.length,
    "minimum": _Compiler.bound,
    "maximum": _Compiler.bound,
    "exclusiveMinimum": _Compiler.bound,
    "exclusiveMaximum": _Compiler.bound,
}
"""The keywords compiled here; a schema using any other keyword jsonschema knows is left to it."""

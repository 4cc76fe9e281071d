"""The registry's compiled schema checks never accept what jsonschema refuses.

`compiled_schemas` is a fast path in front of jsonschema: its True must be jsonschema's
True; its False only sends the data the slow way. These tests hold it to that on the
built-in schemas and on generated data near their edges, and check that the built-in
schemas really get a compiled check (else the fast path silently is not taken).
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.vocabulary import SchemaRegistry
from orchestrator.vocabulary.compiled_schemas import ProvesValid, compile_schema
from orchestrator.vocabulary.registry import _FORMATS, _is_rfc3339_text

REGISTRY = SchemaRegistry.builtin()


def compiled(schema: dict[str, Any] | bool) -> ProvesValid | None:
    return compile_schema(
        schema,
        known_keywords=jsonschema.Draft202012Validator.VALIDATORS,
        formats={"date-time": _is_rfc3339_text},
        checked_formats=_FORMATS.checkers,
    )


def reference(schema: dict[str, Any] | bool) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=_FORMATS)


@pytest.mark.parametrize("event_type", REGISTRY.types)
def test_every_builtin_schema_compiles_and_passes_its_valid_data(event_type: str) -> None:
    schema = dict(REGISTRY.schema_of(event_type))
    check = compiled(schema)
    assert check is not None
    example = _example(schema)
    assert reference(schema).is_valid(example)
    assert check(example)


def test_a_keyword_only_jsonschema_knows_leaves_the_schema_to_it() -> None:
    assert compiled({"type": "object", "anyOf": [{"required": ["a"]}]}) is None
    assert compiled({"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {}}}) is None
    assert compiled({"enum": [1, True]}) is None


def test_annotations_and_unknown_members_are_ignored() -> None:
    check = compiled({"title": "t", "x-cloudevents-type": "a.b", "examples": [1], "type": "string"})
    assert check is not None
    assert check("text")
    assert not check(1)


# Values near the edges of what the built-in schemas test: types that Python confuses (bool
# and int, int and float), empty strings, negative numbers, timestamps good and bad, NaN.
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, 3.0, -0.5, 0.5, 1.5]),
    st.sampled_from(
        [
            "",
            "x",
            "jsonl",
            "Parquet",
            "high",
            "Running",
            "2026-05-01T00:00:00Z",
            "2026-05-01T00:00:00.123+02:00",
            "2026-02-30T00:00:00Z",
            "yesterday",
            "*",
        ]
    ),
    st.text(max_size=4),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["start", "end", "a", "total", "train"]), inner, max_size=3
        ),
    ),
    max_leaves=6,
)


def _example(schema: Any) -> object:
    """A valid instance of a (built-in style) schema: every declared member, plain values."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "string")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        members = schema.get("properties", {})
        return {name: _example(member) for name, member in members.items()}
    if kind == "array":
        return [_example(schema.get("items", {}))]
    if kind in ("integer", "number"):
        return schema.get("minimum", 0) + (1 if kind == "integer" else 0.5)
    if schema.get("format") == "date-time":
        return "2026-05-01T00:00:00Z"
    return {"boolean": True, "null": None}.get(kind, "jsonl")


@st.composite
def _data_for(draw: st.DrawFn, schema: dict[str, Any]) -> object:
    """A valid example with some members dropped, replaced by edge values, or added."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_VALUES)
    data = _example(schema)
    assert isinstance(data, dict)
    for name in sorted(data):
        change = draw(st.sampled_from(["keep", "keep", "keep", "drop", "replace"]))
        if change == "drop":
            del data[name]
        elif change == "replace":
            data[name] = draw(_VALUES)
    if draw(st.booleans()):
        data.update(draw(st.dictionaries(st.sampled_from(["extra", "other"]), _VALUES)))
    return data


@pytest.mark.parametrize("event_type", REGISTRY.types)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_compiled_check_never_accepts_what_jsonschema_refuses(
    event_type: str, data: st.DataObject
) -> None:
    schema = dict(REGISTRY.schema_of(event_type))
    check = compiled(schema)
    assert check is not None
    instance = data.draw(_data_for(schema))
    if check(instance):
        assert reference(schema).is_valid(instance), instance


@settings(max_examples=300, deadline=None)
@given(instance=_VALUES)
def test_small_schemas_agree_with_jsonschema_where_the_check_says_yes(instance: object) -> None:
    for schema in (
        {"type": ["string", "null"]},
        {"type": "integer", "minimum": 0},
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        {"minimum": 0},
        {"type": "array", "items": {"type": "string", "minLength": 1}},
        {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
        {"properties": {"a": {"type": "string"}}, "additionalProperties": False},
        {"const": "x"},
        {"pattern": "^[a-z]+$", "maxLength": 2},
        {"format": "date-time"},
        {"format": "email"},
        True,
    ):
        check = compiled(schema)
        assert check is not None
        if check(instance):
            assert reference(schema).is_valid(instance), (schema, instance)


def test_valid_builtin_data_takes_the_fast_path() -> None:
    schema = dict(REGISTRY.schema_of("io.tuneloop.drift.detected.v1"))
    check = compiled(schema)
    assert check is not None
    drift = {
        "model_id": "chat",
        "metric": "psi",
        "value": 0.2,
        "threshold": 0.1,
        "severity": "high",
        "window": {"start": "2026-05-01T00:00:00Z", "end": "2026-05-01T12:00:00+02:00"},
        "rows": 3,
    }
    assert check(drift)
    assert not check({**drift, "rows": -1})
    assert not check({**drift, "value": True})
    assert not check({**drift, "window": {"start": "yesterday", "end": "2026-05-01T12:00:00Z"}})

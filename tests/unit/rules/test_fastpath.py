"""The Python fast path gives what CEL gives: the same value, or an error on both sides."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import cel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.rules.fastpath import FastPathError, NeedsCel, compile_simple

VALUES = st.one_of(
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False).map(lambda f: round(f, 2)),
    st.sampled_from(["a", "b", ""]),
    st.booleans(),
    st.none(),
)
FIELDS = ["x", "y", "z", "missing"]
LITERALS = ["1", "2.5", "-1", "'a'", '"b"', "true", "false", "null", "0"]


@st.composite
def operands(draw: Any) -> str:
    if draw(st.booleans()):
        return "event.data." + draw(st.sampled_from(FIELDS))
    return draw(st.sampled_from(LITERALS))


@st.composite
def expressions(draw: Any, depth: int = 2) -> str:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        if draw(st.booleans()):
            operator = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
            return f"{draw(operands())} {operator} {draw(operands())}"
        return draw(operands())
    operator = draw(st.sampled_from(["&&", "||"]))
    left = draw(expressions(depth=depth - 1))
    right = draw(expressions(depth=depth - 1))
    negate = "!" if draw(st.booleans()) else ""
    return f"{negate}({left} {operator} {right})"


def outcome_of_cel(source: str, variables: dict[str, Any]) -> tuple[str, Any]:
    try:
        return ("value", cel.compile(source).execute(cel.Context(variables)))
    except (KeyError, TypeError, ValueError, RuntimeError):
        return ("error", None)


def outcome_of_fast(source: str, variables: dict[str, Any]) -> tuple[str, Any]:
    evaluator = compile_simple(source)
    assert evaluator is not None, source
    try:
        return ("value", evaluator(variables))
    except FastPathError:
        return ("error", None)


@settings(max_examples=200, deadline=None)
@given(expressions(), st.fixed_dictionaries({name: VALUES for name in FIELDS[:3]}))
def test_fast_path_agrees_with_cel(source, data):
    variables = {"event": {"data": data}}
    fast = outcome_of_fast(source, variables)
    expected = outcome_of_cel(source, variables)
    assert fast == expected, source
    if fast[0] == "value":
        assert type(fast[1]) is type(expected[1])


@pytest.mark.parametrize(
    "source",
    [
        "size(event.data.x) > 1",
        "event.data.x + 1 > 2",
        "event.data.x in [1, 2]",
        "1u == 1",
        "event.data.tags.exists(t, t == 'a')",
        "'\\n' == event.data.x",
        "a < b < c",
    ],
)
def test_anything_outside_the_subset_is_left_to_cel(source):
    assert compile_simple(source) is None


def test_lists_compared_at_run_time_are_handed_to_cel():
    evaluator = compile_simple("event.data.x == event.data.y")
    assert evaluator is not None
    with pytest.raises(NeedsCel):
        evaluator({"event": {"data": {"x": [1], "y": [1]}}})


@pytest.mark.parametrize(
    "data", [[1, 2], "text", None, 3, {"x": {"y": 1}}, {"x": "s"}, {"x": None}, {}]
)
@pytest.mark.parametrize(
    "source",
    ["event.data.x", "event.data.x.y", "event.data.x > 0.5", "event.data.x == 'a'", "event"],
)
def test_paths_through_containers_that_are_not_maps_fail_as_in_cel(source, data):
    # The path walk takes a shortcut through plain dicts; anything else must end as CEL ends.
    variables = {"event": {"data": data}}
    fast = outcome_of_fast(source, variables)
    expected = outcome_of_cel(source, variables)
    assert fast[0] == expected[0], (source, data)


def test_a_mapping_that_is_not_a_dict_is_walked_like_one():
    evaluator = compile_simple("event.data.x > 1")
    assert evaluator is not None
    assert evaluator({"event": MappingProxyType({"data": MappingProxyType({"x": 2})})}) is True

"""Rule-file text → `RuleSet`, with every problem reported as `FILE:LINE:COL: message`.

`loading.py` reads the files and calls `parse_files`; tests call it with text. The parser
collects all problems instead of stopping at the first, so `tuneloop check` can list them in
one run. It works on PyYAML's node tree (which records line and column) rather than on plain
dicts, because a rule-file error without a position is one users have to hunt for.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import yaml

from orchestrator.errors import ConfigError
from orchestrator.jobs import promotion
from orchestrator.rules import sweep_parsing
from orchestrator.rules.durations import DurationError, parse_duration
from orchestrator.rules.expressions import (
    Expression,
    ExpressionError,
    compile_expression,
    placeholder_event,
    probe,
)
from orchestrator.rules.model import (
    Concurrency,
    Debounce,
    Join,
    LaunchTemplate,
    Limits,
    Mode,
    Rule,
    RuleSet,
    Selector,
    SourceLocation,
    SumCondition,
)
from orchestrator.rules.templating import (
    LORA_FIELDS,
    RESOURCE_FIELDS,
    TRAINING_FIELDS,
    Template,
    TemplateError,
    check_value,
    split_template,
)
from orchestrator.vocabulary.registry import SchemaRegistry


@functools.cache
def _vocabulary() -> SchemaRegistry:
    return SchemaRegistry.builtin()


def known_event_types() -> frozenset[str]:
    """Types tuneloop itself defines (its schema vocabulary); other `io.tuneloop.*` types are
    typos."""
    return frozenset(_vocabulary().types)


def _data_fields_of(event_type: str) -> frozenset[str] | None:
    """Top-level `data` members the vocabulary's schema names for *event_type* (None: no
    schema, or a schema that does not list them)."""
    if not _vocabulary().knows(event_type):
        return None
    properties = _vocabulary().schema_of(event_type).get("properties")
    return frozenset(properties) if isinstance(properties, Mapping) else None


_RULE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_RUNTIME_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?$")
_EVENT_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
_TOP_KEYS = ("rules", "defaults", "limits", "runtimes", "allowed_lateness", "event_types")
_RULE_KEYS = (
    "name",
    "on",
    "key",
    "window",
    "count",
    "sum",
    "join",
    "debounce",
    "cooldown",
    "concurrency",
    "max_launches_per_day",
    "mode",
    "launch",
    "description",
)
_DEFAULTABLE = (
    "key",
    "window",
    "cooldown",
    "concurrency",
    "max_launches_per_day",
    "mode",
    "debounce",
    "launch",
)
_LAUNCH_KEYS = (
    "runtime",
    "base_model",
    "dataset",
    "lora",
    "training",
    "resources",
    "deadline",
    "output_uri",
    "promote",
    "sweep",
)
_PROMOTE_KEYS = ("metric", "mode", "min_delta")
_TEXT_FIELDS = frozenset({"cpu", "memory"})
"""The only lora/training/resources fields that are text (so may mix `${ }` with text)."""
DEFAULT_WINDOW = timedelta(days=1)
MAX_RULE_NAME = 40
EVENT_VARIABLES = frozenset({"event"})
TEMPLATE_VARIABLES = frozenset({"event", "key", "window", "joined"})


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One thing wrong in a rule file, with where it is."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class RuleFileError(ConfigError):
    """The rule files are invalid; `problems` lists every problem found, in file order."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(sorted(problems))
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True, slots=True)
class Source:
    """One rule file's text and the name to report it under."""

    name: str
    text: str


class RuleFileLoader(yaml.SafeLoader):
    """YAML 1.2 scalars, as people expect: `on`, `yes`, `off` stay strings (`on:` is a rule
    key), only `true`/`false` are booleans, and `2e-4` is a number."""


RuleFileLoader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
RuleFileLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
RuleFileLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)


# --- located values -----------------------------------------------------------------------


class Loc(dict[str, Any]):
    """A YAML mapping that remembers where it, its keys and its values are."""

    def __init__(self, mark: tuple[int, int]) -> None:
        super().__init__()
        self.mark = mark
        self.key_marks: dict[str, tuple[int, int]] = {}
        self.value_marks: dict[str, tuple[int, int]] = {}
        self.quoted: dict[str, bool] = {}


class LocList(list[Any]):
    def __init__(self, mark: tuple[int, int]) -> None:
        super().__init__()
        self.mark = mark
        self.marks: list[tuple[int, int]] = []


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _located(node: yaml.Node, constructor: yaml.constructor.SafeConstructor) -> Any:
    if isinstance(node, yaml.MappingNode):
        result = Loc(_mark(node))
        for key_node, value_node in node.value:
            key = constructor.construct_object(key_node, deep=True)
            name = str(key)
            if name in result:
                raise _DuplicateKeyError(name, _mark(key_node))
            result[name] = _located(value_node, constructor)
            result.key_marks[name] = _mark(key_node)
            result.value_marks[name] = _mark(value_node)
            result.quoted[name] = isinstance(value_node, yaml.ScalarNode) and bool(value_node.style)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = LocList(_mark(node))
        for item in node.value:
            items.append(_located(item, constructor))
            items.marks.append(_mark(item))
        return items
    return constructor.construct_object(node, deep=True)


class _DuplicateKeyError(Exception):
    def __init__(self, name: str, mark: tuple[int, int]) -> None:
        super().__init__(name)
        self.name = name
        self.mark = mark


def read_yaml(source: Source) -> tuple[Any, list[Problem]]:
    """The located document of *source*, or the YAML problem that stops parsing it."""
    try:
        node = yaml.compose(source.text, Loader=RuleFileLoader)
        if node is None:
            return None, [Problem(source.name, 1, 1, "file is empty: expected `rules:`")]
        return _located(node, RuleFileLoader("")), []
    except _DuplicateKeyError as exc:
        line, column = exc.mark
        return None, [Problem(source.name, line, column, f"duplicate key {exc.name!r}")]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        text = f"{exc.problem or 'bad YAML'}" + (f" ({exc.context})" if exc.context else "")
        return None, [Problem(source.name, line, column, f"bad YAML: {text}")]
    except yaml.YAMLError as exc:
        return None, [Problem(source.name, 1, 1, f"bad YAML: {exc}")]


# --- the parser ---------------------------------------------------------------------------


@dataclass
class _Context:
    file: str
    problems: list[Problem] = field(default_factory=list)
    runtimes: frozenset[str] = frozenset()
    event_types: frozenset[str] | None = None

    def add(self, mark: tuple[int, int], message: str) -> None:
        self.problems.append(Problem(self.file, mark[0], mark[1], message))


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_keys(ctx: _Context, mapping: Loc, allowed: Iterable[str], where: str) -> None:
    allowed = tuple(allowed)
    for name in mapping:
        if name not in allowed:
            ctx.add(
                mapping.key_marks[name],
                f"unknown key {name!r} in {where}{_did_you_mean(name, allowed)}",
            )


def parse_files(sources: Iterable[Source]) -> RuleSet:
    """Parse every source into one `RuleSet`.

    Raises:
        RuleFileError: anything is wrong, with every problem found.
    """
    problems: list[Problem] = []
    rules: list[Rule] = []
    names: dict[str, SourceLocation] = {}
    runtimes: set[str] = set()
    lateness = timedelta(0)
    limits = Limits()
    files: list[str] = []
    settings_hash: list[Any] = []
    for source in sources:
        files.append(source.name)
        document, yaml_problems = read_yaml(source)
        problems += yaml_problems
        if yaml_problems:
            continue
        ctx = _Context(source.name)
        parsed = _parse_document(ctx, document)
        problems += ctx.problems
        if parsed is None:
            continue
        file_rules, file_lateness, file_limits, file_runtimes = parsed
        runtimes |= file_runtimes
        lateness = max(lateness, file_lateness)
        if file_limits.max_concurrent_jobs is not None:
            limits = file_limits
        settings_hash.append(
            [str(file_lateness), file_limits.max_concurrent_jobs, sorted(file_runtimes)]
        )
        for rule in file_rules:
            assert rule.location is not None
            if rule.name in names:
                first = names[rule.name]
                problems.append(
                    Problem(
                        rule.location.file,
                        rule.location.line,
                        rule.location.column,
                        f"duplicate rule name {rule.name!r} (first defined at {first})",
                    )
                )
                continue
            names[rule.name] = rule.location
            rules.append(rule)
    if problems:
        raise RuleFileError(problems)
    version = _hash([[rule.name, rule.version] for rule in rules] + settings_hash)
    return RuleSet.of(
        tuple(rules),
        version=version,
        allowed_lateness=lateness,
        runtimes=frozenset(runtimes),
        limits=limits,
        files=tuple(files),
    )


def _hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _parse_document(
    ctx: _Context, document: Any
) -> tuple[list[Rule], timedelta, Limits, frozenset[str]] | None:
    if not isinstance(document, Loc):
        ctx.add((1, 1), "expected a mapping with a `rules:` list at the top of the file")
        return None
    _check_keys(ctx, document, _TOP_KEYS, "the rule file")
    ctx.runtimes = _string_list(ctx, document, "runtimes", _RUNTIME_NAME) or frozenset()
    if "event_types" in document:
        ctx.event_types = _string_list(ctx, document, "event_types", _EVENT_TYPE)
    lateness = _duration(ctx, document, "allowed_lateness", timedelta(0)) or timedelta(0)
    limits = _parse_limits(ctx, document)
    defaults = Loc((1, 1))
    if "defaults" in document:
        value = document["defaults"]
        if not isinstance(value, Loc):
            ctx.add(document.value_marks["defaults"], "defaults must be a mapping")
        else:
            _check_keys(ctx, value, _DEFAULTABLE, "defaults")
            defaults = value
    rules_value = document.get("rules")
    if not isinstance(rules_value, LocList):
        mark = document.value_marks.get("rules", (1, 1))
        ctx.add(mark, "expected `rules:` to be a list of rules")
        return None
    rules = []
    for index, item in enumerate(rules_value):
        mark = rules_value.marks[index]
        if not isinstance(item, Loc):
            ctx.add(mark, "each rule must be a mapping with at least name, on and launch")
            continue
        rule = _parse_rule(ctx, _with_defaults(item, defaults), mark)
        if rule is not None:
            rules.append(rule)
    return rules, lateness, limits, ctx.runtimes


def _string_list(
    ctx: _Context, document: Loc, name: str, pattern: re.Pattern[str]
) -> frozenset[str] | None:
    if name not in document:
        return None
    value = document[name]
    if not isinstance(value, LocList) or not all(isinstance(v, str) for v in value):
        ctx.add(document.value_marks[name], f"{name} must be a list of names")
        return None
    for index, item in enumerate(value):
        if not pattern.match(item):
            ctx.add(value.marks[index], f"bad name {item!r} in {name}")
    return frozenset(value)


def _parse_limits(ctx: _Context, document: Loc) -> Limits:
    if "limits" not in document:
        return Limits()
    value = document["limits"]
    if not isinstance(value, Loc):
        ctx.add(document.value_marks["limits"], "limits must be a mapping")
        return Limits()
    _check_keys(ctx, value, ("max_concurrent_jobs",), "limits")
    return Limits(max_concurrent_jobs=_integer(ctx, value, "max_concurrent_jobs", None, minimum=1))


def _with_defaults(rule: Loc, defaults: Loc) -> Loc:
    merged = Loc(rule.mark)
    for source in (defaults, rule):
        for name, value in source.items():
            current = merged.get(name)
            if isinstance(value, Loc) and isinstance(current, Loc):
                merged[name] = _merge_launch(current, value)
            else:
                merged[name] = value
            merged.key_marks[name] = source.key_marks[name]
            merged.value_marks[name] = source.value_marks[name]
            merged.quoted[name] = source.quoted[name]
    return merged


def _merge_launch(base: Loc, override: Loc) -> Loc:
    merged = Loc(override.mark)
    for source in (base, override):
        for name, value in source.items():
            current = merged.get(name)
            if isinstance(value, Loc) and isinstance(current, Loc):
                merged[name] = _merge_launch(current, value)
            else:
                merged[name] = value
            merged.key_marks[name] = source.key_marks[name]
            merged.value_marks[name] = source.value_marks[name]
            merged.quoted[name] = source.quoted[name]
    return merged


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _parse_rule(ctx: _Context, raw: Loc, mark: tuple[int, int]) -> Rule | None:
    before = len(ctx.problems)
    _check_keys(ctx, raw, _RULE_KEYS, "a rule")
    name = raw.get("name")
    if not isinstance(name, str):
        ctx.add(raw.value_marks.get("name", mark), "every rule needs a `name` (a string)")
        name = "<unnamed>"
    elif len(name) > MAX_RULE_NAME or not _RULE_NAME.match(name):
        ctx.add(
            raw.value_marks["name"],
            f"bad rule name {name!r}: use a-z, 0-9 and '-', at most {MAX_RULE_NAME} characters",
        )
    selector = _parse_selector(ctx, raw, mark)
    key = _expression(ctx, raw, "key", EVENT_VARIABLES, default="event.subject")
    window = _duration(ctx, raw, "window", DEFAULT_WINDOW, positive=True) or DEFAULT_WINDOW
    count = _integer(ctx, raw, "count", 1, minimum=1) or 1
    total = _parse_sum(ctx, raw)
    joins = _parse_joins(ctx, raw, selector, key, window)
    debounce = _parse_debounce(ctx, raw, window)
    cooldown = _duration(ctx, raw, "cooldown", timedelta(0)) or timedelta(0)
    concurrency = _choice(ctx, raw, "concurrency", Concurrency, Concurrency.FORBID)
    budget = _integer(ctx, raw, "max_launches_per_day", None, minimum=1)
    mode = _choice(ctx, raw, "mode", Mode, Mode.LIVE)
    launch = _parse_launch(ctx, raw, mark)
    if launch is not None and launch.sweep is not None and concurrency is Concurrency.REPLACE:
        ctx.add(
            raw.value_marks.get("concurrency", mark),
            "concurrency replace would cancel a sweep halfway: a rule with a sweep takes "
            "forbid or queue",
        )
    types = selector.types if selector is not None else ()
    _check_data_fields(ctx, raw.get("on"), "where", selector.where if selector else None, types)
    _check_data_fields(ctx, raw, "key", key, types)
    _check_data_fields(ctx, raw.get("sum"), "of", total.of if total else None, types)
    if len(ctx.problems) > before or selector is None or key is None or launch is None:
        return None
    return Rule(
        name=name,
        version=_hash(_plain(raw)),
        on=selector,
        key=key,
        window=window,
        count=count,
        sum=total,
        joins=joins,
        debounce=debounce,
        cooldown=cooldown,
        concurrency=concurrency,
        max_launches_per_day=budget,
        mode=mode,
        launch=launch,
        location=SourceLocation(ctx.file, mark[0], mark[1]),
    )


def _check_data_fields(
    ctx: _Context, mapping: Any, name: str, expression: Expression | None, types: Iterable[str]
) -> None:
    """A `event.data.<field>` that is not in the type's schema but close to one is a typo.

    The vocabulary allows extra members, so an unknown field alone is not an error; one that
    is a letter or two away from a field the schema names almost always is.
    """
    if expression is None or not expression.data_fields or not isinstance(mapping, Loc):
        return
    if name not in mapping:
        return
    for event_type in types:
        known = _data_fields_of(event_type)
        if not known:
            continue
        for data_field in sorted(expression.data_fields - known):
            close = difflib.get_close_matches(data_field, sorted(known), n=1, cutoff=0.75)
            if not close:
                continue
            mark = mapping.value_marks[name]
            offset = expression.source.find(f"event.data.{data_field}") + len("event.data.")
            quote = 1 if mapping.quoted.get(name) else 0
            ctx.add(
                (mark[0], mark[1] + quote + offset),
                f"{name}: event.data.{data_field} is not a field of {event_type} "
                f"(did you mean {close[0]!r}?)",
            )


def _check_event_type(ctx: _Context, value: Any, mark: tuple[int, int]) -> str | None:
    if not isinstance(value, str) or not _EVENT_TYPE.match(value):
        ctx.add(mark, f"bad event type {value!r}: expected a string like io.example.thing.v1")
        return None
    known = known_event_types() | (ctx.event_types or frozenset())
    if value in known:
        return value
    if ctx.event_types is not None or value.startswith("io.tuneloop."):
        ctx.add(mark, f"unknown event type {value!r}{_did_you_mean(value, known)}")
        return None
    return value


def _parse_selector(ctx: _Context, raw: Loc, mark: tuple[int, int]) -> Selector | None:
    on = raw.get("on")
    if not isinstance(on, Loc):
        ctx.add(raw.value_marks.get("on", mark), "every rule needs `on:` with a `type`")
        return None
    _check_keys(ctx, on, ("type", "types", "source", "sources", "where"), "on")
    types: list[str] = []
    if ("type" in on) == ("types" in on):
        ctx.add(on.mark, "`on` needs exactly one of `type` or `types`")
    elif "type" in on:
        checked = _check_event_type(ctx, on["type"], on.value_marks["type"])
        types = [checked] if checked else []
    else:
        values = on["types"]
        if not isinstance(values, LocList) or not values:
            ctx.add(on.value_marks["types"], "`types` must be a non-empty list of event types")
        else:
            for index, value in enumerate(values):
                checked = _check_event_type(ctx, value, values.marks[index])
                if checked:
                    types.append(checked)
    sources = _globs(ctx, on)
    where = _expression(ctx, on, "where", EVENT_VARIABLES, default=None, boolean=True)
    if not types:
        return None
    return Selector(types=tuple(dict.fromkeys(types)), sources=sources, where=where)


def _globs(ctx: _Context, mapping: Loc) -> tuple[str, ...]:
    for name in ("source", "sources"):
        if name in mapping:
            value = mapping[name]
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
                ctx.add(mapping.value_marks[name], f"{name} must be a glob or a list of globs")
                return ()
            return tuple(values)
    return ()


def _expression(
    ctx: _Context,
    mapping: Loc,
    name: str,
    allowed: frozenset[str],
    *,
    default: str | None,
    boolean: bool = False,
) -> Expression | None:
    text = mapping.get(name, default)
    if text is None:
        return None
    mark = mapping.value_marks.get(name, mapping.mark)
    if not isinstance(text, str):
        ctx.add(mark, f"{name} must be a CEL expression (a string), got {text!r}")
        return None
    try:
        expression = compile_expression(text, allowed=allowed)
        value = probe(expression, {"event": placeholder_event()})
    except ExpressionError as exc:
        ctx.add(_inner_mark(mapping, name, mark, exc), f"{name}: {exc.message}")
        return None
    if boolean and value is not None and not isinstance(value, bool):
        ctx.add(mark, f"{name} must be a boolean CEL expression, but {text!r} gives {value!r}")
        return None
    if name == "key" and value is not None and not isinstance(value, str):
        ctx.add(mark, f"key must give a string, but {text!r} gives {value!r}")
        return None
    return expression


def _inner_mark(
    mapping: Loc, name: str, mark: tuple[int, int], exc: ExpressionError, offset: int = 0
) -> tuple[int, int]:
    if exc.column is None or (exc.line or 1) != 1:
        return mark
    quote = 1 if mapping.quoted.get(name) else 0
    return (mark[0], mark[1] + quote + offset + exc.column - 1)


def _duration(
    ctx: _Context, mapping: Loc, name: str, default: timedelta | None, *, positive: bool = False
) -> timedelta | None:
    if name not in mapping:
        return default
    try:
        value = parse_duration(mapping[name])
    except DurationError as exc:
        ctx.add(mapping.value_marks[name], f"{name}: {exc}")
        return default
    if positive and value <= timedelta(0):
        ctx.add(mapping.value_marks[name], f"{name} must be longer than 0s")
        return default
    return value


def _integer(
    ctx: _Context, mapping: Loc, name: str, default: int | None, *, minimum: int
) -> int | None:
    if name not in mapping or mapping[name] is None:
        return default
    value = mapping[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        ctx.add(
            mapping.value_marks[name], f"{name} must be a whole number ≥ {minimum}, got {value!r}"
        )
        return default
    return value


def _choice(ctx: _Context, mapping: Loc, name: str, enum_type: Any, default: Any) -> Any:
    if name not in mapping:
        return default
    value = mapping[name]
    choices = [member.value for member in enum_type]
    if value not in choices:
        ctx.add(
            mapping.value_marks[name],
            f"{name} must be one of {', '.join(choices)}, got {value!r}"
            + (_did_you_mean(value, choices) if isinstance(value, str) else ""),
        )
        return default
    return enum_type(value)


def _sub_mapping(ctx: _Context, raw: Loc, name: str, allowed: Iterable[str]) -> Loc | None:
    if name not in raw:
        return None
    value = raw[name]
    if not isinstance(value, Loc):
        ctx.add(raw.value_marks[name], f"{name} must be a mapping")
        return None
    _check_keys(ctx, value, allowed, name)
    return value


def _parse_sum(ctx: _Context, raw: Loc) -> SumCondition | None:
    value = _sub_mapping(ctx, raw, "sum", ("of", "at_least"))
    if value is None:
        return None
    of = _expression(ctx, value, "of", EVENT_VARIABLES, default=None)
    if of is None and "of" not in value:
        ctx.add(value.mark, "sum needs `of` (a CEL expression giving a number)")
    at_least = value.get("at_least")
    if isinstance(at_least, bool) or not isinstance(at_least, int | float) or at_least <= 0:
        ctx.add(value.value_marks.get("at_least", value.mark), "sum needs `at_least` > 0")
        return None
    return SumCondition(of=of, at_least=float(at_least)) if of else None


def _parse_joins(
    ctx: _Context,
    raw: Loc,
    selector: Selector | None,
    key: Expression | None,
    window: timedelta,
) -> tuple[Join, ...]:
    if "join" not in raw:
        return ()
    values = raw["join"]
    if not isinstance(values, LocList):
        ctx.add(raw.value_marks["join"], "join must be a list of {type, key, within}")
        return ()
    joins = []
    seen: set[str] = set()
    for index, item in enumerate(values):
        mark = values.marks[index]
        if not isinstance(item, Loc):
            ctx.add(mark, "each join must be a mapping with `type`, `key` and `within`")
            continue
        _check_keys(ctx, item, ("type", "key", "within", "source", "sources"), "join")
        if "type" not in item:
            ctx.add(mark, "join needs a `type`")
            continue
        event_type = _check_event_type(ctx, item["type"], item.value_marks["type"])
        default_key = key.source if key else "event.subject"
        join_key = _expression(ctx, item, "key", EVENT_VARIABLES, default=default_key)
        within = _duration(ctx, item, "within", window)
        if event_type is None or join_key is None or within is None:
            continue
        type_mark = item.value_marks["type"]
        if within <= timedelta(0):
            ctx.add(item.value_marks["within"], "this join can never match: `within` is 0s")
            continue
        if selector is not None and event_type in selector.types:
            ctx.add(
                type_mark,
                f"this join can never add a condition: {event_type!r} is the rule's own `on` "
                "type, so every triggering event would satisfy it",
            )
            continue
        if event_type in seen:
            ctx.add(type_mark, f"duplicate join on {event_type!r}")
            continue
        if not join_key.variables and key is not None and key.variables:
            ctx.add(
                item.value_marks.get("key", mark),
                f"this join can never match: its key {join_key.source!r} is a constant while "
                f"the rule key {key.source!r} depends on the event",
            )
            continue
        _check_data_fields(ctx, item, "key", join_key, [event_type])
        seen.add(event_type)
        joins.append(Join(event_type, join_key, within, _globs(ctx, item)))
    return tuple(joins)


def _parse_debounce(ctx: _Context, raw: Loc, window: timedelta) -> Debounce | None:
    value = _sub_mapping(ctx, raw, "debounce", ("quiet", "max_wait"))
    if value is None:
        return None
    if "quiet" not in value:
        ctx.add(value.mark, "debounce needs `quiet` (a duration)")
        return None
    quiet = _duration(ctx, value, "quiet", None, positive=True)
    max_wait = _duration(ctx, value, "max_wait", window, positive=True)
    if quiet is None or max_wait is None:
        return None
    if max_wait < quiet:
        ctx.add(value.value_marks["max_wait"], "debounce max_wait must be at least quiet")
        return None
    return Debounce(quiet=quiet, max_wait=max_wait)


def _parse_launch(ctx: _Context, raw: Loc, mark: tuple[int, int]) -> LaunchTemplate | None:
    launch = raw.get("launch")
    if not isinstance(launch, Loc):
        ctx.add(raw.value_marks.get("launch", mark), "every rule needs `launch:` (a mapping)")
        return None
    _check_keys(ctx, launch, _LAUNCH_KEYS, "launch")
    before = len(ctx.problems)
    texts: dict[str, Template] = {}
    for name in ("runtime", "base_model", "dataset", "output_uri"):
        if name not in launch:
            if name != "output_uri":
                ctx.add(launch.mark, f"launch needs `{name}`")
            continue
        template = _template(ctx, launch, name, "")
        if template is not None:
            texts[name] = template
    runtime = texts.get("runtime")
    if runtime is not None:
        _check_runtime(ctx, launch.value_marks["runtime"], runtime)
    sections: dict[str, dict[str, Template]] = {}
    for section, table in (
        ("lora", LORA_FIELDS),
        ("training", TRAINING_FIELDS),
        ("resources", RESOURCE_FIELDS),
    ):
        sections[section] = {}
        value = _sub_mapping(ctx, launch, section, table)
        for name in value or ():
            if value is not None and name in table:
                template = _template(ctx, value, name, section)
                if template is not None:
                    sections[section][name] = template
    deadline = _duration(ctx, launch, "deadline", None, positive=True)
    promote = _parse_promote(ctx, launch, sections["training"].get("eval_fraction"))
    sweep = None
    if "sweep" in launch:
        sweep = sweep_parsing.parse_sweep(
            launch["sweep"],
            mark=launch.value_marks["sweep"],
            report=ctx.add,
            training=sections["training"],
        )
    if len(ctx.problems) > before or runtime is None:
        return None
    return LaunchTemplate(
        runtime=runtime,
        base_model=texts["base_model"],
        dataset=texts["dataset"],
        lora=sections["lora"],
        training=sections["training"],
        resources=sections["resources"],
        output_uri=texts.get("output_uri"),
        deadline=deadline,
        promote=promote,
        sweep=sweep,
    )


def _parse_promote(
    ctx: _Context, launch: Loc, eval_fraction: Template | None
) -> promotion.PromotionPolicy | None:
    """`launch.promote`: `{metric, mode, min_delta}`, each optional (`{}` is the defaults:
    eval_loss, its usual direction, 0)."""
    if "promote" not in launch:
        return None
    value = launch["promote"]
    if not isinstance(value, Loc):
        ctx.add(
            launch.value_marks["promote"],
            "promote must be a mapping such as {metric: eval_loss, mode: min, min_delta: 0.01}"
            " ({} takes the defaults)",
        )
        return None
    before = len(ctx.problems)
    _check_keys(ctx, value, _PROMOTE_KEYS, "promote")
    metrics = promotion.METRICS
    metric = value.get("metric", promotion.DEFAULT_METRIC)
    if metric not in metrics:
        ctx.add(
            value.value_marks["metric"],
            f"promote.metric must be one of {', '.join(metrics)}, got {metric!r}"
            + (_did_you_mean(metric, metrics) if isinstance(metric, str) else ""),
        )
        return None
    mode = value.get("mode", metrics[metric].value)
    if mode not in [member.value for member in promotion.Mode]:
        ctx.add(value.value_marks["mode"], f"promote.mode must be min or max, got {mode!r}")
    delta = value.get("min_delta", 0.0)
    if (
        isinstance(delta, bool)
        or not isinstance(delta, int | float)
        or not math.isfinite(delta)
        or delta < 0
    ):
        ctx.add(
            value.value_marks["min_delta"],
            f"promote.min_delta must be a number ≥ 0 (how much better than the champion a "
            f"candidate must be), got {delta!r}",
        )
    if eval_fraction is not None and eval_fraction.is_literal and eval_fraction.literal == 0:
        ctx.add(
            launch.value_marks["promote"],
            "promote needs evaluation, but training.eval_fraction 0 holds no example out: "
            "raise it, or drop promote",
        )
    if len(ctx.problems) > before:
        return None
    return promotion.PromotionPolicy(
        metric=metric, mode=promotion.Mode(mode), min_delta=float(delta)
    )


def _check_runtime(ctx: _Context, mark: tuple[int, int], runtime: Template) -> None:
    if runtime.is_literal:
        if not _RUNTIME_NAME.match(runtime.literal):
            ctx.add(mark, f"bad runtime name {runtime.literal!r}")
        elif ctx.runtimes and runtime.literal not in ctx.runtimes:
            # A file that declares its runtimes means "only these": a literal outside the
            # list is as likely a typo or a forgotten entry as a templated one is an attack.
            ctx.add(
                mark,
                f"runtime {runtime.literal!r} is outside this file's allowlist "
                f"({', '.join(sorted(ctx.runtimes))}): add it to `runtimes:` or fix the name",
            )
        return
    if not ctx.runtimes:
        ctx.add(
            mark,
            "a templated runtime needs an allowlist: add `runtimes: [name, ...]` at the top of "
            "the rule file",
        )
        return
    constant = runtime.parts and all(
        isinstance(part, str) or not part.variables for part in runtime.parts
    )
    if constant:
        from orchestrator.rules.expressions import Activation

        try:
            value = runtime.render(Activation({}))
        except TemplateError as exc:
            ctx.add(mark, f"runtime: {exc}")
            return
        if value not in ctx.runtimes:
            ctx.add(
                mark,
                f"runtime {value!r} is outside the allowlist ({', '.join(sorted(ctx.runtimes))})",
            )


def _template(ctx: _Context, mapping: Loc, name: str, section: str) -> Template | None:
    value = mapping[name]
    mark = mapping.value_marks[name]
    label = f"{section}.{name}" if section else name
    if not isinstance(value, str) or "${" not in value:
        literal = tuple(value) if isinstance(value, list) else value
        try:
            checked = check_value(section, name, literal)
        except TemplateError as exc:
            ctx.add(mark, str(exc))
            return None
        return Template(parts=(), literal=checked)
    try:
        spans = split_template(value)
    except TemplateError as exc:
        ctx.add(mark, f"{label}: {exc}")
        return None
    parts: list[str | Expression] = []
    for kind, start, end in spans:
        if kind == 0:
            parts.append(value[start:end])
            continue
        try:
            parts.append(compile_expression(value[start:end], allowed=TEMPLATE_VARIABLES))
        except ExpressionError as exc:
            ctx.add(_inner_mark(mapping, name, mark, exc, offset=start), f"{label}: {exc.message}")
            return None
    template = Template(parts=tuple(parts))
    is_text = len(parts) > 1 or isinstance(parts[0], str)
    if is_text and section and name not in _TEXT_FIELDS:
        ctx.add(mark, f"{label}: text around `${{ }}` makes a string, but {label} is not text")
        return None
    return template

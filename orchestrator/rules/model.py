"""What a rule file means, as frozen values: rules, their triggers and launch templates.

Built only by `parsing.py` (from the YAML that `loading.py` reads); read by the engine
(`engine.py` and the modules beside it).
Every expression in here is already compiled and every duration already parsed, so the engine
never meets rule-file text.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from orchestrator.jobs.promotion import PromotionPolicy
from orchestrator.rules.expressions import Expression
from orchestrator.rules.templating import Template
from orchestrator.sweeps.spec import SweepSpec


class Concurrency(enum.Enum):
    """What a rule does when it fires while its previous job for the key still runs."""

    FORBID = "forbid"
    """Suppress the launch; the window is kept, so the next event after the job ends fires."""
    QUEUE = "queue"
    """Hold one coalesced launch; it starts when the running job finishes."""
    REPLACE = "replace"
    """Cancel the running job and launch the new one."""


class Mode(enum.Enum):
    LIVE = "live"
    SHADOW = "shadow"
    """Decide and record everything, launch nothing."""


@dataclass(frozen=True, slots=True)
class SourceLocation:
    file: str
    line: int
    column: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Selector:
    """The `on:` part: which events a rule looks at."""

    types: tuple[str, ...]
    sources: tuple[str, ...] = ()
    """Glob patterns; empty accepts every source."""
    where: Expression | None = None

    def accepts_source(self, source: str) -> bool:
        return accepts_source(self.sources, source)


def source_pattern(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regular expression for the glob *patterns* (None when there are none)."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)) if patterns else None


def accepts_source(patterns: tuple[str, ...], source: str) -> bool:
    """Whether *source* matches one of the glob *patterns* (none: every source)."""
    pattern = source_pattern(patterns)
    return pattern is None or pattern.match(source) is not None


@dataclass(frozen=True, slots=True)
class Join:
    """Another event type that must have been seen for the same key within `within`."""

    type: str
    key: Expression
    within: timedelta
    sources: tuple[str, ...] = ()

    def accepts_source(self, source: str) -> bool:
        return accepts_source(self.sources, source)


@dataclass(frozen=True, slots=True)
class SumCondition:
    of: Expression
    at_least: float


@dataclass(frozen=True, slots=True)
class Debounce:
    quiet: timedelta
    max_wait: timedelta


@dataclass(frozen=True, slots=True)
class LaunchTemplate:
    """The `launch:` part; rendered into a `TrainingRequest` when the rule fires."""

    runtime: Template
    base_model: Template
    dataset: Template
    lora: Mapping[str, Template] = field(default_factory=dict)
    training: Mapping[str, Template] = field(default_factory=dict)
    resources: Mapping[str, Template] = field(default_factory=dict)
    output_uri: Template | None = None
    deadline: timedelta | None = None
    promote: PromotionPolicy | None = None
    """The `promote:` block: judge each adapter against the champion of the rule and key
    (`orchestrator/jobs/promotion.py`); None: no promotion step."""
    sweep: SweepSpec | None = None
    """The `sweep:` block: each launch runs trials of this template with varied
    hyperparameters (`orchestrator/sweeps/`); None: each launch is one job."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One trigger rule. `version` is a content hash: it changes when the rule's text does."""

    name: str
    version: str
    on: Selector
    key: Expression
    window: timedelta
    count: int
    launch: LaunchTemplate
    sum: SumCondition | None = None
    joins: tuple[Join, ...] = ()
    debounce: Debounce | None = None
    cooldown: timedelta = timedelta(0)
    concurrency: Concurrency = Concurrency.FORBID
    max_launches_per_day: int | None = None
    mode: Mode = Mode.LIVE
    location: SourceLocation | None = None

    @property
    def horizon(self) -> timedelta:
        """How far back in event time this rule can still need an event."""
        return max([self.window, *(join.within for join in self.joins)])


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits across all rules and keys (enforced by the wiring, see `engine.may_launch`)."""

    max_concurrent_jobs: int | None = None


@dataclass(frozen=True, slots=True)
class Trigger:
    """One way an event type reaches a rule: as its main (`on`) event or as a join."""

    rule: Rule
    join: Join | None = None
    # Derived once here rather than per event (the engine reads them for every event of the
    # type): the source globs, `where` and key expression that apply to this way in.
    sources: tuple[str, ...] = field(init=False, repr=False, compare=False)
    where: Expression | None = field(init=False, repr=False, compare=False)
    key: Expression = field(init=False, repr=False, compare=False)
    _sources: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        join = self.join
        derived = (
            (join.sources, None, join.key)
            if join is not None
            else (self.rule.on.sources, self.rule.on.where, self.rule.key)
        )
        for name, value in zip(("sources", "where", "key"), derived, strict=True):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_sources", source_pattern(self.sources))

    def accepts_source(self, source: str) -> bool:
        """Whether this way in accepts events from *source* (no globs: every source)."""
        return self._sources is None or self._sources.match(source) is not None


@dataclass(frozen=True, slots=True)
class RuleSet:
    """All rules in force, with the global settings and an index by event type.

    Built by `loading.load_rules`; `version` hashes every rule version and setting, so a
    reload that changes nothing is recognisable.
    """

    rules: tuple[Rule, ...]
    version: str
    allowed_lateness: timedelta = timedelta(0)
    runtimes: frozenset[str] = frozenset()
    limits: Limits = field(default_factory=Limits)
    files: tuple[str, ...] = ()
    by_type: Mapping[str, tuple[Trigger, ...]] = field(default_factory=dict, compare=False)
    by_name: Mapping[str, Rule] = field(default_factory=dict, compare=False)
    data_fields: Mapping[str, frozenset[str] | None] = field(default_factory=dict, compare=False)
    """Per event type, the `event.data` fields any expression reads (None: all of them)."""

    def rule(self, name: str) -> Rule:
        """The rule called *name*; KeyError when there is none."""
        return self.by_name[name]

    @classmethod
    def of(
        cls,
        rules: tuple[Rule, ...],
        *,
        version: str,
        allowed_lateness: timedelta = timedelta(0),
        runtimes: frozenset[str] = frozenset(),
        limits: Limits | None = None,
        files: tuple[str, ...] = (),
    ) -> RuleSet:
        """Build the set and its type index (rules are indexed by each type they read)."""
        index: dict[str, list[Trigger]] = {}
        fields: dict[str, frozenset[str] | None] = {}
        for rule in rules:
            for event_type in rule.on.types:
                index.setdefault(event_type, []).append(Trigger(rule))
                expressions = [rule.key, rule.on.where, rule.sum.of if rule.sum else None]
                fields[event_type] = _union(fields.get(event_type, frozenset()), expressions)
            for join in rule.joins:
                index.setdefault(join.type, []).append(Trigger(rule, join))
                fields[join.type] = _union(fields.get(join.type, frozenset()), [join.key])
        return cls(
            rules=rules,
            version=version,
            allowed_lateness=allowed_lateness,
            runtimes=runtimes,
            limits=limits or Limits(),
            files=files,
            by_type={name: tuple(triggers) for name, triggers in index.items()},
            by_name={rule.name: rule for rule in rules},
            data_fields=fields,
        )


def _union(
    fields: frozenset[str] | None, expressions: list[Expression | None]
) -> frozenset[str] | None:
    if fields is None:
        return None
    result = set(fields)
    for expression in expressions:
        if expression is None:
            continue
        if expression.data_fields is None:
            return None
        result |= expression.data_fields
    return frozenset(result)

"""How each Table of a worker names the rule key of an entry. Pure.

faust writes a Table's changelog record to the partition of the keyed record being processed,
so an entry lives on the partition of the rule key it was written under, not on a hash of the
Table's own key. To move an entry to another partition count, the migration
(`growing.py`) needs that rule key back from the entry itself:

| Table | its key | the rule key |
| --- | --- | --- |
| `tuneloop-rule-state` | the rule key | the key itself |
| `tuneloop-jobs` | a job name | `context.key` of the completion record (none: not placed) |
| `tuneloop-champions` | `<rule>/<key>` | after the first `/` (rule names hold none) |
| `tuneloop-seen` | `<key>\\x1f<source>\\x1f<id>` | before a `\\x1f` (each split: see below) |

Candidates are checked against the partition the entry was found on (`placing.placed`): an
entry whose candidates all hash elsewhere is reported and left behind, never moved by a guess.
A seen-set key's rule key ends at one of its `\\x1f`s; which one, when the key or the id holds
a `\\x1f` too, only that check tells. A seen-set entry also records its own partition
(`handlers/dedup.py`: it is forgotten only while that partition is processed), so its value
is restamped with the new one.

Keys and values are taken decoded, as faust's codecs give them: every Table key is a string
(faust's `json` codec, the default for a Table without `key_type`); values are decoded with
the Table's `value_serializer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from handlers.app import CHAMPIONS_TABLE, JOBS_TABLE, RULE_STATE_TABLE
from handlers.dedup import SEEN_TABLE
from orchestrator.errors import ConfigError

KEY_SERIALIZER = "json"
"""faust's codec of every worker Table's keys (strings, no `key_type`)."""

SEEN_SEPARATOR = "\x1f"
"""Between the rule key, the source and the id of a seen-set key (`handlers/dedup.py`)."""


@dataclass(frozen=True, slots=True)
class TableLayout:
    """What the migration needs to know about one Table of the worker."""

    name: str
    value_serializer: str
    """faust's codec of its values: `json`, or `raw` for a Table with `value_type=bytes`."""
    rule_keys: Callable[[str, Any], tuple[str, ...]]
    """The rule keys an entry (Table key, decoded value) may have been written under, the
    likeliest first."""
    restamp: Callable[[Any, int], Any] | None = None
    """The value to write when the entry moves to a new partition; None: the value as it is."""

    def changelog(self, group: str) -> str:
        """The Table's changelog topic in consumer group *group* (faust's naming)."""
        return f"{group}-{self.name}-changelog"


def _rule_state_keys(key: str, value: Any) -> tuple[str, ...]:
    del value
    return (key,)


def _job_keys(key: str, value: Any) -> tuple[str, ...]:
    del key
    context = value.get("context") if isinstance(value, Mapping) else None
    rule_key = context.get("key") if isinstance(context, Mapping) else None
    return (rule_key,) if isinstance(rule_key, str) and rule_key else ()


def _champion_keys(key: str, value: Any) -> tuple[str, ...]:
    del value
    rule, slash, rule_key = key.partition("/")
    return (rule_key,) if slash and rule else ()


def _seen_keys(key: str, value: Any) -> tuple[str, ...]:
    del value
    parts = key.split(SEEN_SEPARATOR)
    # <key>\x1f<source>\x1f<id>: at least the source and the id follow the rule key.
    return tuple(SEEN_SEPARATOR.join(parts[:end]) for end in range(1, len(parts) - 1))


def _seen_restamp(value: Any, partition: int) -> Any:
    if isinstance(value, list) and len(value) >= 2:
        return [value[0], partition, *value[2:]]
    return value


TABLES: Mapping[str, TableLayout] = {
    layout.name: layout
    for layout in (
        TableLayout(RULE_STATE_TABLE, "raw", _rule_state_keys),
        TableLayout(JOBS_TABLE, "json", _job_keys),
        TableLayout(CHAMPIONS_TABLE, "json", _champion_keys),
        TableLayout(SEEN_TABLE, "json", _seen_keys, restamp=_seen_restamp),
    )
}
"""Every Table a worker keeps (`handlers/app.py`, `handlers/intake.py`), by name."""


def layout_of(table: str) -> TableLayout:
    """The layout of the Table named *table*.

    Raises:
        ConfigError: tuneloop does not know how that Table's entries name their rule key, so
            its entries can't be placed: refuse rather than leave state behind unsaid.
    """
    layout = TABLES.get(table)
    if layout is None:
        raise ConfigError(
            f"the Table {table!r} is not one this version of tuneloop knows how to move (its "
            f"entries' rule keys are unknown; known: {', '.join(sorted(TABLES))}); run the "
            "migration of the version that wrote it"
        )
    return layout


def table_of_changelog(group: str, topic: str) -> str | None:
    """The Table name of *topic* if it is a tuneloop Table's changelog of *group*
    (`<group>-tuneloop-<name>-changelog`), else None."""
    prefix, suffix = f"{group}-", "-changelog"
    if not (topic.startswith(prefix + "tuneloop-") and topic.endswith(suffix)):
        return None
    return topic[len(prefix) : -len(suffix)]

"""Which event types tuneloop knows, and whether an event's `data` is what its type promises.

The intake (`handlers/intake.py`) calls `SchemaRegistry.validate` on every decoded event,
after the codec has checked the CloudEvents attributes and before any rule sees it. The
registry starts from the built-in vocabulary (`schemas/*.json`, one JSON Schema per
versioned `type`) and users add their own types from schema files (`with_schema_file`).

A type without a schema is accepted only when the caller says so (`accept_unknown`): the
rule engine decides that per type, so an unknown type cannot slip in by accident.

Registries are immutable values: `with_schema` returns a new registry, so a reload that
fails leaves the running one untouched.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import yaml
from jsonschema.protocols import Validator

from orchestrator.errors import ConfigError, InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.vocabulary.compiled_schemas import ProvesValid, compile_schema
from orchestrator.vocabulary.rejections import Rejection
from orchestrator.vocabulary.timestamps import parse_rfc3339

TYPE_MEMBER = "x-cloudevents-type"
"""Member of a user schema file naming the event type it describes; without it the file
name (minus `.json`/`.yaml`) is the type."""

_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("date-time", raises=InvalidEventError)
def _is_rfc3339(instance: object) -> bool:
    # jsonschema's own date-time check needs an optional package; ours is the codec's rule.
    if isinstance(instance, str):
        parse_rfc3339(instance)
    return True


def _is_rfc3339_text(text: str) -> bool:
    try:
        parse_rfc3339(text)
    except InvalidEventError:
        return False
    return True


class SchemaRegistry:
    """Event type -> JSON Schema of its `data`."""

    __slots__ = ("_proofs", "_schemas", "_validators")

    def __init__(
        self, schemas: Mapping[str, Mapping[str, Any]] | None = None, *, known_valid: bool = False
    ) -> None:
        """
        Args:
            schemas: JSON Schema of each event type's `data`.
            known_valid: the schemas are known to be valid JSON Schemas (tuneloop's own, which
                tests/unit/events/test_vocabulary.py checks), so they are not checked again.

        Raises:
            ConfigError: a schema is not a valid JSON Schema.
        """
        self._schemas: Mapping[str, Mapping[str, Any]] = MappingProxyType(dict(schemas or {}))
        self._validators: Mapping[str, Validator] = MappingProxyType(
            {
                name: _validator(name, schema, check=not known_valid)
                for name, schema in self._schemas.items()
            }
        )
        # Per type, the quickest way to say "valid": a compiled check where the schema allows
        # one, else jsonschema's own is_valid. Either way jsonschema judges a failure.
        self._proofs: Mapping[str, ProvesValid] = MappingProxyType(
            {name: _quick_check(validator) for name, validator in self._validators.items()}
        )

    @classmethod
    def builtin(cls) -> SchemaRegistry:
        """The registry of tuneloop's own vocabulary (`io.tuneloop.*`): one per process,
        shared (a registry never changes), its schemas not checked against the metaschema
        (a unit test does): checking them cost a worker's start some 40 ms each time."""
        return _builtin()

    @classmethod
    def _read_builtin(cls) -> SchemaRegistry:
        schemas: dict[str, Mapping[str, Any]] = {}
        folder = resources.files("orchestrator.vocabulary.schemas")
        for entry in sorted(folder.iterdir(), key=lambda item: item.name):
            if entry.name.endswith(".json"):
                schemas[entry.name.removesuffix(".json")] = json.loads(entry.read_text("utf-8"))
        return cls(schemas, known_valid=True)

    @property
    def types(self) -> tuple[str, ...]:
        """The event types with a schema, sorted."""
        return tuple(sorted(self._validators))

    def knows(self, event_type: str) -> bool:
        """Whether *event_type* has a schema."""
        return event_type in self._validators

    def schema_of(self, event_type: str) -> Mapping[str, Any]:
        """The JSON Schema registered for *event_type* (KeyError if none)."""
        return self._schemas[event_type]

    def with_schema(self, event_type: str, schema: Mapping[str, Any]) -> SchemaRegistry:
        """A registry that also knows *event_type* (replacing an earlier schema for it).

        Raises:
            ConfigError: the schema is not a valid JSON Schema.
        """
        merged = dict(self._schemas)
        merged[event_type] = schema
        return SchemaRegistry(merged)

    def with_schema_file(self, path: Path) -> SchemaRegistry:
        """A registry that also knows the type described by the JSON or YAML file *path*.

        Raises:
            ConfigError: the file cannot be read or parsed, or is not a valid JSON Schema;
                the message names the file.
        """
        try:
            text = path.read_text("utf-8")
            schema = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"schema file {path}: {exc}") from exc
        if not isinstance(schema, dict):
            raise ConfigError(f"schema file {path}: the top level must be an object")
        event_type = schema.get(TYPE_MEMBER, path.stem)
        if not isinstance(event_type, str) or not event_type:
            raise ConfigError(f"schema file {path}: {TYPE_MEMBER} must be a non-empty string")
        try:
            return self.with_schema(event_type, schema)
        except ConfigError as exc:
            raise ConfigError(f"schema file {path}: {exc}") from exc

    def validate(self, event: CloudEvent, *, accept_unknown: bool = False) -> None:
        """Check `event.data` against the schema of `event.type`.

        Args:
            event: an event that already passed the codec's attribute rules.
            accept_unknown: let a type without a schema through (a rule allows it).

        Raises:
            InvalidEventError: `type.unknown` or `data.schema_mismatch`, naming the failing
                place in the data.
        """
        proves_valid = self._proofs.get(event.type)
        if proves_valid is None:
            if accept_unknown:
                return
            raise InvalidEventError(
                Rejection.TYPE_UNKNOWN,
                f"no schema is registered for type {event.type!r} and no rule accepts it",
            )
        if isinstance(event.data, bytes | bytearray):
            raise InvalidEventError(
                Rejection.DATA_SCHEMA_MISMATCH,
                f"type {event.type!r} needs JSON data, got {event.datacontenttype!r} bytes",
            )
        if proves_valid(event.data):
            return
        # Invalid (or beyond the compiled check): jsonschema decides and names the place.
        validator = self._validators[event.type]
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(event.data))
        except InvalidEventError as exc:  # a date-time format check failed
            raise InvalidEventError(Rejection.DATA_SCHEMA_MISMATCH, exc.message) from exc
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "(the data)"
            raise InvalidEventError(
                Rejection.DATA_SCHEMA_MISMATCH,
                f"type {event.type!r} at {where}: {_shorten(error.message)}",
            )


@functools.cache
def _builtin() -> SchemaRegistry:
    return SchemaRegistry._read_builtin()


def _validator(event_type: str, schema: Mapping[str, Any], *, check: bool = True) -> Validator:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        if check:
            cls.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"schema for {event_type!r} is invalid: {exc.message}") from exc
    validator: Validator = cls(dict(schema), format_checker=_FORMATS)
    return validator


_COMPILED_DRAFTS = (
    jsonschema.Draft6Validator,
    jsonschema.Draft7Validator,
    jsonschema.Draft201909Validator,
    jsonschema.Draft202012Validator,
)
"""Drafts whose keywords mean what `compiled_schemas` assumes (draft 4 and 3 differ:
boolean exclusiveMinimum, required inside properties)."""


def _quick_check(validator: Validator) -> ProvesValid:
    if type(validator) not in _COMPILED_DRAFTS:
        return validator.is_valid
    proof = compile_schema(
        validator.schema,
        known_keywords=type(validator).VALIDATORS,
        formats={"date-time": _is_rfc3339_text},
        checked_formats=_FORMATS.checkers,
    )
    return validator.is_valid if proof is None else proof


def _shorten(text: str, limit: int = 300) -> str:
    # Messages quote the offending value, which may be a large blob; the DLQ header stays small.
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The CloudEvents JSON event format: a `CloudEvent` as a JSON object, and back, spec-exact.

One form for every place that writes an event as JSON: the codec's structured mode and
batches (`handlers/codec.py`), the events a rule key's state holds (`rules/state.py`:
buffered, joined and waiting events), and the JSON Lines files `tuneloop simulate` reads.
Reading checks every attribute rule of CloudEvents 1.0 and fails with an `InvalidEventError`
whose `Rejection` code says what is wrong; the codec's binary mode, whose attributes come from
Kafka headers, uses the same rules through `from_attributes`.

- Attributes: `id`, `source`, `specversion` ("1.0"), `type` required and non-empty; names
  `[a-z0-9]+` and not `data`; `source` a URI-reference, `dataschema` an absolute URI,
  `time` and `expirytime` RFC 3339 with an offset, `datacontenttype` an RFC 2046 media type;
  extensions strings, 32-bit integers or booleans. A null attribute is an absent one.
- Data: `data` carries a JSON value, `data_base64` bytes; not both.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from orchestrator.errors import InvalidEventError
from orchestrator.events import CloudEvent, ExtensionValue
from orchestrator.vocabulary.rejections import Rejection
from orchestrator.vocabulary.timestamps import format_rfc3339, parse_rfc3339

_CONTEXT_ATTRIBUTES = frozenset(
    {"id", "source", "specversion", "type", "subject", "time", "datacontenttype", "dataschema"}
)
_REQUIRED = ("id", "source", "specversion", "type")
_COMMON_NAMES = _CONTEXT_ATTRIBUTES | {"partitionkey", "expirytime"}
"""Attribute names known to be valid, so the name rule need not run its regex on them."""
_NAME = re.compile(r"[a-z0-9]+")
# RFC 3986 characters (unreserved, reserved, and '%' for percent-encoding).
_URI_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9!#$&^_.+\-]+/[A-Za-z0-9!#$&^_.+\-]+(\s*;.*)?", re.DOTALL)
_INT32 = (-(2**31), 2**31 - 1)


def to_json(event: CloudEvent) -> dict[str, Any]:
    """*event* in the JSON event format, as a mapping (bytes data as `data_base64`)."""
    envelope: dict[str, Any] = {
        "specversion": event.specversion,
        "id": event.id,
        "source": event.source,
        "type": event.type,
    }
    for name, value in (
        ("subject", event.subject),
        ("time", None if event.time is None else format_rfc3339(event.time)),
        ("datacontenttype", event.datacontenttype),
        ("dataschema", event.dataschema),
    ):
        if value is not None:
            envelope[name] = value
    envelope.update(event.extensions)
    if isinstance(event.data, bytes | bytearray):
        envelope["data_base64"] = base64.b64encode(bytes(event.data)).decode("ascii")
    elif event.data is not None:
        envelope["data"] = event.data
    return envelope


def from_json(envelope: object, *, key: str | None = None) -> CloudEvent:
    """The event a JSON event format object describes.

    Args:
        envelope: the decoded JSON object.
        key: the Kafka record key, which fills `partitionkey` when the event has none.

    Raises:
        InvalidEventError: with a `Rejection` code saying what is wrong.
    """
    if not isinstance(envelope, Mapping):
        raise InvalidEventError(Rejection.ENVELOPE_NOT_OBJECT, "the event is not a JSON object")
    members = dict(envelope)
    has_data = "data" in members
    has_base64 = "data_base64" in members
    if has_data and has_base64:
        raise InvalidEventError(Rejection.DATA_CONFLICT, "both data and data_base64 are set")
    data: Any = members.pop("data", None)
    encoded = members.pop("data_base64", None)
    if encoded is not None:
        if not isinstance(encoded, str):
            raise InvalidEventError(Rejection.DATA_CONFLICT, "data_base64 is not a string")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidEventError(Rejection.DATA_CONFLICT, "data_base64 is not base64") from None
    # The JSON format says a null attribute value is the same as an absent attribute.
    attributes = {name: value for name, value in members.items() if value is not None}
    return from_attributes(attributes, data, key=key)


def from_attributes(attributes: Mapping[str, Any], data: Any, *, key: str | None) -> CloudEvent:
    """The event of these context and extension *attributes* and *data*.

    Raises:
        InvalidEventError: with a `Rejection` code saying which attribute rule is broken.
    """
    _check_names_and_required(attributes)
    _check_formats(attributes)
    source: str = attributes["source"]
    dataschema = attributes.get("dataschema")
    content_type = attributes.get("datacontenttype")
    time_text = attributes.get("time")
    extensions: dict[str, ExtensionValue] = {}
    for name, value in attributes.items():
        if name in _CONTEXT_ATTRIBUTES:
            continue
        extensions[name] = _extension_value(name, value)
    if "expirytime" in extensions:
        parse_rfc3339(str(extensions["expirytime"]), attribute="expirytime")
    if key is not None and "partitionkey" not in extensions:
        extensions["partitionkey"] = key
    return CloudEvent(
        id=attributes["id"],
        source=source,
        type=attributes["type"],
        specversion="1.0",
        subject=attributes.get("subject"),
        time=None if time_text is None else parse_rfc3339(time_text, attribute="time"),
        datacontenttype=content_type,
        dataschema=dataschema,
        data=data,
        extensions=MappingProxyType(extensions),
    )


def _check_names_and_required(attributes: Mapping[str, Any]) -> None:
    for name in attributes:
        if name not in _COMMON_NAMES and (not _NAME.fullmatch(name) or name == "data"):
            raise InvalidEventError(
                Rejection.ATTRIBUTE_NAME_INVALID,
                f"attribute name {name!r} must be lower-case a-z and 0-9 and not 'data'",
            )
    for name in _REQUIRED:
        if name not in attributes:
            raise InvalidEventError(Rejection.ATTRIBUTE_MISSING, f"required {name!r} is missing")
    for name in _CONTEXT_ATTRIBUTES:
        value = attributes.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidEventError(
                Rejection.ATTRIBUTE_INVALID,
                f"{name!r} must be a string, got {type(value).__name__}",
            )
    if attributes["specversion"] != "1.0":
        raise InvalidEventError(
            Rejection.SPECVERSION_UNSUPPORTED,
            f"specversion {attributes['specversion']!r} is not supported (only '1.0')",
        )
    for name in ("id", "source", "type", "subject"):
        if name in attributes and attributes[name] == "":
            raise InvalidEventError(Rejection.ATTRIBUTE_INVALID, f"{name!r} must not be empty")


def _check_formats(attributes: Mapping[str, Any]) -> None:
    source: str = attributes["source"]
    if not _URI_CHARS.fullmatch(source):
        raise InvalidEventError(
            Rejection.ATTRIBUTE_INVALID, f"source {source!r} is not a URI-reference"
        )
    dataschema = attributes.get("dataschema")
    if dataschema is not None and not (
        _URI_CHARS.fullmatch(dataschema) and _URI_SCHEME.match(dataschema)
    ):
        raise InvalidEventError(
            Rejection.ATTRIBUTE_INVALID, f"dataschema {dataschema!r} is not an absolute URI"
        )
    content_type = attributes.get("datacontenttype")
    if content_type is not None and not _MEDIA_TYPE.fullmatch(content_type.strip()):
        raise InvalidEventError(
            Rejection.ATTRIBUTE_INVALID,
            f"datacontenttype {content_type!r} is not an RFC 2046 media type",
        )


def _extension_value(name: str, value: Any) -> ExtensionValue:
    # JSON gives bool for true/false and int for integral numbers; both are CloudEvents types.
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int) and _INT32[0] <= value <= _INT32[1]:
        return value
    raise InvalidEventError(
        Rejection.ATTRIBUTE_INVALID,
        f"extension {name!r} must be a string, a 32-bit integer or a boolean",
    )

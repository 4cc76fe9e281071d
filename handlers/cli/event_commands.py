"""`tuneloop emit`: send one CloudEvent (or a batch) to Kafka, as a producer would.

For producers trying tuneloop out, for the demo and for the docs' examples. The event comes
from flags or from a JSON file in the CloudEvents JSON format (one event, or an array for a
batch); either way it passes the same codec rules the intake applies, so what `emit` accepts
the intake accepts too (data schemas aside: those are the intake's business).

Exit codes: 0 sent (or printed with `--dry-run`); 1 invalid event, unreadable file or no
broker; 2 wrong command-line usage (typer's own).
"""

from __future__ import annotations

import asyncio
import enum
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

import typer

from handlers.codec import (
    STRUCTURED_CONTENT_TYPE,
    EncodingMode,
    KafkaRecord,
    decode_record,
    encode_batch,
    encode_event,
)
from handlers.publishing import KafkaEventPublisher
from orchestrator.errors import ConfigError, InvalidEventError, TransientBackendError
from orchestrator.events import CloudEvent, ExtensionValue
from orchestrator.settings import Settings

NO_SIZE_LIMIT = 1 << 40
"""The intake enforces the size limit; `emit` leaves that to the broker."""


class WireMode(enum.StrEnum):
    """The binding's modes for one event (an array in `--file` is always a batch)."""

    BINARY = "binary"
    STRUCTURED = "structured"


_ENCODING = {WireMode.BINARY: EncodingMode.BINARY, WireMode.STRUCTURED: EncodingMode.STRUCTURED}


def register(app: typer.Typer) -> None:
    """Add this module's commands to *app*."""
    app.command("emit")(emit)


def emit(
    *,
    event_type: Annotated[
        str | None,
        typer.Option("--type", help="CloudEvent type, e.g. io.tuneloop.drift.detected.v1."),
    ] = None,
    source: Annotated[
        str, typer.Option(help="CloudEvent source (a URI-reference).")
    ] = "/tuneloop/cli",
    event_id: Annotated[
        str | None, typer.Option("--id", help="CloudEvent id; a fresh UUID when omitted.")
    ] = None,
    subject: Annotated[str | None, typer.Option(help="CloudEvent subject.")] = None,
    time: Annotated[
        str | None, typer.Option(help="RFC 3339 time of the event; now when omitted.")
    ] = None,
    data: Annotated[str | None, typer.Option(help="The data, as JSON text.")] = None,
    data_file: Annotated[
        Path | None,
        typer.Option(
            help="Read the data from this file (JSON unless --content-type says otherwise)."
        ),
    ] = None,
    content_type: Annotated[
        str, typer.Option(help="datacontenttype of the data.")
    ] = "application/json",
    dataschema: Annotated[str | None, typer.Option(help="dataschema URI.")] = None,
    extension: Annotated[
        list[str] | None,
        typer.Option("--ext", help="Extension attribute NAME=VALUE (repeatable)."),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="A CloudEvent in the JSON format (or an array of them: sent as one batch "
            "record). Replaces the attribute flags.",
        ),
    ] = None,
    mode: Annotated[
        WireMode,
        typer.Option(help="binary (ce_* headers) or structured (one JSON envelope)."),
    ] = WireMode.BINARY,
    key: Annotated[
        str | None,
        typer.Option(help="Record key; also set as the partitionkey extension (the rule key)."),
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option(help="Brokers host:port[,...]; default TUNELOOP_KAFKA_BOOTSTRAP.")
    ] = None,
    topic: Annotated[
        str | None, typer.Option(help="Topic; default the first of TUNELOOP_KAFKA_TOPICS_IN.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the record instead of sending it.")
    ] = False,
) -> None:
    """Send a CloudEvent to Kafka (binary mode by default)."""
    try:
        settings = Settings.from_env()
        if file is not None:
            record = _record_from_file(file, mode=_ENCODING[mode], key=key)
        else:
            if event_type is None:
                raise _fail("give --type (and the other attributes) or --file")
            event = _event_from_flags(
                event_type=event_type,
                source=source,
                event_id=event_id,
                subject=subject,
                time=time,
                data=data,
                data_file=data_file,
                content_type=content_type,
                dataschema=dataschema,
                extensions=extension or [],
                key=key,
            )
            record = encode_event(event, mode=_ENCODING[mode])
        # What the intake would read back: refuse here what it would dead-letter there.
        decoded = decode_record(record, max_event_bytes=NO_SIZE_LIMIT)
    except (InvalidEventError, ConfigError, ValueError, OSError) as exc:
        raise _fail(f"not sent: {exc}") from exc
    target = topic or settings.kafka.topics_in[0]
    if dry_run:
        typer.echo(json.dumps(_describe(record, target), indent=2, ensure_ascii=False))
        return
    kafka = settings.kafka
    if bootstrap is not None:
        kafka = replace(kafka, bootstrap=bootstrap)
    try:
        asyncio.run(_send(kafka, record, target))
    except TransientBackendError as exc:
        raise _fail(f"not sent: {exc}") from exc
    ids = ", ".join(event.id for event in decoded)
    typer.echo(f"sent {len(decoded)} event(s) to {target}: {ids}")


async def _send(kafka: Any, record: KafkaRecord, topic: str) -> None:
    async with KafkaEventPublisher(kafka) as publisher:
        await publisher.publish_record(record, topic=topic)


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(1)


def _event_from_flags(
    *,
    event_type: str,
    source: str,
    event_id: str | None,
    subject: str | None,
    time: str | None,
    data: str | None,
    data_file: Path | None,
    content_type: str,
    dataschema: str | None,
    extensions: list[str],
    key: str | None,
) -> CloudEvent:
    if data is not None and data_file is not None:
        raise ValueError("give --data or --data-file, not both")
    payload: Any = None
    is_json = content_type.split(";", 1)[0].strip().lower().endswith("json")
    if data_file is not None:
        raw = data_file.read_bytes()
        payload = json.loads(raw) if is_json else raw
    elif data is not None:
        payload = json.loads(data) if is_json else data.encode("utf-8")
    attributes: dict[str, ExtensionValue] = {}
    for item in extensions:
        name, separator, value = item.partition("=")
        if not separator:
            raise ValueError(f"--ext {item!r} is not NAME=VALUE")
        attributes[name] = value
    if key is not None:
        attributes["partitionkey"] = key
    envelope: dict[str, Any] = {
        "specversion": "1.0",
        "id": event_id or str(uuid.uuid4()),
        "source": source,
        "type": event_type,
        "time": time or datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "datacontenttype": content_type,
        **attributes,
    }
    if subject is not None:
        envelope["subject"] = subject
    if dataschema is not None:
        envelope["dataschema"] = dataschema
    # Build through the codec so that flags meet exactly the rules a record would.
    (event,) = decode_record(
        KafkaRecord(
            value=json.dumps(envelope).encode("utf-8"),
            headers=(("content-type", STRUCTURED_CONTENT_TYPE.encode("ascii")),),
        ),
        max_event_bytes=NO_SIZE_LIMIT,
    )
    return CloudEvent(
        id=event.id,
        source=event.source,
        type=event.type,
        subject=event.subject,
        time=event.time,
        datacontenttype=event.datacontenttype,
        dataschema=event.dataschema,
        data=payload,
        extensions=event.extensions,
    )


def _record_from_file(path: Path, *, mode: EncodingMode, key: str | None) -> KafkaRecord:
    parsed = json.loads(path.read_text("utf-8"))
    header = (
        "application/cloudevents-batch+json"
        if isinstance(parsed, list)
        else "application/cloudevents+json"
    )
    events = decode_record(
        KafkaRecord(value=path.read_bytes(), headers=(("content-type", header.encode()),)),
        max_event_bytes=NO_SIZE_LIMIT,
    )
    if key is not None:
        events = tuple(_with_extensions(event, partitionkey=key) for event in events)
    if isinstance(parsed, list):
        return encode_batch(events)
    return encode_event(events[0], mode=mode)


def _with_extensions(event: CloudEvent, **extensions: ExtensionValue) -> CloudEvent:
    return replace(event, extensions=MappingProxyType({**event.extensions, **extensions}))


def _describe(record: KafkaRecord, topic: str) -> dict[str, Any]:
    value: Any
    if record.value is None:
        value = None
    else:
        try:
            value = record.value.decode("utf-8")
        except UnicodeDecodeError:
            value = f"<{len(record.value)} bytes>"
    return {
        "topic": topic,
        "key": None if record.key is None else record.key.decode("utf-8", errors="replace"),
        "headers": [
            f"{name}: {raw.decode('utf-8', errors='replace')}" for name, raw in record.headers
        ],
        "value": value,
    }

"""`tuneloop tail`: print the CloudEvents on a topic, e.g. the completions or the audit trail.

For people and scripts: one JSON object per event on stdout (the CloudEvents JSON format), a
record that is not a CloudEvent as a line saying so on stderr. `--until TYPE` stops at the
first event of that type (exit 0), `--timeout` gives up (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `tail` to *app*."""

    @app.command()
    def tail(
        topic: Annotated[str, typer.Argument(help="The topic to read, from its beginning.")],
        until: Annotated[
            str | None, typer.Option(help="Stop after the first event of this type.")
        ] = None,
        timeout: Annotated[float, typer.Option(help="Seconds before giving up.")] = 60.0,
        bootstrap: Annotated[
            str | None, typer.Option(help="Brokers; default TUNELOOP_KAFKA_BOOTSTRAP.")
        ] = None,
    ) -> None:
        """Print the CloudEvents on TOPIC as JSON lines."""
        from orchestrator.settings import Settings

        servers = bootstrap or Settings.from_env().kafka.bootstrap
        found = asyncio.run(_tail(servers, topic, until=until, timeout=timeout))
        if until is not None and not found:
            typer.echo(f"tuneloop tail: no {until} on {topic} within {timeout:g} s", err=True)
            raise typer.Exit(1)


async def _tail(bootstrap: str, topic: str, *, until: str | None, timeout: float) -> bool:
    from aiokafka import AIOKafkaConsumer

    from handlers.codec import KafkaRecord, decode_record, envelope_of
    from orchestrator.errors import InvalidEventError

    # Committed records only: the intake's dead letters and forwards are written in transactions.
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for message in records:
                    record = KafkaRecord(
                        value=message.value, headers=tuple(message.headers), key=message.key
                    )
                    try:
                        events = decode_record(record, max_event_bytes=100_000_000)
                    except InvalidEventError as exc:
                        print(f"offset {message.offset}: not a CloudEvent: {exc}", file=sys.stderr)
                        continue
                    for event in events:
                        print(json.dumps(envelope_of(event)), flush=True)
                        if until is not None and event.type == until:
                            return True
        return until is None
    finally:
        await consumer.stop()

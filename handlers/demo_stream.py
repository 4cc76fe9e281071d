"""The demo's side of Kafka: the events it emits, and what it reads back to narrate.

`DemoStream` holds one producer on the input topic and two consumers, of the audit topic
(the worker's decisions) and of the output topic (the job's events, then the hand-off's).
Every wait has the run's deadline and checks the processes it waits on (`DemoProcess.check`),
so that a worker or hand-off that died ends the demo with its log, not with a timeout.
Called by `handlers/demo.py`, step by step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from handlers.codec import KafkaRecord, decode_record, encode_event
from handlers.demo_processes import DemoProcess
from handlers.demo_run import MODEL_ID, DemoError, DemoRun, DemoTopics, say
from orchestrator.events import CloudEvent
from orchestrator.vocabulary.output import EventType

PROGRESS_EVERY = 5.0
"""Seconds between two progress lines of the trainer when the output is not a terminal."""


def create_topics(bootstrap: str, topics: DemoTopics) -> None:
    """The run's topics, one partition each (`tuneloop handoff` makes its ledger itself,
    compacted, as it does anywhere)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            {name: {"num_partitions": 1, "replication_factor": 1} for name in topics.plain},
            wait_for_metadata=True,
        )
    finally:
        admin.close()


def data_arrived(run: DemoRun, n: int) -> CloudEvent:
    """New rows for the model: the dataset's `s3://` location, which the rule trains on."""
    data = {
        "dataset_id": "unit-conversions",
        "model_id": MODEL_ID,
        "uri": run.dataset_uri,
        "rows": sum(1 for _ in run.dataset.open(encoding="utf-8")),
        "format": "jsonl",
        "version": str(n),
    }
    return _event("data.arrived", n, data, "/pipelines/units-export")


def drift(n: int, value: float) -> CloudEvent:
    """A drift alarm for the model; the rule counts those above their threshold."""
    data = {
        "model_id": MODEL_ID,
        "metric": "answer_quality_psi",
        "value": value,
        "threshold": 0.2,
        "detector": "demo",
    }
    return _event("drift.detected", n, data, "/monitors/quality")


def _event(kind: str, n: int, data: dict[str, Any], source: str) -> CloudEvent:
    return CloudEvent(
        id=f"demo-{kind}-{n}",
        source=source,
        type=f"io.tuneloop.{kind}.v1",
        subject=MODEL_ID,
        time=datetime.now(UTC),
        datacontenttype="application/json",
        data=data,
    )


@contextlib.asynccontextmanager
async def demo_stream(
    bootstrap: str, topics: DemoTopics, *, deadline: float
) -> AsyncIterator[DemoStream]:
    """The producer and the two consumers, started; stopped on exit."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    # The topics are the run's own, made empty a moment ago: read each from its beginning.
    audit = AIOKafkaConsumer(
        topics.audit, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    out = AIOKafkaConsumer(
        topics.finetune, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    clients: tuple[AIOKafkaProducer | AIOKafkaConsumer, ...] = (producer, audit, out)
    try:
        for client in clients:
            await client.start()
        yield DemoStream(producer, audit, out, topic_in=topics.events, deadline=deadline)
    finally:
        for client in clients:
            await _close(client)


async def _close(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    # aiokafka's consumer can raise the CancelledError of its own in-flight fetch from
    # stop(); the demo is over by then, so a noisy close must not turn success into failure.
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await client.stop()


class DemoStream:
    """What the demo sends and reads back, each wait bounded by the run's deadline."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        audit: AIOKafkaConsumer,
        out: AIOKafkaConsumer,
        *,
        topic_in: str,
        deadline: float,
    ) -> None:
        self._topic_in = topic_in
        self._producer = producer
        self._audit = audit
        self._out = out
        self._deadline = deadline

    async def emit(self, event: CloudEvent) -> None:
        record = encode_event(event)
        await self._producer.send_and_wait(
            self._topic_in, value=record.value, key=record.key, headers=list(record.headers)
        )
        shown = {k: v for k, v in event.data.items() if k in ("model_id", "value", "rows", "uri")}
        say(f"      → emitted {event.type} id={event.id} {json.dumps(shown)}")

    async def await_launch(self, worker: DemoProcess) -> str:
        """Show the worker's decisions until one launches a job; return the job's name."""
        while True:
            for record in await self._next(self._audit, worker, waiting_for="its decisions"):
                _show_decision(record)
                if record.data["outcome"] == "launch":
                    return str(record.data["job"]["name"])

    async def await_decisions(self, worker: DemoProcess, *, want: int) -> None:
        """Show the worker's next *want* decisions."""
        seen = 0
        while seen < want:
            for record in await self._next(self._audit, worker, waiting_for="its decisions"):
                _show_decision(record)
                seen += 1

    async def follow_training(self, run: DemoRun, job: str, worker: DemoProcess) -> CloudEvent:
        """Show the trainer's progress until the job's completion event; return it.

        Raises:
            DemoError: the job failed (the event's data says why), or the worker died.
        """
        from handlers.app import progress_bar

        progress = _Progress(run.jobs / job / "stdout.log")
        bar = progress_bar(sys.stdout) if sys.stdout.isatty() else None
        while True:
            progress.show(bar)
            for event in await self._next(self._out, worker, waiting_for=f"job {job}"):
                say(f"      ← {event.type} id={event.id}")
                if event.type == EventType.FINETUNE_COMPLETED:
                    return event
                if event.type == EventType.FINETUNE_FAILED:
                    raise DemoError(
                        f"the job failed: {json.dumps(event.data)[:2000]} "
                        f"(its files: {run.jobs / job})"
                    )

    async def await_served(self, job: str, handoff: DemoProcess) -> CloudEvent:
        """Show the hand-off's events about *job* until one says it is served; return it.

        Raises:
            DemoError: vLLM refused the adapter (the event's reason and message say why), or
                the hand-off died.
        """
        while True:
            for event in await self._next(self._out, handoff, waiting_for="the hand-off"):
                if event.data.get("job") != job:
                    continue
                if event.type == EventType.ADAPTER_SERVED:
                    say(f"      ← {event.type} lora_name={event.data['lora_name']}")
                    return event
                if event.type == EventType.ADAPTER_HANDOFF_FAILED:
                    say(f"      ← {event.type} reason={event.data['reason']}")
                    if not event.data["will_retry"]:
                        raise DemoError(f"the hand-off failed: {event.data['message']}")

    async def _next(
        self, consumer: AIOKafkaConsumer, process: DemoProcess, *, waiting_for: str
    ) -> list[CloudEvent]:
        process.check()
        if time.monotonic() > self._deadline:
            raise DemoError(
                f"timed out waiting for {waiting_for} (see {process.what}'s log {process.log})"
            )
        batches = await consumer.getmany(timeout_ms=500)
        return [_decode(m) for records in batches.values() for m in records]


def _decode(message: Any) -> CloudEvent:
    record = KafkaRecord(value=message.value, headers=tuple(message.headers), key=message.key)
    return decode_record(record, max_event_bytes=50_000_000)[0]


def _show_decision(record: CloudEvent) -> None:
    data = record.data
    reason = f" ({data['reason']})" if data.get("reason") else ""
    job = f" job={data['job']['name']}" if data.get("job") else ""
    counted = f" window={data['window_count']}" if data.get("window_count") is not None else ""
    say(f"      decision: {data['outcome']}{reason}{counted}{job} — {data.get('message', '')}")


class _Progress:
    """The trainer's JSON progress lines (its `stdout.log`), shown as they are written: through
    the trainer's own bar on a terminal, else one line every `PROGRESS_EVERY` seconds."""

    def __init__(self, log: Path) -> None:
        self._log = log
        self._offset = 0
        self._last_line = 0.0

    def show(self, bar: Any) -> None:
        if not self._log.exists():
            return
        with self._log.open(encoding="utf-8", errors="replace") as stream:
            stream.seek(self._offset)
            for line in stream:
                if not line.endswith("\n"):
                    break
                self._offset += len(line.encode("utf-8"))
                self._show_line(line, bar)

    def _show_line(self, line: str, bar: Any) -> None:
        try:
            fields = json.loads(line)
        except ValueError:
            return
        event = fields.pop("event", "")
        if bar is not None:
            bar.emit(event, **fields)
            return
        now = time.monotonic()
        recent = now - self._last_line < PROGRESS_EVERY
        if event == "progress" and recent and not fields.get("final"):
            return
        say(f"      [train] {event} {_details(fields)}")
        self._last_line = now


def _details(fields: dict[str, Any]) -> str:
    keys = (
        *("step", "total_steps", "loss", "tokens_per_second", "eta_seconds", "stage"),
        *("examples", "file", "files", "adapter_uri", "manifest_uri", "skipped"),
    )
    return " ".join(f"{k}={_short(fields[k])}" for k in keys if fields.get(k) is not None)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def event_json(event: CloudEvent) -> dict[str, Any]:
    """The event as structured-mode JSON, for the narration."""
    return {
        "specversion": event.specversion,
        "type": event.type,
        "source": event.source,
        "id": event.id,
        "subject": event.subject,
        "time": event.time.isoformat() if event.time else None,
        **dict(event.extensions.items()),
        "data": event.data,
    }

"""`tuneloop demo` (`make demo`): the whole loop on one machine, narrated.

1. start a real Kafka broker on 127.0.0.1 (jars from the cache; `make demo` resolved them);
2. start a real worker, `tuneloop run --backend local`, as a separate process;
3. emit a `data.arrived` event and two `drift.detected` alarms for one model: the example rule
   fires once; two more alarms are then suppressed (cooldown) — every decision is read back
   from the audit topic;
4. the local backend runs the LoRA trainer on SmolLM2-135M (or the tiny model with
   `TUNELOOP_DEMO_MODEL=tiny`) over the dataset shipped with the package
   (`handlers/demo_data/`), with a progress bar;
5. print the `finetune.completed` event read back from the output topic, then a generation
   from the base model and from the adapter on one prompt;
6. stop everything it started.

Everything it writes goes under one run directory (printed at the start; `--keep` keeps it).
It reads no repository file, so it runs from an installed wheel: its rules and data are
package data, the trainer's progress bar and generation come from the composition root
(`handlers/app.py`), and the broker from `devservices/`, imported when the demo starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from handlers import demo_data
from handlers.codec import KafkaRecord, decode_record, encode_event
from orchestrator.events import CloudEvent

DATA = resources.files(demo_data)
"""The demo's rules (`rules.yaml`) and dataset (`unit-conversions.jsonl`), package data."""
DATASET_VARIABLE = "TUNELOOP_DEMO_DATASET"
"""Names a JSON Lines file to fine-tune on instead of the shipped dataset."""
MODEL_ID = "units-assistant"
TOPICS = {"in": "demo.events", "out": "demo.finetune", "audit": "demo.audit", "dlq": "demo.dlq"}
MODELS = {"smollm2": "smollm2-135m", "smollm2-135m": "smollm2-135m", "tiny": "tiny"}


class DemoError(Exception):
    """The demo could not finish; the message says which step and where the logs are."""


@dataclass(frozen=True, slots=True)
class DemoRun:
    """Where one demo run keeps its files."""

    root: Path
    model: str

    @property
    def rules(self) -> Path:
        return self.root / "rules.yaml"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def worker_log(self) -> Path:
        return self.root / "worker.log"

    @property
    def dataset(self) -> Path:
        """The data the fine-tune learns from, copied here so that the trainer reads a file."""
        return self.root / "dataset.jsonl"


def say(message: str) -> None:
    print(message, flush=True)


def step(number: int, total: int, message: str) -> None:
    say(f"\n[{number}/{total}] {message}")


def run_demo(*, model: str, keep: bool, timeout: float = 900.0) -> int:
    """Run the demo; return the process exit code."""
    if model not in MODELS:
        raise DemoError(f"unknown demo model {model!r}: use one of {sorted(MODELS)}")
    from devservices.kafka import kafka_for_tests  # tooling: imported only when a demo runs

    # A SIGTERM (a CI timeout, `kill`) must unwind like Ctrl-C, so that the broker, the worker
    # and a running trainer are stopped by the clean-up below instead of being orphaned.
    signal.signal(signal.SIGTERM, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="tuneloop-demo-"))
    run = DemoRun(root=root, model=MODELS[model])
    say(f"tuneloop demo — model {run.model}, files under {root}")
    try:
        with contextlib.ExitStack() as stack:
            step(1, 6, "Kafka: starting a single-node KRaft broker on 127.0.0.1")
            started = time.monotonic()
            kafka = stack.enter_context(kafka_for_tests(root / "kafka"))
            say(f"      ready at {kafka.bootstrap} in {time.monotonic() - started:.1f} s")
            _create_topics(kafka.bootstrap)
            _write_rules(run)
            _write_dataset(run)
            step(2, 6, "worker: tuneloop run --backend local (its log: worker.log)")
            stack.enter_context(_worker(run, kafka.bootstrap))
            return asyncio.run(_drive(run, kafka.bootstrap, timeout=timeout))
    finally:
        if keep:
            say(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _write_dataset(run: DemoRun) -> None:
    own = os.environ.get(DATASET_VARIABLE)
    if own:
        shutil.copyfile(own, run.dataset)
    else:
        run.dataset.write_bytes(DATA.joinpath("unit-conversions.jsonl").read_bytes())


def _write_rules(run: DemoRun) -> None:
    text = DATA.joinpath("rules.yaml").read_text(encoding="utf-8")
    run.rules.write_text(
        text.replace("base_model: smollm2-135m", f"base_model: {run.model}"), encoding="utf-8"
    )


@contextlib.contextmanager
def _worker(run: DemoRun, bootstrap: str) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env.update(
        TUNELOOP_KAFKA_BOOTSTRAP=bootstrap,
        TUNELOOP_KAFKA_TOPICS_IN=TOPICS["in"],
        TUNELOOP_KAFKA_TOPIC_OUT=TOPICS["out"],
        TUNELOOP_KAFKA_TOPIC_AUDIT=TOPICS["audit"],
        TUNELOOP_KAFKA_TOPIC_DLQ=TOPICS["dlq"],
        TUNELOOP_KAFKA_GROUP_ID="tuneloop-demo",
        TUNELOOP_KAFKA_INTERNAL_PARTITIONS="1",
    )
    command = [
        sys.executable,
        "-m",
        "handlers.cli.main",
        "run",
        "--rules",
        str(run.rules),
        "--backend",
        "local",
        "--local-root",
        str(run.jobs),
        "--log-level",
        "warning",
    ]
    with run.worker_log.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=run.root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        _stop(process)
        for job in run.jobs.glob("*/"):
            _stop_job(job)


def _stop(process: subprocess.Popen[bytes], *, grace: float = 20.0) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _stop_job(job_dir: Path) -> None:
    """A trainer still running when the demo ends (it was interrupted) is stopped too."""
    started = job_dir / "started.json"
    if not started.exists() or (job_dir / "exit.json").exists():
        return
    with contextlib.suppress(ValueError, OSError, KeyError):
        pid = int(json.loads(started.read_text())["supervisor_pid"])
        os.killpg(pid, signal.SIGTERM)


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


def _data_arrived(run: DemoRun, n: int) -> CloudEvent:
    data = {
        "dataset_id": "unit-conversions",
        "model_id": MODEL_ID,
        "uri": run.dataset.as_uri(),
        "rows": sum(1 for _ in run.dataset.open(encoding="utf-8")),
        "format": "jsonl",
        "version": str(n),
    }
    return _event("data.arrived", n, data, "/pipelines/units-export")


def _drift(n: int, value: float) -> CloudEvent:
    data = {
        "model_id": MODEL_ID,
        "metric": "answer_quality_psi",
        "value": value,
        "threshold": 0.2,
        "detector": "demo",
    }
    return _event("drift.detected", n, data, "/monitors/quality")


async def _emit(producer: AIOKafkaProducer, event: CloudEvent) -> None:
    record = encode_event(event)
    await producer.send_and_wait(
        TOPICS["in"], value=record.value, key=record.key, headers=list(record.headers)
    )
    shown = {k: v for k, v in event.data.items() if k in ("model_id", "value", "rows", "uri")}
    say(f"      → emitted {event.type} id={event.id} {json.dumps(shown)}")


def _decode(message: Any) -> CloudEvent:
    record = KafkaRecord(value=message.value, headers=tuple(message.headers), key=message.key)
    return decode_record(record, max_event_bytes=50_000_000)[0]


def _create_topics(bootstrap: str) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            {name: {"num_partitions": 1, "replication_factor": 1} for name in TOPICS.values()},
            wait_for_metadata=True,
        )
    finally:
        admin.close()


async def _drive(run: DemoRun, bootstrap: str, *, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    audit = AIOKafkaConsumer(TOPICS["audit"], bootstrap_servers=bootstrap)
    out = AIOKafkaConsumer(TOPICS["out"], bootstrap_servers=bootstrap)
    for client in (producer, audit, out):
        await client.start()
    try:
        step(3, 6, f"events: fresh data, then drift alarms for model {MODEL_ID!r}")
        await _emit(producer, _data_arrived(run, 1))
        await _emit(producer, _drift(1, 0.31))
        await _emit(producer, _drift(2, 0.12))  # below threshold: the rule's `where` skips it
        await _emit(producer, _drift(3, 0.35))
        job = await _await_launch(audit, deadline)
        say("      while it trains, more data and two more alarms arrive:")
        await _emit(producer, _data_arrived(run, 2))
        await _emit(producer, _drift(4, 0.40))
        await _emit(producer, _drift(5, 0.42))
        await _await_decisions(audit, deadline, want=3)

        step(4, 6, f"training: {job} on the local backend (LoRA, {run.model})")
        completed = await _follow_training(run, job, out, deadline)

        step(5, 6, "the finetune.completed event, read back from the output topic")
        say(json.dumps(_event_json(completed), indent=2))
        step(6, 6, "base model vs adapter on one prompt")
        _compare(run, completed)
        say("\ndemo finished: stopping the worker and the broker")
        return 0
    finally:
        for client in (producer, audit, out):
            await _close(client)


async def _close(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    # aiokafka's consumer can raise the CancelledError of its own in-flight fetch from
    # stop(); the demo is over by then, so a noisy close must not turn success into failure.
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await client.stop()


async def _next_decisions(audit: AIOKafkaConsumer, deadline: float) -> list[CloudEvent]:
    if time.monotonic() > deadline:
        raise DemoError("timed out waiting for the worker's decisions (see worker.log)")
    batches = await audit.getmany(timeout_ms=500)
    return [_decode(m) for records in batches.values() for m in records]


def _show_decision(record: CloudEvent) -> None:
    data = record.data
    reason = f" ({data['reason']})" if data.get("reason") else ""
    job = f" job={data['job']['name']}" if data.get("job") else ""
    counted = f" window={data['window_count']}" if data.get("window_count") is not None else ""
    say(f"      decision: {data['outcome']}{reason}{counted}{job} — {data.get('message', '')}")


async def _await_launch(audit: AIOKafkaConsumer, deadline: float) -> str:
    while True:
        for record in await _next_decisions(audit, deadline):
            _show_decision(record)
            if record.data["outcome"] == "launch":
                return str(record.data["job"]["name"])


async def _await_decisions(audit: AIOKafkaConsumer, deadline: float, *, want: int) -> None:
    seen = 0
    while seen < want:
        for record in await _next_decisions(audit, deadline):
            _show_decision(record)
            seen += 1


async def _follow_training(
    run: DemoRun, job: str, out: AIOKafkaConsumer, deadline: float
) -> CloudEvent:
    from handlers.app import progress_bar

    log = run.jobs / job / "stdout.log"
    bar = progress_bar(sys.stdout) if sys.stdout.isatty() else None
    offset = 0
    last_line = 0.0
    while True:
        if time.monotonic() > deadline:
            raise DemoError(f"timed out waiting for {job} (see {run.jobs / job})")
        if log.exists():
            with log.open(encoding="utf-8", errors="replace") as stream:
                stream.seek(offset)
                for line in stream:
                    if not line.endswith("\n"):
                        break
                    offset += len(line.encode("utf-8"))
                    last_line = _show_progress(line, bar, last_line)
        batches = await out.getmany(timeout_ms=500)
        for records in batches.values():
            for message in records:
                event = _decode(message)
                say(f"      ← {event.type} id={event.id}")
                if event.type == "io.tuneloop.finetune.completed.v1":
                    return event
                if event.type == "io.tuneloop.finetune.failed.v1":
                    raise DemoError(f"the job failed: {json.dumps(event.data)[:2000]}")


def _show_progress(line: str, bar: Any, last: float) -> float:
    try:
        fields = json.loads(line)
    except ValueError:
        return last
    event = fields.pop("event", "")
    if bar is not None:
        bar.emit(event, **fields)
        return last
    now = time.monotonic()
    if event == "progress" and now - last < 5 and not fields.get("final"):
        return last
    keys = ("step", "total_steps", "loss", "tokens_per_second", "eta_seconds", "stage")
    details = " ".join(f"{k}={_short(fields[k])}" for k in keys if fields.get(k) is not None)
    say(f"      [train] {event} {details}")
    return now


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _event_json(event: CloudEvent) -> dict[str, Any]:
    return {
        "specversion": event.specversion,
        "type": event.type,
        "source": event.source,
        "id": event.id,
        "subject": event.subject,
        "time": event.time.isoformat() if event.time else None,
        **{name: value for name, value in event.extensions.items()},
        "data": event.data,
    }


def _compare(run: DemoRun, completed: CloudEvent) -> None:
    from handlers.app import generate

    adapter_uri = completed.data.get("adapter_uri")
    if not adapter_uri:
        raise DemoError("the completion event names no adapter")
    adapter = Path(adapter_uri.removeprefix("file://"))
    prompt = _demo_prompt(run)
    base = _first_line(generate(run.model, prompt))
    tuned = _first_line(generate(run.model, prompt, adapter=adapter))
    say(f"      prompt : {prompt!r}")
    say(f"      base   : {base!r}")
    say(f"      adapter: {tuned!r}")


def _first_line(text: str) -> str:
    """Greedy decoding goes on past the answer; the first non-empty line is the answer."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _demo_prompt(run: DemoRun) -> str:
    with run.dataset.open(encoding="utf-8") as lines:
        first = json.loads(next(lines))
    return str(first.get("prompt") or first.get("text", "")[:80])

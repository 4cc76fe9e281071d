"""End to end: an event produced to Kafka -> its TrainJob exists on the API server.

One run starts its own local Kafka broker and local Kubernetes API server
(`devservices`, or what `TUNELOOP_KAFKA_BOOTSTRAP` / `TUNELOOP_KUBECONFIG` name)
and measures three things at the same steady rate (100 events/s), one after the other:

- raw produce -> consume: an `AIOKafkaProducer` and a plain `AIOKafkaConsumer` in one event
  loop; latency from just before `send` to the consumer holding the record;
- bare create: `create_namespaced_custom_object` of a ready TrainJob body, synchronously;
- tuneloop: a wired worker (`handlers.app.build_worker`, in-process, the Kubernetes backend)
  with a rule that launches on every event (each event its own key). Latency from just before
  the producer's `send` to the backend's create of that event's TrainJob returning (the object
  exists on the API server). That includes the intake (decode, validate, route), the hop
  through the internal keyed topic, the seen-set, the rule engine, the audit record and the
  create itself.

The baseline of each percentile is raw produce->consume plus bare create at that percentile:
what any Kafka-to-TrainJob bridge pays at least. The producer runs in the worker's event loop
in both Kafka measurements, so the loop's load hits both alike. Warm-up events (the worker's
group join, the first creates) are sent and waited for before timing starts.

Everything shares this machine's cores, so the run also reads from /proc how much CPU the
worker process, the broker, etcd and the API server used per launch during the steady phase,
against the machine's budget per event at that rate (cores / rate): when the whole machine is
near its budget, queues grow and no latency goal can hold, whatever the worker does. The local
API server and etcd run with a larger `GOGC` (see `devservices/kubernetes.py`).

Goal (issue 7): p99 <= 100 ms. For scale: Argo Events on a Kafka event bus is reported at
~4 s from publish to trigger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

RATE = 100.0
LIGHT_RATE = 10.0
"""A light load, for context: the latency when the worker is not saturated."""
GOAL_MS = 100.0
WARMUP = 20
RULES = """
runtimes: [torch-distributed]
rules:
  - name: bench-e2e
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    count: 1
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "file:///data/${ key }.jsonl"
"""


WORKER_TRIES = 2
"""Fresh workers to try. A worker used to miss its warm-up events when its just-created
keyed topic was not yet in the first metadata its consumer read ("not found in cluster
metadata"); the intake now refreshes metadata every few seconds, so the group rebalances onto
the topic. The retry stays for anything else; it is reported in the notes, never hidden."""


class WorkerNotReadyError(RuntimeError):
    """The worker under test launched none or only some of the warm-up events."""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _CpuMeter:
    """CPU seconds spent between `started` and `stop`: by each named process and by the whole
    machine, read from /proc (Linux). Everything in these runs shares the machine's cores, so
    a missed latency goal reads differently when the machine was busy the whole time."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._began: tuple[dict[str, float], tuple[float, float]] | None = None

    @staticmethod
    def _process_seconds(pid: int) -> float:
        # /proc/<pid>/stat: after the command in parentheses, utime and stime are fields 12-13
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    @staticmethod
    def _machine_seconds() -> tuple[float, float]:
        """(busy, total) seconds of all cores since boot; idle and iowait count as not busy."""
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = ticks[3] + ticks[4]
        total = sum(ticks[:8])  # guest time is already inside user time
        return (total - idle) / _CLOCK_TICKS, total / _CLOCK_TICKS

    def _read(self) -> tuple[dict[str, float], tuple[float, float]]:
        return (
            {name: self._process_seconds(pid) for name, pid in self._pids.items()},
            self._machine_seconds(),
        )

    @classmethod
    def started(cls, pids: dict[str, int]) -> _CpuMeter:
        """A meter counting from now."""
        meter = cls(pids)
        meter._began = meter._read() if Path("/proc/stat").exists() else None
        return meter

    def stop(self) -> CpuUse | None:
        """The CPU used since `started`, or None where /proc cannot be read."""
        if self._began is None:
            return None
        (processes, (busy, total)), (then, (busy0, total0)) = self._read(), self._began
        return CpuUse(
            by_process={name: processes[name] - then[name] for name in processes},
            machine_busy=busy - busy0,
            machine_total=total - total0,
        )


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds of one measured span."""

    by_process: dict[str, float]
    machine_busy: float
    machine_total: float
    """Seconds of all cores together: wall time x cores."""

    def per_event_ms(self, events: int) -> dict[str, float]:
        return {name: 1e3 * used / events for name, used in self.by_process.items()}


def _create_topics(bootstrap: str, names: dict[str, int]) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-endtoend")
    try:
        admin.create_topics(
            [NewTopic(name, num_partitions=n, replication_factor=1) for name, n in names.items()]
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = admin.describe_topics(list(names))
            if all(
                t.get("partitions") and all(p.get("leader", -1) >= 0 for p in t["partitions"])
                for t in described
            ):
                return
            time.sleep(0.2)
    finally:
        admin.close()


async def _steady(count: int, rate: float) -> AsyncIterator[int]:
    """Yield 0..count-1 on a fixed schedule (catching up without bursts beyond the plan)."""
    start = time.perf_counter()
    for index in range(count):
        await asyncio.sleep(max(0.0, start + index / rate - time.perf_counter()))
        yield index


async def _raw_latencies(bootstrap: str, topic: str, count: int, rate: float) -> list[float]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-raw-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await consumer.start()
    await producer.start()
    latencies: list[float] = []
    received = asyncio.Event()

    async def consume() -> None:
        async for record in consumer:
            sent = float(record.value.decode())
            if sent >= 0:
                latencies.append(time.perf_counter() - sent)
            if len(latencies) >= count:
                received.set()
                return

    task = asyncio.ensure_future(consume())
    try:
        for _ in range(WARMUP):  # the consumer's group join, not timed
            await producer.send_and_wait(topic, b"-1")
        await asyncio.sleep(1.0)
        async for _ in _steady(count, rate):
            await producer.send(topic, str(time.perf_counter()).encode())
        await asyncio.wait_for(received.wait(), timeout=60)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await producer.stop()
        await consumer.stop()
    return latencies


def _bare_creates(api: Any, namespace: str, count: int, rate: float) -> list[float]:
    from orchestrator.jobs.model import TrainingRequest
    from runtimes.kubernetes import manifests
    from runtimes.kubernetes.catalog import GROUP, VERSION, RuntimeInfo

    def body(index: int) -> dict[str, Any]:
        request = TrainingRequest(
            name=f"bare-{index:05d}",
            rule="bench-e2e",
            rule_version="1",
            key=f"m-{index}",
            decision_id=f"bench-e2e/m-{index}/{index}",
            causing_event_ids=(f"e2e-{index}",),
            runtime="torch-distributed",
            base_model="tiny",
            dataset=f"file:///data/m-{index}.jsonl",
        )
        return manifests.build_trainjob(
            request,
            namespace=namespace,
            runtime=RuntimeInfo(name="torch-distributed"),
            settings=manifests.Settings(),
        )

    bodies = [body(i) for i in range(count + WARMUP)]
    for index in range(WARMUP):
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", bodies[index])
    latencies: list[float] = []
    start = time.perf_counter()
    for index in range(count):
        scheduled = start + index / rate
        time.sleep(max(0.0, scheduled - time.perf_counter()))
        began = time.perf_counter()
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainjobs", bodies[WARMUP + index]
        )
        latencies.append(time.perf_counter() - began)
    return latencies


class _TimedBackend:
    """The real backend, noting when each event's TrainJob create returned."""

    def __init__(self, inner: Any, created: dict[str, float]) -> None:
        self._inner = inner
        self._created = created

    async def launch(self, request: Any) -> Any:
        ref = await self._inner.launch(request)
        self._created.setdefault(request.causing_event_ids[-1], time.perf_counter())
        return ref

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _end_to_end(
    bootstrap: str,
    api: Any,
    *,
    namespace: str,
    workdir: Path,
    phases: list[tuple[int, float]],
    pids: dict[str, int],
) -> list[tuple[list[float], int, float, CpuUse | None]]:
    """Per phase of (count, rate), one after the other on one worker: the latencies, how many
    events got no TrainJob in time, the launches per second sustained, and the CPU that the
    processes in *pids* and the machine spent on the phase."""
    from aiokafka import AIOKafkaProducer
    from faust.contrib.asgi import faust_app_running

    from handlers.app import build_worker
    from handlers.codec import encode_event
    from orchestrator.clock import SystemClock
    from orchestrator.events import CloudEvent
    from orchestrator.settings import KafkaSettings, Settings
    from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend

    tag = uuid.uuid4().hex[:6]
    topics = {f"e2e-{name}-{tag}": 2 if name == "in" else 1 for name in ("in", "out", "audit")}
    topics[f"e2e-dlq-{tag}"] = 1
    await asyncio.to_thread(_create_topics, bootstrap, topics)
    rules = workdir / "rules.yaml"
    rules.write_text(RULES)
    clock = SystemClock()
    created: dict[str, float] = {}
    backend = _TimedBackend(
        KubernetesBackend(
            api,
            clock=clock,
            # a short watch: stopping the worker waits for the open watch request to end
            settings=BackendSettings(namespace=namespace, watch_timeout=5),
        ),
        created,
    )
    worker = build_worker(
        Settings(
            kafka=KafkaSettings(
                bootstrap=bootstrap,
                topics_in=(f"e2e-in-{tag}",),
                topic_out=f"e2e-out-{tag}",
                topic_audit=f"e2e-audit-{tag}",
                topic_dlq=f"e2e-dlq-{tag}",
                group_id=f"bench-e2e-{tag}",
                internal_partitions=KafkaSettings().internal_partitions,  # the default, 8
            )
        ),
        rule_paths=[rules],
        backend=cast(Any, backend),
        clock=clock,
        topic_replication_factor=1,
    )

    def event(event_id: str) -> Any:
        return encode_event(
            CloudEvent(
                id=event_id,
                source="/bench/endtoend",
                type="io.tuneloop.drift.detected.v1",
                time=datetime.now(UTC),
                datacontenttype="application/json",
                data={"model_id": event_id, "metric": "psi", "value": 0.3, "threshold": 0.2},
            )
        )

    async def wait_created(ids: list[str], timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while not all(i in created for i in ids) and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)

    results: list[tuple[list[float], int, float, CpuUse | None]] = []
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        async with faust_app_running(worker.app, stop_timeout=30):
            warm = [f"warm-{tag}-{i}" for i in range(WARMUP)]
            for event_id in warm:
                record = event(event_id)
                await producer.send_and_wait(
                    f"e2e-in-{tag}", value=record.value, headers=list(record.headers)
                )
            await wait_created(warm, timeout=60)
            if not all(event_id in created for event_id in warm):
                crash = worker.app._crash_reason
                raise WorkerNotReadyError(
                    f"the worker launched {sum(i in created for i in warm)} of {WARMUP} warm-up "
                    f"events in 60 s (crash: {crash!r}); no latency to measure"
                )
            for number, (count, rate) in enumerate(phases):
                sent: dict[str, float] = {}
                ids = [f"e2e-{tag}-{number}-{i}" for i in range(count)]
                records = [event(event_id) for event_id in ids]
                meter = _CpuMeter.started(pids)
                async for index in _steady(count, rate):
                    sent[ids[index]] = time.perf_counter()
                    await producer.send(
                        f"e2e-in-{tag}",
                        value=records[index].value,
                        headers=list(records[index].headers),
                    )
                await wait_created(ids, timeout=60 + count / rate)
                latencies = [created[i] - sent[i] for i in ids if i in created]
                sustained = _launch_rate([created[i] for i in ids if i in created])
                results.append((latencies, count - len(latencies), sustained, meter.stop()))
    finally:
        await producer.stop()
    return results


def _launch_rate(created: list[float]) -> float:
    """Launches per second between the first TrainJob and the last: intervals over time, as
    the offered rate is counted (N events sent at R/s span (N - 1) / R seconds). Counting N
    over first-send-to-last-create charged one latency to the rate, so a worker that kept up
    read as 99.9 of 100/s."""
    if len(created) < 2:
        return 0.0
    return (len(created) - 1) / (max(created) - min(created))


def _service_pids(kafka: Any, kube: Any) -> dict[str, int]:
    """The processes whose CPU the report shows: this one (the worker, its producer and the
    create threads) and the local broker, etcd and API server where this run started them."""
    pids = {"worker": os.getpid()}
    if kafka.broker is not None and kafka.broker.pid is not None:
        pids["broker"] = kafka.broker.pid
    if kube.server is not None:
        pids.update(kube.server.pids)
    return pids


def _held_namespace(api_client: Any, prefix: str) -> str:
    """A fresh namespace named after *prefix* whose pods the local node agent holds: the
    controllers act on every TrainJob in it, and no trainer runs."""
    from devservices import kubernetes as local_kubernetes

    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    local_kubernetes.create_namespace(api_client, name, hold_pods=True)
    return name


def run(*, quick: bool) -> list[dict[str, object]]:  # noqa: PLR0915 -- one straight-line run
    import structlog
    from kubernetes import client

    from devservices import kubernetes as local_kubernetes
    from devservices.kafka import kafka_for_tests

    count, light_count = (100, 20) if quick else (1500, 200)
    logging_config = structlog.get_config()
    # A log line per event would measure the terminal; warnings only while timing.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger().setLevel(logging.WARNING)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-endtoend-") as workdir,
            kafka_for_tests(Path(workdir) / "kafka") as kafka,
            local_kubernetes.connect(Path(workdir) / "kube") as kube,
            kube.api_client() as api_client,
        ):
            api = client.CustomObjectsApi(api_client)
            bootstrap = kafka.bootstrap
            raw_topic = f"e2e-raw-{uuid.uuid4().hex[:6]}"
            _create_topics(bootstrap, {raw_topic: 1})
            raw = asyncio.run(_raw_latencies(bootstrap, raw_topic, count, RATE))
            print(f"bench: endtoend raw produce->consume done ({len(raw)})", file=sys.stderr)
            pids = _service_pids(kafka, kube)
            bare_namespace = _held_namespace(api_client, "bench-bare")
            meter = _CpuMeter.started(pids)
            bare = _bare_creates(api, bare_namespace, count, RATE)
            bare_cpu = meter.stop()
            print(f"bench: endtoend bare create done ({len(bare)})", file=sys.stderr)
            attempts: list[str] = []
            while True:  # one more try with a fresh worker: see WORKER_TRIES
                try:
                    light, steady = asyncio.run(
                        _end_to_end(
                            bootstrap,
                            api,
                            namespace=_held_namespace(api_client, "bench-e2e"),
                            workdir=Path(workdir),
                            phases=[(light_count, LIGHT_RATE), (count, RATE)],
                            pids=pids,
                        )
                    )
                    break
                except WorkerNotReadyError as exc:
                    attempts.append(str(exc))
                    print(f"bench: endtoend {exc}", file=sys.stderr)
                    if len(attempts) >= WORKER_TRIES:
                        raise
            ours, missing, sustained, steady_cpu = steady
            print(
                f"bench: endtoend tuneloop done ({len(ours)}, {missing} missing)", file=sys.stderr
            )
            sources = f"{kafka.kind.value} Kafka, {kube.source} API server"
    finally:
        structlog.configure(**logging_config)
    notes = (
        f"{count} events at {RATE:g}/s, {sources}; baseline = raw produce->consume + bare "
        f"create at the same percentile"
    )
    if missing:
        notes += f"; {missing} events had no TrainJob within the wait (left out)"
    if attempts:
        notes += f"; worker retried after: {attempts[0]}"
    rows: list[dict[str, object]] = []
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        value = _percentile(ours, q) * 1e3 if ours else float("nan")
        raw_ms, bare_ms = _percentile(raw, q) * 1e3, _percentile(bare, q) * 1e3
        baseline = raw_ms + bare_ms
        rows.append(
            {
                "benchmark": "endtoend",
                "measure": f"event produced -> TrainJob exists, {label}",
                "value": value,
                "unit": "ms",
                "baseline": baseline,
                "ratio": value / baseline,
                "goal": f"<= {GOAL_MS:g} ms" if label == "p99" else "",
                "notes": f"{notes} ({raw_ms:.1f} + {bare_ms:.1f} ms)",
            }
        )
    rows += _context_rows(light[0], light_count, sustained, rows[1]["baseline"])
    if steady_cpu is not None and ours:
        rows.append(_cpu_row(steady_cpu, launches=len(ours), bare=bare_cpu, creates=len(bare)))
    return rows


def _context_rows(
    light: list[float], light_count: int, sustained: float, baseline: object
) -> list[dict[str, object]]:
    """The light-load p99 and the launch rate sustained, beside the latency rows."""
    rows: list[dict[str, object]] = []
    light_ms = _percentile(light, 0.99) * 1e3 if light else float("nan")
    rows.append(
        {
            "benchmark": "endtoend",
            "measure": f"event produced -> TrainJob exists, p99 at {LIGHT_RATE:g} events/s",
            "value": light_ms,
            "unit": "ms",
            "baseline": baseline,
            "ratio": light_ms / cast(float, baseline),
            "goal": "",
            "notes": f"{light_count} events, same worker, before the {RATE:g}/s run; "
            f"baseline as above (at {RATE:g}/s)",
        }
    )
    rows.append(
        {
            "benchmark": "endtoend",
            "measure": "launches sustained at the steady rate",
            "value": sustained,
            "unit": "launches/s",
            "baseline": RATE,
            "ratio": sustained / RATE,
            "goal": ">= 1x the offered rate",
            "notes": "one launch per event (each event its own key); offered rate as baseline",
        }
    )
    return rows


def _cpu_row(
    steady: CpuUse, *, launches: int, bare: CpuUse | None, creates: int
) -> dict[str, object]:
    """How busy the machine was during the steady phase, and who used the CPU, per launch.

    The baseline is the CPU one event may use on this machine at the steady rate (all cores'
    time / events offered per second): a ratio near 1 means the machine had no headroom, so
    queues grow and the latency goal cannot hold whatever tuneloop does."""
    cores = os.cpu_count() or 1
    per_launch = 1e3 * steady.machine_busy / launches
    budget = 1e3 * cores / RATE
    shares = ", ".join(
        f"{name} {ms:.1f}" for name, ms in sorted(steady.per_event_ms(launches).items())
    )
    notes = (
        f"machine busy {100 * steady.machine_busy / steady.machine_total:.0f}% of {cores} "
        f"cores during the {RATE:g}/s phase; ms per launch: {shares}"
    )
    if bare is not None and creates:
        server = {k: v for k, v in bare.per_event_ms(creates).items() if k != "worker"}
        notes += "; a bare create alone: " + ", ".join(
            f"{name} {ms:.1f}" for name, ms in sorted(server.items())
        )
    return {
        "benchmark": "endtoend",
        "measure": f"CPU per launch at {RATE:g} events/s, whole machine",
        "value": per_launch,
        "unit": "ms",
        "baseline": budget,
        "ratio": per_launch / budget,
        "goal": "context: < 1 leaves headroom",
        "notes": notes,
    }


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(json.dumps(row))

"""Reusable pieces of the fault suites (tests/e2e/test_fault_*.py): real worker processes, a
deterministic event stream, and the counting that proves "none lost, none doubled".

API (everything a suite needs; other e2e tests may import it):

- `FAULT_RULES`: the rule file the suites run (count 3 per model in 1 h, `allowed_lateness: 0s`).
- `StreamPlan(seed, events, ...)`, `make_stream(plan) -> PlannedStream`: a deterministic
  stream of drift alarms over many models; each model gets 3 qualifying alarms (one launch) or
  2 (none), interleaved with alarms below threshold. The `PlannedStream` also says, from its
  own construction and not from any engine, how many qualifying alarms each model was sent and
  so which models must launch (`must_launch`). `write_jsonl(events, path)` writes the events
  as JSON Lines for `tuneloop simulate`.
- `WorkerConfig` + `WorkerProcess`: `tuneloop run --backend kubernetes` as a subprocess in its
  own session, logging to a file; `start()`, `kill()` (SIGKILL to its process group),
  `stop()` (SIGTERM, then SIGKILL), `log_tail()`. `workers_log_tails(...)` for failure messages.
- `send_events`, `read_topic`, `count_records` (producing and reading to the end offsets)
  and `wait_for` (poll a predicate) are tests/fixtures/topics.py's and waiting.py's, shared
  with the in-process worker tests; they are imported here, so the suites may name them here.
- `trainjob_names(kubeconfig, namespace)`, `complete_trainjobs(kubeconfig, namespace, names)`
  (end each job through its JobSet's `/status`, as the JobSet controller would when its Jobs
  complete, and the real Trainer marks the TrainJob Complete: the namespace is held, so no
  trainer runs to complete them).
- `FaultRun`: one suite's run: stream, expected launches, worker config, and the steps every
  suite shares (`send`, `wait_for_launches`, `complete_all`, `summary`).
- `FaultEnv`: what every suite runs against (broker address, API server, namespace, topics,
  rules, the worker factory, a tmp dir), with `prepare_run(plan, group=...)`; the `fault_env`
  fixture in conftest.py builds it.
- `Summary`: the counts, per model key: which keys got a TrainJob (read from the TrainJob's
  key annotation on the API server) against the keys the plan says must launch; `.line()` is
  the one summary line every suite prints, `.assert_exact()` fails on any loss or duplicate.

The oracle is the plan, never the engine under test: `tuneloop simulate` is checked against
the same plan in `test_stream_plan.py`, as one more implementation that must agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from devservices.kubernetes import KubeEndpoint
from handlers.codec import envelope_of
from orchestrator.events import CloudEvent
from runtimes.kubernetes.catalog import GROUP as TRAINER_GROUP
from runtimes.kubernetes.catalog import VERSION as TRAINER_VERSION
from runtimes.kubernetes.manifests import KEY as KEY_ANNOTATION
from runtimes.kubernetes.manifests import PLURAL as TRAINJOBS
from tests.fixtures.topics import count_records, read_topic, send_events
from tests.fixtures.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
COMPLETED = "io.tuneloop.finetune.completed.v1"
DRIFT = "io.tuneloop.drift.detected.v1"
SOURCE = "/monitors/fault-suite"

FAULT_RULES = """\
runtimes: [torch-distributed]
allowed_lateness: 0s
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
      where: "event.data.value > event.data.threshold"
    key: "event.data.model_id"
    window: 1h
    count: 3
    concurrency: forbid
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "file:///data/${ key }.jsonl"
"""
"""One launch per model that gets 3 qualifying alarms. A model never gets more than 3, so no
launch depends on when an earlier job finished (`concurrency: forbid` is then never asked):
the expected launches are a function of the stream alone, which the plan knows as it builds it.
"""

RULE_COUNT = 3
"""FAULT_RULES' `count`: a model whose stream holds this many qualifying alarms launches."""
RULE_WINDOW = timedelta(hours=1)
"""FAULT_RULES' `window`: a whole stream fits in it, so every qualifying alarm counts."""
THRESHOLD = 0.2
"""The alarms' `threshold`: a qualifying alarm's value is above it, a noise alarm's below."""
SPACING = timedelta(milliseconds=50)
"""Event time between two consecutive alarms of a stream."""


# --- the stream ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What stream to make: *events* alarms in all, over models named `<prefix>-NNNNN`."""

    seed: int
    events: int
    launch_share: float = 0.5
    """Share of models that get 3 qualifying alarms (the rest get 2)."""
    noise_per_model: int = 4
    """Alarms below threshold per model on average (counted by nobody)."""
    prefix: str = "m"


@dataclass(frozen=True, slots=True)
class PlannedStream:
    """A stream, and what it must yield under FAULT_RULES, known from how it was built.

    The expected launches come from the plan's own bookkeeping, never from an engine: the
    fault suites test the engine, so it cannot also be their oracle.
    """

    events: list[CloudEvent]
    qualifying: Mapping[str, int]
    """Per model key: how many alarms above threshold the stream sent it (every model of the
    stream is here, 0 included). All lie within one rule window (`make_stream` checks)."""

    @property
    def must_launch(self) -> frozenset[str]:
        """The keys sent RULE_COUNT qualifying alarms: each must launch exactly once (none is
        sent more, so none can launch twice); every other key must never launch."""
        return frozenset(key for key, sent in self.qualifying.items() if sent >= RULE_COUNT)


def make_stream(plan: StreamPlan) -> PlannedStream:
    """*plan.events* drift alarms, the same for the same plan; times 50 ms apart, recent."""
    rng = random.Random(plan.seed)
    per_model: list[list[bool]] = []  # True: qualifying
    total = 0
    while total < plan.events:
        qualifying = RULE_COUNT if rng.random() < plan.launch_share else RULE_COUNT - 1
        noise = rng.randint(0, 2 * plan.noise_per_model)
        kinds = [True] * qualifying + [False] * noise
        rng.shuffle(kinds)
        per_model.append(kinds)
        total += len(kinds)
    # Interleave the models: each draw takes the next alarm of a random unfinished model, so
    # each model's alarms keep their order and spread over the stream.
    cursors = [0] * len(per_model)
    open_models = list(range(len(per_model)))
    order: list[tuple[int, bool]] = []
    while open_models and len(order) < plan.events:
        slot = rng.randrange(len(open_models))
        model = open_models[slot]
        order.append((model, per_model[model][cursors[model]]))
        cursors[model] += 1
        if cursors[model] == len(per_model[model]):
            open_models[slot] = open_models[-1]
            open_models.pop()
    if SPACING * len(order) >= RULE_WINDOW:
        raise ValueError(f"{len(order)} alarms {SPACING} apart do not fit in one rule window")
    start = datetime.now(UTC).replace(microsecond=0) - SPACING * len(order) - timedelta(minutes=10)
    events = []
    # Counted here, as each alarm is made: the stream is cut at plan.events, so the last
    # models may get fewer qualifying alarms than `per_model` planned for them.
    sent: dict[str, int] = {}
    for n, (model, qualifying) in enumerate(order):
        model_id = f"{plan.prefix}-{model:05d}"
        sent[model_id] = sent.get(model_id, 0) + qualifying
        value = (
            round(THRESHOLD + 0.05 + rng.random() * 0.5, 3)
            if qualifying
            else round(rng.random() * (THRESHOLD - 0.01), 3)
        )
        events.append(
            CloudEvent(
                id=f"s{plan.seed}-{n:06d}",
                source=SOURCE,
                type=DRIFT,
                subject=model_id,
                time=start + SPACING * n,
                datacontenttype="application/json",
                data={
                    "model_id": model_id,
                    "metric": "psi",
                    "value": value,
                    "threshold": THRESHOLD,
                },
                extensions={"partitionkey": model_id},
            )
        )
    return PlannedStream(events=events, qualifying=sent)


def write_jsonl(events: Iterable[CloudEvent], path: Path) -> Path:
    """*events* as JSON Lines of CloudEvents (the JSON event format), for `simulate`."""
    with path.open("w", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(envelope_of(event), default=str) + "\n")
    return path


# --- worker processes ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What every worker of one suite shares: broker, topics, group, rules, cluster."""

    bootstrap: str
    topics: dict[str, str]
    group: str
    rules: Path
    kubeconfig: Path | None
    namespace: str | None
    """Both None for `backend="local"`."""
    internal_partitions: int = 2
    log_level: str = os.environ.get("TUNELOOP_FAULT_WORKER_LOG_LEVEL", "warning")
    session_timeout: float = 8.0
    """Seconds before the broker gives a killed worker's partitions away (faust's default
    is 60 s; short here so that a kill costs seconds, not minutes)."""
    backend: str = "kubernetes"
    """`tuneloop run --backend`: the suites' default, or `local` (its settings, such as
    `TUNELOOP_LOCAL_ROOT`, in `extra_environment`)."""
    extra_environment: Mapping[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            TUNELOOP_KAFKA_BOOTSTRAP=self.bootstrap,
            TUNELOOP_KAFKA_TOPICS_IN=self.topics["in"],
            TUNELOOP_KAFKA_TOPIC_OUT=self.topics["out"],
            TUNELOOP_KAFKA_TOPIC_AUDIT=self.topics["audit"],
            TUNELOOP_KAFKA_TOPIC_DLQ=self.topics["dlq"],
            TUNELOOP_KAFKA_GROUP_ID=self.group,
            TUNELOOP_KAFKA_INTERNAL_PARTITIONS=str(self.internal_partitions),
            # faust reads its own settings from the environment (no TUNELOOP_ prefix).
            BROKER_SESSION_TIMEOUT=str(self.session_timeout),
            BROKER_HEARTBEAT_INTERVAL="1.0",
            BROKER_REBALANCE_TIMEOUT=str(self.session_timeout),
            BROKER_COMMIT_INTERVAL="0.5",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_environment)
        return env


@dataclass(slots=True)
class WorkerProcess:
    """One `tuneloop run` process; each `start()` is a new incarnation in the same log."""

    config: WorkerConfig
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    kills: int = 0

    def start(self) -> WorkerProcess:
        if self.running:
            raise RuntimeError("worker already running")
        command = [
            sys.executable,
            "-m",
            "handlers.cli.main",
            "run",
            "--rules",
            str(self.config.rules),
            "--backend",
            self.config.backend,
            *(["--kubeconfig", str(self.config.kubeconfig)] if self.config.kubeconfig else []),
            *(["--namespace", self.config.namespace] if self.config.namespace else []),
            "--log-level",
            self.config.log_level,
        ]
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts} at {datetime.now(UTC)} =====\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=self.config.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown hook, no flush, no commit."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.kills += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== killed (-9) at {datetime.now(UTC)} =====\n".encode())

    def stop(self, *, grace: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return f"(no log at {self.log_path})"
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return f"--- {self.log_path} (last {lines} lines)\n" + "\n".join(text[-lines:])


def workers_log_tails(workers: Sequence[WorkerProcess], lines: int = 60) -> str:
    return "\n".join(worker.log_tail(lines) for worker in workers)


# --- Kubernetes ---------------------------------------------------------------------------


def _objects(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    new_client = cast(Any, config).new_client_from_config  # untyped library
    return client.CustomObjectsApi(new_client(config_file=str(kubeconfig)))


def trainjob_keys(kubeconfig: Path, namespace: str) -> dict[str, str]:
    """Every TrainJob in *namespace*: its name and the model key it was launched for (the
    key annotation the worker writes; empty when it wrote none, which no plan expects)."""
    listing = _objects(kubeconfig).list_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, TRAINJOBS
    )
    return {
        item["metadata"]["name"]: (item["metadata"].get("annotations") or {}).get(
            KEY_ANNOTATION, ""
        )
        for item in listing["items"]
    }


def trainjob_names(kubeconfig: Path, namespace: str) -> list[str]:
    """The names of every TrainJob in *namespace* (a list: the server never repeats one)."""
    return list(trainjob_keys(kubeconfig, namespace))


def complete_trainjobs(kubeconfig: Path, namespace: str, names: Iterable[str]) -> int:
    """End each job through its JobSet's `/status` (the Trainer then marks the TrainJob
    Complete); return how many. No trainer runs in the suites' held namespace, so no Job can
    complete by itself."""
    from orchestrator.jobs.model import JobPhase
    from tests.contract.test_kubernetes_backend_contract import KubernetesJobController

    controller = KubernetesJobController(_objects(kubeconfig), namespace)
    patched = 0
    for name in names:
        controller.end_sync(name, JobPhase.SUCCEEDED, wait=False)  # the suite waits for events
        patched += 1
    return patched


# --- waiting and counting -----------------------------------------------------------------


async def diagnosis(
    *,
    bootstrap: str,
    topics: dict[str, str],
    kubeconfig: Path,
    namespace: str,
    expected: frozenset[str],
    workers: Sequence[WorkerProcess],
    group: str | None = None,
    events: Sequence[CloudEvent] = (),
) -> str:
    """What a stuck suite has so far: launched keys vs expected (*expected* are model keys),
    decisions by outcome, logs; with *group* and *events*, which events of each missing key
    were decided and how far the group committed (an event never decided behind a committed
    offset was skipped; behind an uncommitted one, it is waiting to be read again)."""
    launched = set(trainjob_keys(kubeconfig, namespace).values())
    audit = await read_topic(bootstrap, topics["audit"])
    outcomes = Counter(f"{e.data.get('outcome')}/{e.data.get('reason')}" for e in audit)
    missing = sorted(expected - launched)
    audited = {str(e.data.get("key")) for e in audit if e.data.get("outcome") == "launch"}
    late = [
        (e.data.get("key"), e.data.get("event_ids"), e.data.get("message"))
        for e in audit
        if e.data.get("outcome") == "late"
    ]
    return (
        f"launched keys={len(launched)} expected={len(expected)} missing={missing[:10]} "
        f"(of which launched in the audit topic: {sorted(set(missing) & audited)[:10]})\n"
        f"decisions: {dict(outcomes)}\nlate: {late[:10]}\n"
        f"{_missing_keys_story(missing, audit, events)}"
        f"{await asyncio.to_thread(_group_lag, bootstrap, group) if group else ''}"
        f"{await asyncio.to_thread(_group_lag, bootstrap, f'{group}-intake') if group else ''}"
        f"{workers_log_tails(workers)}"
    )


def _missing_keys_story(
    missing: Sequence[str], audit: Sequence[CloudEvent], events: Sequence[CloudEvent]
) -> str:
    """Per missing key (up to 5): each event sent for it, with its decision or `-`."""
    decided: dict[str, str] = {}
    for record in audit:
        for event_id in record.data.get("event_ids") or ():
            decided[str(event_id)] = str(record.data.get("outcome"))
    lines = []
    for key in missing[:5]:
        story = [f"{e.id}:{decided.get(e.id, '-')}" for e in events if e.subject == key]
        lines.append(f"  {key}: {' '.join(story)}")
    return "events of missing keys (id:decision, - = never decided):\n" + "\n".join(lines) + "\n"


def _group_lag(bootstrap: str, group: str) -> str:
    """Committed offset vs end offset per partition of *group*, where they differ."""
    from kafka import KafkaAdminClient, KafkaConsumer

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        # kafka-python 3 names it list_group_offsets, one mapping per group asked for
        committed = admin.list_group_offsets({group: None}).get(group, {})
        ends = consumer.end_offsets(list(committed))
    except Exception as exc:  # a diagnosis must not hide the failure it explains
        return f"group offsets unavailable: {exc!r}\n"
    finally:
        admin.close()
        consumer.close()
    behind = [
        f"{tp.topic}[{tp.partition}] {meta.offset}/{ends.get(tp)}"
        for tp, meta in sorted(committed.items())
        if meta.offset != ends.get(tp)
    ]
    return f"group {group} committed/end where behind: {behind or 'none'}\n"


def completions_by_job(out: Iterable[CloudEvent]) -> dict[str, set[str]]:
    """Completion event ids per job name (a redelivered copy has the same id)."""
    found: dict[str, set[str]] = {}
    for event in out:
        if event.type == COMPLETED:
            job = str(event.data.get("job") or event.subject or "")
            found.setdefault(job, set()).add(event.id)
    return found


@dataclass(slots=True)
class Summary:
    """What one suite counted; `line()` is printed, `assert_exact()` decides.

    Launches are counted per model key, against the keys the stream plan must launch: no job
    naming is involved, so a bug in naming or in the engine cannot agree with itself here.
    """

    suite: str
    events_sent: int
    expected: frozenset[str]
    """The model keys that must launch, each exactly once (`PlannedStream.must_launch`)."""
    trainjobs: Mapping[str, str]
    """Every TrainJob on the API server: name -> the model key it was launched for."""
    completions: dict[str, set[str]] = field(default_factory=dict)
    completion_copies: int = 0
    dlq: int = 0
    faults: str = ""
    details: str = ""
    """What was seen when launches went missing (decisions by outcome, worker logs)."""

    @property
    def launches_per_key(self) -> Counter[str]:
        return Counter(self.trainjobs.values())

    @property
    def doubled(self) -> dict[str, int]:
        """Keys that must launch once but got more TrainJobs, with how many."""
        return {k: n for k, n in self.launches_per_key.items() if n > 1 and k in self.expected}

    @property
    def unexpected(self) -> list[str]:
        """Keys that got a TrainJob although the plan sent them too few qualifying alarms."""
        return sorted(set(self.launches_per_key) - self.expected)

    @property
    def missing(self) -> list[str]:
        return sorted(self.expected - set(self.launches_per_key))

    @property
    def duplicates(self) -> int:
        """TrainJobs beyond one per expected key: second launches plus unexpected ones."""
        extra = sum(n - 1 for n in self.doubled.values())
        return extra + sum(self.launches_per_key[k] for k in self.unexpected)

    @property
    def lost(self) -> int:
        return len(self.missing)

    @property
    def completion_count(self) -> int:
        return sum(len(ids) for ids in self.completions.values())

    def line(self) -> str:
        text = (
            f"events sent={self.events_sent} expected launches={len(self.expected)} "
            f"trainjobs={len(self.trainjobs)} duplicates={self.duplicates} lost={self.lost} "
            f"completions={self.completion_count} dlq={self.dlq}"
        )
        extra = f" (completion records on the wire={self.completion_copies}"
        extra += f"; {self.faults})" if self.faults else ")"
        return f"[{self.suite}] {text}{extra}"

    def assert_exact(self, *, completions_expected: bool = True) -> None:
        problems = []
        if self.lost:
            problems.append(f"keys that must launch but have no TrainJob: {self.missing[:20]}")
        if self.doubled:
            problems.append(
                f"keys launched more than once: {dict(list(self.doubled.items())[:20])}"
            )
        if self.unexpected:
            problems.append(f"keys launched that must not launch: {self.unexpected[:20]}")
        if self.dlq:
            problems.append(f"{self.dlq} good events were dead-lettered")
        if completions_expected:
            doubled = {job: ids for job, ids in self.completions.items() if len(ids) > 1}
            missing = sorted(set(self.trainjobs) - set(self.completions))
            foreign = sorted(set(self.completions) - set(self.trainjobs))
            if doubled:
                problems.append(f"jobs with more than one completion id: {doubled}")
            if missing:
                problems.append(f"jobs without a completion event: {missing[:20]}")
            if foreign:
                problems.append(f"completions of jobs that do not exist: {foreign[:20]}")
        if problems:
            raise AssertionError("\n".join([self.line(), *problems, self.details]))


@dataclass(slots=True)
class FaultRun:
    """One fault suite's run: the stream and what it must yield, and the shared steps.

    A suite makes one with `FaultRun.prepare(...)`, starts workers from `config`, calls
    `send(between=...)` injecting its fault in *between*, then `wait_for_launches`,
    `complete_all` and `summary`.
    """

    events: list[CloudEvent]
    expected: frozenset[str]
    """The model keys that must launch, from the stream plan (not from any engine)."""
    config: WorkerConfig
    workers: list[WorkerProcess] = field(default_factory=list)
    missing: str = ""
    """Why `wait_for_launches` gave up, if it did (shown by `Summary.assert_exact`)."""

    @classmethod
    def prepare(
        cls,
        *,
        plan: StreamPlan,
        bootstrap: str,
        topics: dict[str, str],
        rules: Path,
        kubeconfig: Path,
        namespace: str,
        group: str,
    ) -> FaultRun:
        stream = make_stream(plan)
        config = WorkerConfig(
            bootstrap=bootstrap,
            topics=topics,
            group=group,
            rules=rules,
            kubeconfig=kubeconfig,
            namespace=namespace,
        )
        return cls(events=stream.events, expected=stream.must_launch, config=config)

    def created(self) -> int:
        return len(trainjob_names(self.config.kubeconfig, self.config.namespace))

    def diagnosis(self) -> Awaitable[str]:
        return diagnosis(
            bootstrap=self.config.bootstrap,
            topics=self.config.topics,
            kubeconfig=self.config.kubeconfig,
            namespace=self.config.namespace,
            expected=self.expected,
            workers=self.workers,
            group=self.config.group,
            events=self.events,
        )

    async def send(
        self, *, chunk: int, between: Callable[[int], Awaitable[None]] | None = None
    ) -> None:
        await send_events(
            self.config.bootstrap,
            self.config.topics["in"],
            self.events,
            chunk=chunk,
            between=between,
        )

    async def wait_for_launches(self, *, timeout: float = 180) -> None:
        """Wait until the TrainJobs reach the expected number. If they never do, note why
        (`missing`) and go on: the suite still completes the jobs that exist and prints its
        summary line, which then shows what was lost."""
        try:
            await wait_for(
                lambda: self.created() >= len(self.expected),
                what=f"{len(self.expected)} TrainJobs",
                timeout=timeout,
                on_timeout=self.diagnosis,
            )
        except AssertionError as exc:
            self.missing = str(exc)

    async def complete_all(
        self,
        *,
        slices: int = 1,
        after_slice: Callable[[int], Awaitable[None]] | None = None,
        timeout: float = 300,
    ) -> None:
        """Move every TrainJob to Complete in *slices*, awaiting *after_slice(n)* after each
        but the last; then wait for a completion event of each."""
        kubeconfig, namespace = self.config.kubeconfig, self.config.namespace
        names = sorted(trainjob_names(kubeconfig, namespace))
        for n in range(slices):
            await asyncio.to_thread(complete_trainjobs, kubeconfig, namespace, names[n::slices])
            if after_slice is not None and n < slices - 1:
                await after_slice(n)

        async def all_completed() -> bool:
            out = await read_topic(self.config.bootstrap, self.config.topics["out"])
            return set(completions_by_job(out)) >= set(names)

        await wait_for(
            all_completed,
            what="a completion event per TrainJob",
            timeout=timeout,
            interval=2.0,
            on_timeout=self.diagnosis,
        )

    async def summary(self, *, suite: str, faults: str, settle: float = 3.0) -> Summary:
        """Stop the workers (after *settle* s, so that a late duplicate shows) and count."""
        await asyncio.sleep(settle)
        for worker in self.workers:
            worker.stop()
        bootstrap, topics = self.config.bootstrap, self.config.topics
        out = await read_topic(bootstrap, topics["out"])
        return Summary(
            suite=suite,
            events_sent=len(self.events),
            expected=self.expected,
            trainjobs=trainjob_keys(self.config.kubeconfig, self.config.namespace),
            completions=completions_by_job(out),
            completion_copies=sum(1 for e in out if e.type == COMPLETED),
            dlq=await count_records(bootstrap, topics["dlq"]),
            faults=faults,
            details=self.missing,
        )


@dataclass(frozen=True)
class FaultEnv:
    """Everything a fault suite runs against; built by the `fault_env` fixture."""

    bootstrap: str
    kube_api: KubeEndpoint
    namespace: str
    topics: dict[str, str]
    rules: Path
    workers: Callable[..., list[WorkerProcess]]
    tmp_path: Path

    def prepare_run(self, plan: StreamPlan, *, group: str) -> FaultRun:
        """A run of *plan* by workers in consumer group *group* (no worker started yet)."""
        return FaultRun.prepare(
            plan=plan,
            bootstrap=self.bootstrap,
            topics=self.topics,
            rules=self.rules,
            kubeconfig=self.kube_api.kubeconfig,
            namespace=self.namespace,
            group=group,
        )

"""The composition root: one tuneloop worker, wired from settings, rules and a backend.

`tuneloop run` builds and runs a worker here (`make_backend`, `build_worker`, `run_worker`);
tests build one in-process and run it with `faust.contrib.asgi.faust_app_running`. Nothing
else in the tree wires adapters together, and no other module of `handlers/` imports
`runtimes/` (import-linter holds this: `.importlinter`). `build_worker` constructs in order,
each part from the ones before it: the faust App (`handlers/faust_app.py`) → the publisher →
the Tables → the orchestrator → the agents and timers that feed it.

What runs inside one worker (one faust app, one consumer group):

- the intake (`handlers/intake.py`): decode, validate, dedup, dead-letter, and re-key each
  event by the rule engine's `route()`;
- stage 2's sink (one lane per keyed partition): `Orchestrator.handle` (`orchestrator/service.py`)
  with the rule state per key, the completion record per job and the champion adapter per rule and
  key (rules with `promote:`) in faust Tables (changelog topics: state survives restarts and moves
  with its partition on a rebalance);
- the observation pump: the backend's phase changes, sent as internal signals onto the keyed
  topic under the job's rule key, so the key's owner announces them and releases concurrency;
- the ticker: timers of local keys that fell due (debounce, held events, deferred launches),
  sent as internal signals the same way;
- the rule reloader: new valid rule files take effect without a restart;
- the one web server (`handlers/web/`), when `settings.worker.web_port` is set: `/healthz`,
  `/readyz`, `/metrics` and the HTTP CloudEvents ingress `POST /events`. `_web_routes` lists
  the route tables it serves; a module with pages adds its table there.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TextIO, cast

import faust
import structlog
from aiohttp import web

from handlers.codec import EncodingMode, KafkaRecord, RecordInfo, encode_event
from handlers.dashboard import Dashboard, install_dashboard
from handlers.faust_app import new_app
from handlers.garbage_collection import settle_before_serving
from handlers.intake import (
    FORWARD_HEADERS,
    Intake,
    install_intake,
    seen_events,
)
from handlers.rules_reloading import RulesReloader
from handlers.tracing import NO_TRACING, Tracing, tracing_from_environment
from handlers.web import health, ingress, metrics
from handlers.web.health import HealthWatch, PartitionLag
from handlers.web.metrics import IngressStats, WorkerCounts
from handlers.web.server import WebServer, web_server
from orchestrator import signals
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import ConfigError
from orchestrator.events import CloudEvent
from orchestrator.jobs.completion import CompletionRecord
from orchestrator.jobs.model import JobPhase, JobRef
from orchestrator.jobs.persistence import record_from_json, record_to_json
from orchestrator.jobs.tracking import Milestone
from orchestrator.ledger import DecisionRecord, Outcome
from orchestrator.ports import (
    ChampionStore,
    RecallsJobContext,
    RemovesFinishedJobs,
    TrainingBackend,
)
from orchestrator.rules import engine, loading, state_encoding
from orchestrator.rules.engine import KeyState, RuleSet
from orchestrator.service import Orchestrator
from orchestrator.settings import BackendKind, KafkaSettings, Settings
from orchestrator.sweeps import suggesting
from orchestrator.sweeps.spec import Algorithm, SweepSpec
from orchestrator.sweeps.state import Trial
from orchestrator.sweeps.suggesting import Suggesters
from orchestrator.sweeps.tracking import SweepTracker
from orchestrator.vocabulary.registry import SchemaRegistry

log = structlog.get_logger("tuneloop.worker")

FINISHED_JOB_RETENTION = timedelta(days=1)
"""How long a finished, announced TrainJob stays on the cluster for people to look at."""
FINISHED_JOB_SWEEP_SECONDS = 600.0
RULE_STATE_TABLE = "tuneloop-rule-state"
JOBS_TABLE = "tuneloop-jobs"
CHAMPIONS_TABLE = "tuneloop-champions"


class TableKeyStates:
    """`KeyStateStore` on a faust Table: key → the state's compact bytes
    (`orchestrator/rules/state_encoding.py`), which are also what its changelog carries (the
    Table's values are bytes, so faust writes them as they are). A value an earlier version
    wrote (`KeyState.to_json()` through faust's json codec) still loads.

    It also keeps, in memory, when each key's timers are next due, so that the ticker looks
    at the keys with timers instead of decoding every key's state every second (which cost
    the worker more than its events once it held a few thousand keys). The index follows
    every `save`; after a rebalance, when the Table holds other partitions, it is rebuilt
    once from the Table.

    It also remembers the decoded state of the keys it saved last: decoding a key with many
    rules costs more than evaluating the event, and a busy key is loaded again soon. A
    remembered state is used only while the Table still holds the very object it was saved
    as, so a value recovered from the changelog (a new object) is always decoded afresh.
    """

    def __init__(self, table: Any, *, remembered_keys: int = 4096) -> None:
        self._table = table
        self._wakeups: dict[str, datetime] = {}
        self._index_stale = True
        self._remembered: dict[str, tuple[object, KeyState]] = {}
        self._remembered_keys = remembered_keys

    def load(self, key: str) -> KeyState | None:
        raw = self._table.get(key)
        if not raw:
            return None
        remembered = self._remembered.get(key)
        if remembered is not None and remembered[0] is raw:
            return remembered[1]
        return state_encoding.decode(raw)

    def save(self, key: str, state: KeyState) -> None:
        raw = state_encoding.encode(state)
        self._table[key] = raw
        # Re-inserted at the end, so the oldest saved key is the one forgotten first.
        self._remembered.pop(key, None)
        self._remembered[key] = (raw, state)
        if len(self._remembered) > self._remembered_keys:
            del self._remembered[next(iter(self._remembered))]
        due = engine.next_wakeup(state)
        if due is None:
            self._wakeups.pop(key, None)
        else:
            self._wakeups[key] = due

    def items(self) -> list[tuple[str, KeyState]]:
        """Every key this worker owns now (the Table holds only assigned partitions)."""
        return [(key, state_encoding.decode(raw)) for key, raw in list(self._table.items()) if raw]

    def forget_wakeups(self) -> None:
        """The Table's partitions changed (a rebalance): rebuild the index when next asked."""
        self._index_stale = True

    def due(self, now: datetime) -> list[tuple[str, datetime]]:
        """Keys whose timers are due at *now*, with when they fell due."""
        if self._index_stale:
            self._index_stale = False
            self._wakeups = {
                key: due
                for key, state in self.items()
                if (due := engine.next_wakeup(state)) is not None
            }
        return [(key, due) for key, due in self._wakeups.items() if due <= now]


class TableCompletions:
    """`CompletionStore` on a faust Table: job name → completion record."""

    def __init__(self, table: Any) -> None:
        self._table = table

    async def load(self, job: str) -> CompletionRecord | None:
        raw = self._table.get(job)
        return record_from_json(raw) if raw else None

    async def save(self, record: CompletionRecord) -> None:
        self._table[record.job] = record_to_json(record)

    def key_of(self, job: str) -> str | None:
        raw = self._table.get(job)
        context = raw.get("context") if raw else None
        return context.get("key") if context else None

    def phases(self) -> dict[str, int]:
        """How many jobs of this worker's partitions are in each phase (for `/metrics`)."""
        counts: dict[str, int] = {}
        for raw in list(self._table.values()):
            # A job created and not yet observed is waiting to start: Pending.
            phase = (raw or {}).get("phase") or JobPhase.PENDING.value
            counts[phase] = counts.get(phase, 0) + 1
        return counts


class TableChampions:
    """`ChampionStore` on a faust Table: `<rule>/<key>` -> the champion adapter, with the job
    that made it and its scores.

    The champion of a rule and key is read and moved only by the partition lane that owns the
    key's partition (at a launch, and when a job of the key succeeded), so the Table's
    partition is the key's, like the rule state's: it survives restarts through its changelog
    topic and moves with the key on a rebalance, on either backend, with no storage of its
    own to configure. (Rule names hold no `/`, so the Table key is unambiguous.)
    """

    def __init__(self, table: Any) -> None:
        self._table = table

    async def current(self, rule: str, key: str) -> str | None:
        raw = self._table.get(f"{rule}/{key}")
        return str(raw["adapter_uri"]) if raw else None

    async def promote(
        self,
        rule: str,
        key: str,
        adapter_uri: str,
        job_name: str,
        scores: Mapping[str, float],
    ) -> None:
        self._table[f"{rule}/{key}"] = {
            "adapter_uri": adapter_uri,
            "job": job_name,
            "scores": dict(scores),
        }


class FaustTopicPublisher:
    """The worker's `EventPublisher`: tuneloop's events go out through faust's own producer.

    faust flushes its producer before it commits the input offsets, so an audit record or a
    completion event is on the broker before the input that caused it counts as processed,
    without waiting for an acknowledgement per event (which capped a partition at a few
    dozen events a second). A crash before the flush replays the input, which publishes the
    same events again, with the same ids.
    """

    def __init__(self, app: faust.App, kafka: KafkaSettings) -> None:
        self._app = app
        self._default_topic = kafka.topic_out
        self._mode = EncodingMode(str(kafka.output_mode))

    async def publish(self, event: CloudEvent, *, topic: str | None = None) -> None:
        record = encode_event(event, mode=self._mode)
        # straight to faust's producer, not through a faust Topic: the record is already
        # bytes, and a Topic's send (serializers, a FutureMessage and its callbacks) cost
        # 7.8 % of the worker's CPU under load (docs/performance.md, profile before this).
        await self._app.producer.send(
            topic or self._default_topic,
            record.key,
            record.value,
            None,
            None,
            list(record.headers),
        )


@dataclass(slots=True)
class Worker:
    """A wired worker: run `app` (faust) and everything else runs with it."""

    app: faust.App
    intake: Intake
    orchestrator: Orchestrator
    reloader: RulesReloader
    publisher: FaustTopicPublisher
    counts: WorkerCounts = field(default_factory=WorkerCounts)
    ticks_pending: dict[str, datetime] = field(default_factory=dict)
    background: set[asyncio.Task[None]] = field(default_factory=set)
    web: WebServer | None = None
    """The web server, when `settings.worker.web_port` asks for one."""
    health: HealthWatch | None = None
    ingress: IngressStats = field(default_factory=IngressStats)
    dashboard: Dashboard | None = None
    """The read-only dashboard's pages, which the web server mounts (`handlers/dashboard/`)."""
    champions: ChampionStore | None = None
    """Where each rule and key's champion adapter is (rules with `promote:`)."""


def build_worker(
    settings: Settings,
    *,
    backend: TrainingBackend,
    rule_paths: Sequence[str | Path] | None = None,
    clock: Clock | None = None,
    registry: SchemaRegistry | None = None,
    tick_interval: float = 1.0,
    reload_interval: float = 2.0,
    tracing: Tracing | None = None,
    champions: ChampionStore | None = None,
    **faust_options: Any,
) -> Worker:
    """Wire a worker, in construction order (see the module docstring).

    Args:
        settings: the process settings (`Settings.from_env()`, maybe with CLI overrides).
        backend: where training runs (`make_backend(settings, clock=...)`, or a fake).
        rule_paths: rule files or directories; `settings.worker.rules` when omitted.
        clock: the time; the system clock when omitted.
        registry: schemas of known event types; the built-in vocabulary when omitted.
        tick_interval: seconds between looks for due timers.
        reload_interval: seconds between looks for changed rule files.
        tracing: where decision spans go; from OpenTelemetry's standard variables when
            omitted (`handlers/tracing.py`: a no-op unless an OTLP endpoint is set).
        champions: where each rule and key's champion adapter is (rules with `promote:`);
            when omitted, MLflow's registry (the alias `champion`) if
            `settings.mlflow.tracking_uri` is set, else a faust Table of this worker
            (`TableChampions`).
        **faust_options: passed to `faust.App` (e.g. `broker_commit_interval` in tests).

    Raises:
        ConfigError: the rule files are invalid or none are named (refuse to start).
    """
    clock = clock or SystemClock()
    kafka = settings.kafka
    paths = tuple(rule_paths) if rule_paths is not None else settings.worker.rules
    if not paths:
        raise ConfigError("no rule files: pass --rules or set TUNELOOP_RULES")
    rules = loading.load_rules(paths)
    counts = WorkerCounts(rules_version=rules.version)

    app = new_app(kafka, **faust_options)
    publisher = FaustTopicPublisher(app, kafka)
    partitions = kafka.internal_partitions
    states = TableKeyStates(
        # bytes: faust's raw codec, so the changelog carries the encoded state as it is
        app.Table(RULE_STATE_TABLE, default=None, partitions=partitions, value_type=bytes)
    )
    completions = TableCompletions(app.Table(JOBS_TABLE, default=None, partitions=partitions))
    if champions is None and settings.mlflow.tracking_uri is not None:
        champions = mlflow_champions(settings)
    if champions is None:
        champions = TableChampions(app.Table(CHAMPIONS_TABLE, default=None, partitions=partitions))
    seen = seen_events(app, kafka)
    orchestrator = Orchestrator(
        rules=rules,
        backend=backend,
        publisher=publisher,
        states=states,
        completions=completions,
        clock=clock,
        audit_topic=kafka.topic_audit,
        output_topic=kafka.topic_out,
        why_not_per_minute=settings.worker.why_not_per_minute,
        champions=champions,
        suggesters=sweep_suggesters(),
        sweep_tracker=mlflow_sweeps(settings) if settings.mlflow.tracking_uri else None,
    )
    worker_tasks: set[asyncio.Task[None]] = set()

    def router(event: CloudEvent) -> tuple[str, ...]:
        current = orchestrator.rules
        why_not = orchestrator.why_not_records(event)
        if why_not:
            # Rules that name the event's type but did not consider it leave why-not records
            # (`ignore`, `error`) in the audit topic: "why did this event do nothing?".
            task = asyncio.ensure_future(_audit_why_not(orchestrator, event, why_not))
            worker_tasks.add(task)
            task.add_done_callback(worker_tasks.discard)
        return tuple(dict.fromkeys(route.key for route in engine.route(current, event)))

    spans = tracing if tracing is not None else tracing_from_environment(os.environ)

    async def sink(key: str, event: CloudEvent, info: RecordInfo) -> None:
        # A span per producer's event; internal signals (ticks, observations) would be noise.
        traced = NO_TRACING if signals.is_internal(event.type) else spans
        with traced.decision(event, key=key) as span:
            records = await orchestrator.handle(
                key,
                event,
                arrived_at=info.timestamp,
                sequence=info.sequence,
                position=info.position,
            )
            span.decided(records)
        created = clock.now()
        for record in records:
            counts.decisions[(record.rule, record.outcome.value)] += 1
            if record.outcome is Outcome.LAUNCH:
                # The service created the job before `handle` returned.
                counts.launch_latency.observe((created - record.time).total_seconds())

    def accepts_unknown_type(event_type: str) -> bool:
        # Internal signal types are never accepted from producers: nobody may forge a job
        # observation or a tick. Other types without a schema pass only if a rule listens.
        if signals.is_internal(event_type):
            return False
        return event_type in orchestrator.rules.by_type

    intake = install_intake(
        app,
        kafka,
        seen=seen,
        router=router,
        sink=sink,
        registry=registry,
        accepts_unknown_type=accepts_unknown_type,
        clock=clock,
    )

    def use_rules(new: RuleSet) -> None:
        orchestrator.replace_rules(new)
        counts.rules_version = new.version

    reloader = RulesReloader(paths, on_change=use_rules, current=rules)
    worker = Worker(
        app=app,
        intake=intake,
        orchestrator=orchestrator,
        reloader=reloader,
        publisher=publisher,
        counts=counts,
        background=worker_tasks,
        champions=champions,
    )
    worker.dashboard = install_dashboard(
        app, kafka, rules=lambda: orchestrator.rules, key_states=states, clock=clock
    )
    _add_web_server(worker, settings, completions=completions, clock=clock)
    _run_alongside(
        worker,
        backend=backend,
        states=states,
        completions=completions,
        clock=clock,
        partitions=partitions,
        tick_interval=tick_interval,
        reload_interval=reload_interval,
    )
    return worker


def run_worker(worker: Worker, settings: Settings, *, log_level: str) -> None:
    """Run *worker* in the foreground until interrupted (`tuneloop run`); its web server,
    if it has one, runs with it."""
    del settings  # read once, by build_worker
    runner = foreground(worker.app, log_level=log_level)
    settle_before_serving()
    runner.execute_from_commandline()


def foreground(app: faust.App, *, log_level: str) -> faust.Worker:
    """faust's Worker that runs *app* in this process, logging at *log_level* and no lower."""
    runner = faust.Worker(app, loglevel=log_level.upper(), quiet=True)
    # At WARNING and above faust draws a terminal spinner, and feeds it by setting the root
    # logger to DEBUG: every debug line of aiokafka and faust then became a LogRecord that
    # nothing showed, 6 % of the worker's CPU at `--log-level warning` (py-spy, make bench).
    # A worker's output is its log lines, not a terminal.
    runner.spinner = None
    return runner


def _add_web_server(
    worker: Worker, settings: Settings, *, completions: TableCompletions, clock: Clock
) -> None:
    """Add the one web server and the health watch to the App (see `handlers/web/`)."""
    options = settings.worker
    batches = worker.intake.input_batches

    async def intake_lag() -> tuple[PartitionLag, ...]:
        # stage 1 reads the input topics in a group of its own, beside faust's consumer
        return tuple(
            PartitionLag(topic=topic, partition=partition, end_offset=end, committed=done)
            for (topic, partition), (end, done) in (await batches.progress()).items()
        )

    watch = HealthWatch(
        worker.app,
        loop_stall=options.health_loop_stall,
        progress_stall=options.health_progress_stall,
        more_lag=intake_lag,
    )
    ends = () if worker.dashboard is None else (worker.dashboard.board.close,)
    server = web_server(
        options,
        _web_routes(worker, settings, watch=watch, completions=completions, clock=clock),
        on_shutdown=ends,
    )
    if server is None:
        return
    # Dependencies added before the App starts start first: the probes answer during table
    # recovery (see handlers/web/server.py for why faust's own web server is not used).
    worker.app.add_dependency(watch)
    worker.app.add_dependency(server)
    worker.web, worker.health = server, watch


def _web_routes(
    worker: Worker,
    settings: Settings,
    *,
    watch: HealthWatch,
    completions: TableCompletions,
    clock: Clock,
) -> list[web.RouteTableDef]:
    """Every route table the web server serves."""
    app, reloader = worker.app, worker.reloader
    input_topic = settings.kafka.topics_in[0]

    async def forward(record: KafkaRecord) -> None:
        producer: Any = app.producer
        if not producer.started:
            raise RuntimeError("the producer is not running")
        await producer.send_and_wait(
            input_topic, record.key, record.value, None, None, list(record.headers)
        )

    return [
        health.routes(watch),
        metrics.routes(
            metrics.Sources(
                intake=worker.intake.stats,
                worker=worker.counts,
                ingress=worker.ingress,
                retries=lambda: worker.orchestrator.retries,
                lag=lambda: watch.partitions,
                jobs_by_phase=completions.phases,
                reloads=lambda: {"applied": reloader.applied, "rejected": reloader.rejected},
                loop_lag=lambda: watch.last_beat_late,
            )
        ),
        ingress.routes(
            admission=worker.intake.admission,
            forward=forward,
            credentials=ingress.Credentials(
                token=settings.worker.ingress_token,
                client_certificates=settings.worker.web_tls_client_ca_file is not None,
                trusted_networks=settings.worker.ingress_trusted_networks,
            ),
            stats=worker.ingress,
            ack_timeout=settings.worker.ingress_ack_timeout,
            now=clock.now,
        ),
        *([worker.dashboard.routes()] if worker.dashboard is not None else []),
    ]


def _run_alongside(
    worker: Worker,
    *,
    backend: TrainingBackend,
    states: TableKeyStates,
    completions: TableCompletions,
    clock: Clock,
    partitions: int,
    tick_interval: float,
    reload_interval: float,
) -> None:
    """Register what runs beside the agents: the observation pump, the ticker, the reloader."""
    app, intake, reloader = worker.app, worker.intake, worker.reloader
    # faust's decorators are untyped; the functions below are checked, their registration not
    faust_app = cast(Any, app)
    keyed = app.topic(
        intake.keyed_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
        internal=True,
    )

    async def send_signal(key: str, event: CloudEvent) -> None:
        record = encode_event(event)
        await keyed.send(
            key=key.encode("utf-8"),
            value=record.value,
            headers=[*record.headers, *_signal_origin(intake.keyed_topic)],
        )
        worker.counts.signals_sent += 1

    async def pump_observations() -> None:
        async for observation in backend.observe():
            if worker.dashboard is not None:  # its jobs page shows phase and progress
                worker.dashboard.board.observe(observation)
            key = completions.key_of(observation.job.name) or await _recover_key(
                backend, observation.job
            )
            if key is None:
                log.warning("observation_unclaimed", job=observation.job.name)
                continue
            await send_signal(key, signals.observation_event(observation, key=key))

    async def tick_due_keys() -> None:
        now = clock.now()
        for key, due in states.due(now):
            if worker.ticks_pending.get(key) == due:
                continue
            worker.ticks_pending[key] = due
            await send_signal(key, signals.tick_event(signals.Tick(key=key, at=now)))

    def rebuild_wakeups(sender: Any, *args: Any, **kwargs: Any) -> None:
        # After recovery the Table holds exactly the assigned partitions' keys.
        states.forget_wakeups()

    async def reload_rules() -> None:
        await reloader.watch(interval=reload_interval)

    async def remove_finished_jobs() -> None:
        # Kubeflow Trainer keeps finished TrainJobs forever; remove ours once their outcome
        # was announced (a job of another worker's partition reads as not announced: kept).
        if not isinstance(backend, RemovesFinishedJobs):
            return

        async def announced(job: str) -> bool:
            record = await completions.load(job)
            return record is not None and bool(
                {Milestone.COMPLETED, Milestone.FAILED} & set(record.announced)
            )

        removed = await backend.remove_finished(
            finished_before=clock.now() - FINISHED_JOB_RETENTION, announced=announced
        )
        if removed:
            log.info("finished_jobs_removed", jobs=list(removed))

    async def close_backend(sender: Any, **kwargs: Any) -> None:
        # Once the consumer has stopped: the Kubernetes backend's pooled HTTP session
        # (runtimes/kubernetes/async_api.py), the local backend's job watch. A backend that
        # is used again afterwards opens them again.
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()

    cast(Any, app.on_before_shutdown).connect(close_backend)
    cast(Any, app.on_rebalance_complete).connect(rebuild_wakeups)
    faust_app.task(pump_observations)
    faust_app.timer(interval=tick_interval)(tick_due_keys)
    faust_app.task(reload_rules)
    faust_app.timer(interval=FINISHED_JOB_SWEEP_SECONDS)(remove_finished_jobs)


async def _audit_why_not(
    orchestrator: Orchestrator, event: CloudEvent, records: tuple[DecisionRecord, ...]
) -> None:
    try:
        await orchestrator.audit(records)
    except Exception:  # the audit of an unconsidered event must never stop the intake
        log.exception("why_not_audit_failed", event_id=event.id)


async def _recover_key(backend: TrainingBackend, job: JobRef) -> str | None:
    """The rule key of a job this worker has no record of (launched before a restart, or by
    another worker), from what the backend stored with the job."""
    if not isinstance(backend, RecallsJobContext):
        return None
    context = await backend.context_of(job)
    return context.key if context is not None and context.key else None


def _signal_origin(topic: str) -> list[tuple[str, bytes]]:
    """The forward block stage 2 expects, for a signal that came from no input
    record (see `handlers/intake.py`, FORWARD_HEADERS)."""
    values = (topic, "-1", "-1", "", "-", "0")
    return [
        (name, value.encode("utf-8")) for name, value in zip(FORWARD_HEADERS, values, strict=True)
    ]


def mlflow_champions(settings: Settings) -> ChampionStore:
    """The champion store on MLflow's registry at `settings.mlflow.tracking_uri`, with MLflow's
    own credential variables (docs/tracking.md)."""
    from runtimes.tracking import TrackingSettings
    from runtimes.tracking.champions import MlflowChampionStore

    return MlflowChampionStore(
        TrackingSettings.from_env(
            os.environ,
            tracking_uri=settings.mlflow.tracking_uri,
            request_timeout=settings.mlflow.request_timeout,
        )
    )


def mlflow_sweeps(settings: Settings) -> SweepTracker:
    """Each sweep as a parent run of its trials' runs on the MLflow server at
    `settings.mlflow.tracking_uri` (docs/tracking.md)."""
    from runtimes.tracking import TrackingSettings
    from runtimes.tracking.sweeps import MlflowSweepTracker

    return MlflowSweepTracker(
        TrackingSettings.from_env(
            os.environ,
            tracking_uri=settings.mlflow.tracking_uri,
            request_timeout=settings.mlflow.request_timeout,
        )
    )


def make_backend(settings: Settings, *, clock: Clock) -> TrainingBackend:
    """The backend `settings.worker.backend` names, ready for `build_worker`.

    The Kubernetes backend takes `settings.kubernetes` (namespace, trainer image, output base
    URI, timeouts) and connects with `settings.worker.kubeconfig`, or, inside a pod, with its
    ServiceAccount.

    Raises:
        ConfigError: what the backend needs is missing or invalid.
    """
    worker = settings.worker
    if worker.backend is BackendKind.LOCAL:
        from runtimes.localprocess.backend import LocalProcessBackend

        root = worker.local_root or Path.home() / ".cache" / "tuneloop" / "jobs"
        return LocalProcessBackend(
            root,
            max_concurrent=worker.local_max_jobs,
            clock=clock,
            tracking_uri=settings.mlflow.tracking_uri,
        )
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config

    from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend

    config = cast(Any, kube_config)  # an untyped library
    if worker.kubeconfig is not None:
        api_client = config.new_client_from_config(config_file=str(worker.kubeconfig))
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise ConfigError(
                "the kubernetes backend needs a cluster: set TUNELOOP_KUBECONFIG (or"
                " --kubeconfig), or run inside a pod with a ServiceAccount"
            ) from None
        api_client = kube_client.ApiClient()
    return KubernetesBackend.from_api_client(
        api_client,
        clock=clock,
        settings=BackendSettings.from_settings(
            settings.kubernetes, mlflow_tracking_uri=settings.mlflow.tracking_uri
        ),
    )


# --- what the demo borrows from the trainer (only this module imports runtimes/) ----------


class ProgressReporter(Protocol):
    """Shows the trainer's progress lines (`runtimes/trainer/progress.py`)."""

    def emit(self, event: str, /, **fields: Any) -> None: ...


def sweep_suggesters() -> Suggesters:
    """The suggesters of every sweep algorithm: the core's random and grid, and TPE through
    optuna (`runtimes/sweeps/optuna_tpe.py`), for the worker and `tuneloop simulate`."""
    return {**suggesting.PURE, Algorithm.TPE: TpeOnFirstUse()}


class TpeOnFirstUse:
    """`OptunaTpeSuggester`, made at the first TPE suggestion rather than when a worker is
    built: importing optuna (and numpy) took 0.15-0.2 s of every worker's cold start, and a
    worker whose rules have no TPE sweep never needs it. The first suggestion pays the import
    once, on the event loop."""

    def __init__(self) -> None:
        self._tpe: suggesting.Suggester | None = None

    def suggest(
        self, spec: SweepSpec, trials: Sequence[Trial], index: int
    ) -> Mapping[str, Any] | None:
        if self._tpe is None:
            from runtimes.sweeps.optuna_tpe import OptunaTpeSuggester

            self._tpe = OptunaTpeSuggester()
        return self._tpe.suggest(spec, trials, index)


def progress_bar(stream: TextIO = sys.stdout) -> ProgressReporter:
    """The trainer's own redrawn progress bar, for `tuneloop demo` on a terminal."""
    from runtimes.trainer.progress import BarReporter

    return BarReporter(stream)


def upload_file(local: Path, uri: str, *, environ: Mapping[str, str]) -> None:
    """Copy the file *local* to *uri* through the storage layer (`runtimes/storage`), with the
    endpoint and keys *environ* gives the trainer: how `tuneloop demo` puts its dataset on
    its S3 server.

    Raises:
        runtimes.storage.StorageError: the store refused or did not answer.
    """
    from runtimes.storage import StorageSettings, parse_location
    from runtimes.storage.filesystems import filesystem_for, translated_errors

    location = parse_location(uri)
    fs = filesystem_for(location, StorageSettings.from_env(environ))
    with translated_errors(location), fs.open(location.path, "wb") as handle:
        handle.write(local.read_bytes())

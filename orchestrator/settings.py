"""Process settings of tuneloop: one `Settings` root, built once from the environment.

`Settings.from_env()` is called by the composition root (`handlers/app.py`, the CLI) and the
result is passed explicitly to whatever needs it; nothing here is a singleton. Every field
has an attribute docstring giving its unit, its default and why the default is what it is;
`docs/reference/settings.md` is generated from these docstrings.

Settings are not rules: what to train and when lives in versioned rule files. These are the
knobs of the process (where Kafka is, how big an event may be).

Groups: `WorkerSettings` (what `tuneloop run` starts: rules, backend, its web server),
`KafkaSettings` and `KubernetesSettings` (the Kubernetes backend). A new area adds its own
frozen group dataclass here as a new field of `Settings` with a default, plus a
`_<group>_from_env` reader called by `Settings.from_env`.

This is the only place that reads `TUNELOOP_*` variables of the worker. Command-line flags
override a value by `dataclasses.replace` on what `from_env` returned, never by reading the
environment themselves (`handlers/cli/worker_commands.py`).
"""

from __future__ import annotations

import enum
import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from orchestrator.errors import ConfigError

_T = TypeVar("_T")
_Choice = TypeVar("_Choice", bound=enum.StrEnum)

ENV_PREFIX = "TUNELOOP_"
"""Every environment variable tuneloop reads starts with this."""


class SecurityProtocol(enum.StrEnum):
    """How the connection to the brokers is protected (Kafka's `security.protocol`)."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(enum.StrEnum):
    """How a SASL client proves who it is."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class OutputMode(enum.StrEnum):
    """How tuneloop writes its own CloudEvents to Kafka (the binding's two modes)."""

    BINARY = "binary"
    STRUCTURED = "structured"


class BackendKind(enum.StrEnum):
    """Where training runs."""

    LOCAL = "local"
    """A subprocess of the trainer on this machine (the default for one machine)."""
    KUBERNETES = "kubernetes"
    """Kubeflow Trainer v2 TrainJobs on the cluster of a kubeconfig."""


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What `tuneloop run` starts. Environment variables are `TUNELOOP_<FIELD>` in upper
    case, e.g. `TUNELOOP_BACKEND`; each has a `tuneloop run` option of the same name."""

    rules: tuple[Path, ...] = ()
    """Rule files or directories, watched and reloaded while running (space-separated in the
    environment). Required by `tuneloop run`; default none."""

    backend: BackendKind = BackendKind.LOCAL
    """Where training runs: `local` or `kubernetes`. Default `local`: one machine needs no
    cluster."""

    local_root: Path | None = None
    """local backend: where job directories go. Default none, meaning
    `~/.cache/tuneloop/jobs`."""

    local_max_jobs: int = 1
    """local backend: trainers running at once. Default 1: one small GPU or CPU is busy with
    one fine-tune."""

    kubeconfig: Path | None = None
    """kubernetes backend: the kubeconfig of the cluster. Default none: inside a pod, its
    ServiceAccount."""

    web_port: int | None = None
    """Serve the worker's one web server (`/healthz`, `/readyz`, `/metrics`, `POST /events`)
    on this TCP port; `0` picks a free one. `TUNELOOP_METRICS_PORT`, its name before the
    server did more than metrics, is read when this is unset. Default none: no web server, so
    that several workers on one machine never fight over a port; the Helm chart sets 8080."""

    web_bind: str = "127.0.0.1"
    """Address the web server listens on. Default `127.0.0.1`: nothing is reachable from
    another machine unless configured; the chart sets `0.0.0.0` for the kubelet's probes."""

    ingress_token: str | None = field(default=None, repr=False)
    """Bearer token a sender of `POST /events` must present (`Authorization: Bearer ...`);
    never logged or shown in `repr`. Default none: with no token and no mTLS, only loopback
    may send."""

    ingress_trusted_networks: tuple[str, ...] = ()
    """Networks (CIDR, comma-separated in the environment) that may `POST /events` without a
    credential, e.g. the pod network when a NetworkPolicy admits only the namespace of a
    Knative broker (whose senders attach no static token). Default none."""

    web_tls_cert_file: str | None = None
    """PEM certificate the web server presents (HTTPS); needs `web_tls_key_file`. Default
    none: plain HTTP."""

    web_tls_key_file: str | None = None
    """PEM private key of `web_tls_cert_file`. Default none."""

    web_tls_client_ca_file: str | None = None
    """PEM CAs whose client certificates may send to `POST /events` (mTLS); needs
    `web_tls_cert_file`. Probes need no certificate. Default none: no mTLS."""

    ingress_ack_timeout: float = 10.0
    """Seconds `POST /events` waits for the broker to acknowledge the write before it answers
    503 with `Retry-After`, so that the sender retries. Default 10: a Knative sender's own
    request timeout is longer, and a healthy broker acknowledges in milliseconds."""

    health_loop_stall: float = 10.0
    """Seconds the event loop may go without a heartbeat before `/healthz` fails. Default 10:
    a loop busy that long answers neither Kafka nor probes."""

    health_progress_stall: float = 300.0
    """Seconds the consumer may commit nothing while its partitions have lag before
    `/healthz` fails. Default 300: longer than the backend retries of a short API outage,
    which hold a partition on purpose (a restart would not help them)."""

    why_not_per_minute: int = 10
    """Why-not records (a rule that names an event's type but did not consider it) one rule
    may write to the audit topic per minute of event time; the next one counts those left
    out. Default 10: enough to see what a rule turns away, too few for a noisy producer to
    flood the topic (docs/rules.md, "Why-not records")."""

    def __post_init__(self) -> None:
        if self.local_max_jobs <= 0:
            raise ConfigError("TUNELOOP_LOCAL_MAX_JOBS must be positive")
        if self.web_port is not None and not 0 <= self.web_port < 65536:
            raise ConfigError(f"TUNELOOP_WEB_PORT={self.web_port} is not a TCP port")
        if (self.web_tls_cert_file is None) != (self.web_tls_key_file is None):
            raise ConfigError(
                "HTTPS needs both TUNELOOP_WEB_TLS_CERT_FILE and TUNELOOP_WEB_TLS_KEY_FILE"
            )
        if self.web_tls_client_ca_file is not None and self.web_tls_cert_file is None:
            raise ConfigError(
                "mTLS (TUNELOOP_WEB_TLS_CLIENT_CA_FILE) needs TUNELOOP_WEB_TLS_CERT_FILE"
            )
        for network in self.ingress_trusted_networks:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ConfigError(
                    f"TUNELOOP_INGRESS_TRUSTED_NETWORKS: {network!r} is not a network (CIDR)"
                ) from None
        for name in (
            "ingress_ack_timeout",
            "health_loop_stall",
            "health_progress_stall",
            "why_not_per_minute",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"TUNELOOP_{name.upper()} must be positive")


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """How the Kubernetes backend behaves; one per deployment (the Helm chart sets them).

    Environment variables are `TUNELOOP_KUBERNETES_<FIELD>` in upper case, e.g.
    `TUNELOOP_KUBERNETES_NAMESPACE`. `runtimes/kubernetes/backend.py` turns these into its
    `BackendSettings`.
    """

    namespace: str = "default"
    """Namespace the TrainJobs are created in (and watched)."""

    request_timeout: float = 15.0
    """Seconds one API call may take before it counts as a transient failure."""

    watch_timeout: int = 60
    """Seconds one watch request stays open; also how often stuck jobs are re-checked."""

    jobset_timeout: float = 600.0
    """Seconds a TrainJob may wait for its JobSet (any `jobsStatus`) before it is reported
    `Failed` with reason `JobSetNotCreated` (Trainer #2735: a JobSet the controller cannot
    create leaves the status empty)."""

    trainer_image: str = "ghcr.io/tuneloop/lora-trainer:0.1.0"
    """Trainer image; pinned by tag so that a job is reproducible."""

    output_base_uri: str = "file:///var/lib/tuneloop/adapters"
    """Where adapters go when the request does not say: `<base>/<job name>`. The shipped
    runtime (deploy/runtimes/tuneloop-lora.yaml) mounts a volume there."""

    dataset_secret: str | None = None
    """Secret with credentials for the dataset initializer (e.g. `ACCESS_TOKEN`)."""

    model_secret: str | None = None
    """Secret with credentials for the model initializer."""

    storage_secret: str | None = None
    """Secret the trainer's object-store settings come from (keys `AWS_ACCESS_KEY_ID`,
    `AWS_SECRET_ACCESS_KEY`, optional `TUNELOOP_S3_ENDPOINT_URL`, `AWS_REGION`,
    `AWS_SESSION_TOKEN`), given to each TrainJob as env `secretKeyRef`s (docs/storage.md).
    Default none: the pod's own credential chain (IRSA, workload identity)."""

    def __post_init__(self) -> None:
        for name in ("request_timeout", "watch_timeout", "jobset_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"TUNELOOP_KUBERNETES_{name.upper()} must be positive")


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Where the brokers are, which topics tuneloop reads and writes, and the intake limits.

    Environment variables are `TUNELOOP_KAFKA_<FIELD>` in upper case, e.g.
    `TUNELOOP_KAFKA_BOOTSTRAP`, `TUNELOOP_KAFKA_TOPICS_IN=a,b`.
    """

    bootstrap: str = "127.0.0.1:9092"
    """Comma-separated `host:port` list of brokers. Default `127.0.0.1:9092`, the local broker
    of `make services`, so that nothing leaves the machine unless configured."""

    topics_in: tuple[str, ...] = ("tuneloop.events",)
    """Topics the intake consumes CloudEvents from (comma-separated in the environment).
    Default `tuneloop.events`."""

    topic_dlq: str = "tuneloop.dead-letters"
    """Where records that can never be processed go, untouched, with a reason in their
    headers. Default `tuneloop.dead-letters`."""

    topic_out: str = "tuneloop.finetune"
    """Where tuneloop publishes its own events (`io.tuneloop.finetune.*`). Default
    `tuneloop.finetune`."""

    topic_audit: str = "tuneloop.audit"
    """Where decisions (`io.tuneloop.decision.v1`) are recorded, for "why did it fire?".
    Default `tuneloop.audit`."""

    group_id: str = "tuneloop"
    """Consumer group, also the faust app id and so the prefix of internal topics and
    changelogs. Default `tuneloop`. Changing it starts from the topic's beginning with an
    empty dedup table, so change it only on purpose."""

    internal_partitions: int = 8
    """Partitions of tuneloop's internal topics (the repartition topic keyed by rule key,
    changelogs). Default 8, faust's own default; it bounds how many workers share the work,
    and how many keys a worker handles side by side (launches in flight at once). A group's
    count is fixed once its topics exist (`tuneloop run` refuses another); grow it under a new
    group with `tuneloop partitions grow` (docs/partitions.md)."""

    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    """`PLAINTEXT`, `SSL` (TLS, mTLS with a client certificate), `SASL_PLAINTEXT` or
    `SASL_SSL`. Default `PLAINTEXT`, right only for a broker on localhost."""

    sasl_mechanism: SaslMechanism | None = None
    """`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`; required with a `SASL_*` protocol.
    Default none."""

    sasl_username: str | None = None
    """SASL user name. Default none."""

    sasl_password: str | None = field(default=None, repr=False)
    """SASL password; never logged or shown in `repr`. Default none."""

    tls_ca_file: str | None = None
    """PEM file of the CAs that sign the brokers' certificates; none uses the system store.
    Default none."""

    tls_cert_file: str | None = None
    """PEM client certificate for mTLS; needs `tls_key_file`. Default none."""

    tls_key_file: str | None = None
    """PEM private key of the client certificate. Default none."""

    max_event_bytes: int = 1_048_576
    """Largest record value the intake accepts, in bytes; larger ones are dead-lettered with
    `record.too_large`. Default 1 MiB, Kafka's own default `message.max.bytes`: triggers carry
    references to data (a dataset URI), never the data."""

    max_age: timedelta | None = timedelta(hours=24)
    """Events whose `time` (or, without one, record timestamp) is older than this are
    dead-lettered with `event.too_old` instead of triggering training. Seconds in the
    environment; `0` or `none` disables. Default 24 h: a day-old drift alarm should not start
    a job by surprise after an outage. Must not exceed `dedup_ttl`."""

    dedup_ttl: timedelta = timedelta(hours=48)
    """How long an event's (source, id) is remembered to skip duplicates. Seconds in the
    environment. Default 48 h, twice `max_age`: a duplicate arriving after it is forgotten is
    already too old to be accepted, so no event is processed twice."""

    dedup_max_entries: int = 1_000_000
    """Most (source, id) pairs remembered per worker partition; the oldest are forgotten
    first. Default one million (about 100 MB of memory at ~100 bytes each)."""

    output_mode: OutputMode = OutputMode.BINARY
    """How published events are written: `binary` (`ce_*` headers, data as the value; what
    most consumers expect) or `structured` (one JSON envelope). Default `binary`."""

    def __post_init__(self) -> None:
        if not self.bootstrap.strip():
            raise ConfigError("TUNELOOP_KAFKA_BOOTSTRAP is empty: name at least one broker")
        if not self.topics_in:
            raise ConfigError("TUNELOOP_KAFKA_TOPICS_IN is empty: name at least one topic")
        if self.max_event_bytes <= 0:
            raise ConfigError("TUNELOOP_KAFKA_MAX_EVENT_BYTES must be positive")
        if self.internal_partitions <= 0:
            raise ConfigError("TUNELOOP_KAFKA_INTERNAL_PARTITIONS must be positive")
        if self.dedup_max_entries <= 0:
            raise ConfigError("TUNELOOP_KAFKA_DEDUP_MAX_ENTRIES must be positive")
        if self.dedup_ttl <= timedelta(0):
            raise ConfigError("TUNELOOP_KAFKA_DEDUP_TTL must be positive")
        if self.max_age is not None and self.max_age > self.dedup_ttl:
            raise ConfigError(
                f"TUNELOOP_KAFKA_MAX_AGE ({self.max_age}) exceeds TUNELOOP_KAFKA_DEDUP_TTL "
                f"({self.dedup_ttl}): a duplicate could arrive after its first copy is "
                "forgotten yet still be young enough to be processed again"
            )
        uses_sasl = self.security_protocol in (
            SecurityProtocol.SASL_PLAINTEXT,
            SecurityProtocol.SASL_SSL,
        )
        if uses_sasl and (self.sasl_mechanism is None or not self.sasl_username):
            raise ConfigError(
                f"security protocol {self.security_protocol} needs TUNELOOP_KAFKA_SASL_MECHANISM "
                "and TUNELOOP_KAFKA_SASL_USERNAME"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError(
                "mTLS needs both TUNELOOP_KAFKA_TLS_CERT_FILE and TUNELOOP_KAFKA_TLS_KEY_FILE"
            )

    @property
    def uses_tls(self) -> bool:
        """Whether the connection is encrypted."""
        return self.security_protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class HandoffSettings:
    """What `tuneloop handoff` does: which servers get which model's promoted adapters.

    Environment variables are `TUNELOOP_HANDOFF_<FIELD>` in upper case, e.g.
    `TUNELOOP_HANDOFF_TARGETS`. docs/inference.md explains the hand-off.
    """

    targets: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """Model -> base URLs of the vLLM servers that serve it, as a JSON object in the
    environment: `{"<model>": ["http://vllm-a:8000", ...], "*": [...]}`; `*` is for every
    model without its own entry. The model is the completion's `model` (a rule's model id,
    else its key). Default none: `tuneloop handoff` refuses to start without a target."""

    paths: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Adapter URI prefix -> the path prefix where the servers read those adapters, as a JSON
    object (`{"s3://adapters/": "/mnt/adapters/"}`); the longest matching prefix wins.
    Default none: `file://` URIs and absolute paths are passed as they are, and an adapter
    under any other scheme fails with `adapter-not-reachable`."""

    group_id: str = "tuneloop-handoff"
    """Consumer group on the completion topic; its own, so the hand-off reads every
    completion whatever the workers do. Default `tuneloop-handoff`."""

    topic_in: str | None = None
    """Where the completions are read. Default none: `TUNELOOP_KAFKA_TOPIC_OUT`."""

    topic_out: str | None = None
    """Where `adapter.served` and `adapter.handoff_failed` go. Default none:
    `TUNELOOP_KAFKA_TOPIC_OUT`, so that one topic tells a job's story to the end."""

    topic_ledger: str = "tuneloop.handoff.ledger"
    """The compacted topic of the ledger (what each target serves and was asked to serve),
    read whole at start. Default `tuneloop.handoff.ledger`."""

    api_key: str | None = field(default=None, repr=False)
    """Bearer token of the servers (vLLM's `--api-key`); never logged. Default none."""

    request_timeout: float = 120.0
    """Seconds one call to a server may take before it counts as unavailable. Default 120:
    loading an adapter and the first completion with it take seconds on a CPU."""

    smoke_prompt: str = "Hello"
    """The prompt of the smoke-test completion (`model=<lora_name>`). Default `Hello`."""

    smoke_max_tokens: int = 4
    """Tokens the smoke test asks for. Default 4: it proves the adapter answers, no more."""

    retry_first_delay: float = 1.0
    """Seconds before a target that did not answer is tried again; doubled after each
    failure. Default 1."""

    retry_max_delay: float = 60.0
    """The longest wait between two tries of one target. Default 60."""

    retry_report_after: int = 5
    """Tries of a target that does not answer before `handoff_failed` (`will_retry: true`)
    is published; the hand-off keeps trying after it. Default 5 (about 15 s)."""

    def __post_init__(self) -> None:
        for name in ("request_timeout", "retry_first_delay", "smoke_max_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"TUNELOOP_HANDOFF_{name.upper()} must be positive")
        if self.retry_max_delay < self.retry_first_delay:
            raise ConfigError(
                "TUNELOOP_HANDOFF_RETRY_MAX_DELAY must be at least "
                "TUNELOOP_HANDOFF_RETRY_FIRST_DELAY"
            )
        if self.retry_report_after < 1:
            raise ConfigError("TUNELOOP_HANDOFF_RETRY_REPORT_AFTER must be at least 1")
        for model, urls in self.targets.items():
            for url in urls:
                if not url.startswith(("http://", "https://")):
                    raise ConfigError(
                        f"TUNELOOP_HANDOFF_TARGETS: {url!r} (for {model!r}) is not an "
                        "http:// or https:// URL"
                    )


@dataclass(frozen=True, slots=True)
class MlflowSettings:
    """Where runs are tracked and the champion of each rule and key is registered.

    Environment variables are `TUNELOOP_MLFLOW_<FIELD>` in upper case, e.g.
    `TUNELOOP_MLFLOW_TRACKING_URI`. MLflow's own `MLFLOW_TRACKING_TOKEN` (or
    `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`) authenticate; docs/tracking.md
    explains what is logged.
    """

    tracking_uri: str | None = None
    """`http(s)://` of an `mlflow server` (with `--serve-artifacts`, so that the adapter is
    uploaded through it). When set, each job is a run of the experiment `tuneloop/<rule>`,
    each finished job a version of the registered model `tuneloop.<rule>.<key>`, and the
    champion of a rule with `promote:` is the version under the alias `champion` (instead of
    the worker's own table). Both backends give it to the trainer. Default none: nothing is
    tracked."""

    request_timeout: float = 10.0
    """Seconds one call to the server may take. Default 10: the trainer waits for each call,
    and stops tracking a run after one that fails."""

    def __post_init__(self) -> None:
        if self.tracking_uri is not None and not self.tracking_uri.startswith(
            ("http://", "https://")
        ):
            raise ConfigError(
                f"TUNELOOP_MLFLOW_TRACKING_URI={self.tracking_uri!r} is not an http:// or "
                "https:// URL (tuneloop talks to an mlflow server, not to a store directly)"
            )
        if self.request_timeout <= 0:
            raise ConfigError("TUNELOOP_MLFLOW_REQUEST_TIMEOUT must be positive")


@dataclass(frozen=True, slots=True)
class Settings:
    """All of tuneloop's process settings."""

    worker: WorkerSettings = field(default_factory=WorkerSettings)
    """What `tuneloop run` starts: rules, backend, the web server."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    """The broker connection, topics and intake limits."""

    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    """The Kubernetes backend (used only with `backend: kubernetes`)."""

    handoff: HandoffSettings = field(default_factory=HandoffSettings)
    """`tuneloop handoff`: the serving targets of promoted adapters."""

    mlflow: MlflowSettings = field(default_factory=MlflowSettings)
    """MLflow tracking and the champion alias (off unless a tracking URI is set)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every `TUNELOOP_*` variable; unset ones keep their defaults.

        Args:
            environ: the environment to read; `os.environ` when omitted (tests pass a dict).

        Raises:
            ConfigError: a value does not parse or the combination is unsafe; the message
                names the variable.
        """
        env = os.environ if environ is None else environ
        return cls(
            worker=_worker_from_env(_EnvReader(env, ENV_PREFIX)),
            kafka=_kafka_from_env(_EnvReader(env, f"{ENV_PREFIX}KAFKA_")),
            kubernetes=_kubernetes_from_env(_EnvReader(env, f"{ENV_PREFIX}KUBERNETES_")),
            handoff=_handoff_from_env(_EnvReader(env, f"{ENV_PREFIX}HANDOFF_")),
            mlflow=_mlflow_from_env(_EnvReader(env, f"{ENV_PREFIX}MLFLOW_")),
        )


class _EnvReader:
    """Typed access to prefixed variables, with errors that name the variable."""

    def __init__(self, env: Mapping[str, str], prefix: str) -> None:
        self._env = env
        self._prefix = prefix

    def name(self, key: str) -> str:
        return f"{self._prefix}{key.upper()}"

    def raw(self, key: str) -> str | None:
        value = self._env.get(self.name(key))
        if value is None or not value.strip():
            return None
        return value.strip()

    def integer(self, key: str) -> int | None:
        value = self.raw(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{self.name(key)}={value!r} is not an integer") from None

    def number(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{self.name(key)}={value!r} is not a number") from None

    def path(self, key: str) -> Path | None:
        value = self.raw(key)
        return Path(value).expanduser() if value is not None else None

    def seconds(self, key: str) -> timedelta | None:
        value = self.raw(key)
        if value is None:
            return None
        try:
            return timedelta(seconds=float(value))
        except (ValueError, OverflowError):
            raise ConfigError(f"{self.name(key)}={value!r} is not a number of seconds") from None

    def choice(self, key: str, kind: type[_Choice]) -> _Choice | None:
        value = self.raw(key)
        if value is None:
            return None
        for member in kind:
            if member.value.lower() == value.lower():
                return member
        allowed = ", ".join(member.value for member in kind)
        raise ConfigError(f"{self.name(key)}={value!r} is not one of: {allowed}")


def _worker_from_env(env: _EnvReader) -> WorkerSettings:
    defaults = WorkerSettings()
    rules = env.raw("rules")
    return WorkerSettings(
        # Space-separated, as click split a multiple option's variable before settings moved
        # here, so that an existing TUNELOOP_RULES keeps its meaning.
        rules=tuple(Path(part) for part in rules.split()) if rules else defaults.rules,
        backend=_or(env.choice("backend", BackendKind), defaults.backend),
        local_root=env.path("local_root"),
        local_max_jobs=_or(env.integer("local_max_jobs"), defaults.local_max_jobs),
        kubeconfig=env.path("kubeconfig"),
        # TUNELOOP_METRICS_PORT: the variable's name before the server did more than metrics.
        web_port=_or(env.integer("web_port"), env.integer("metrics_port")),
        web_bind=env.raw("web_bind") or defaults.web_bind,
        ingress_token=env.raw("ingress_token"),
        ingress_trusted_networks=tuple(
            part.strip()
            for part in (env.raw("ingress_trusted_networks") or "").split(",")
            if part.strip()
        ),
        web_tls_cert_file=env.raw("web_tls_cert_file"),
        web_tls_key_file=env.raw("web_tls_key_file"),
        web_tls_client_ca_file=env.raw("web_tls_client_ca_file"),
        ingress_ack_timeout=_or(env.number("ingress_ack_timeout"), defaults.ingress_ack_timeout),
        health_loop_stall=_or(env.number("health_loop_stall"), defaults.health_loop_stall),
        health_progress_stall=_or(
            env.number("health_progress_stall"), defaults.health_progress_stall
        ),
        why_not_per_minute=_or(env.integer("why_not_per_minute"), defaults.why_not_per_minute),
    )


def _kubernetes_from_env(env: _EnvReader) -> KubernetesSettings:
    defaults = KubernetesSettings()
    watch_timeout = env.number("watch_timeout")
    return KubernetesSettings(
        namespace=env.raw("namespace") or defaults.namespace,
        request_timeout=_or(env.number("request_timeout"), defaults.request_timeout),
        watch_timeout=defaults.watch_timeout if watch_timeout is None else int(watch_timeout),
        jobset_timeout=_or(env.number("jobset_timeout"), defaults.jobset_timeout),
        trainer_image=env.raw("trainer_image") or defaults.trainer_image,
        output_base_uri=env.raw("output_base_uri") or defaults.output_base_uri,
        dataset_secret=env.raw("dataset_secret"),
        model_secret=env.raw("model_secret"),
        storage_secret=env.raw("storage_secret"),
    )


def _kafka_from_env(env: _EnvReader) -> KafkaSettings:
    defaults = KafkaSettings()
    topics = env.raw("topics_in")
    max_age: timedelta | None = defaults.max_age
    max_age_text = env.raw("max_age")
    if max_age_text is not None:
        if max_age_text.lower() in ("none", "off"):
            max_age = None
        else:
            max_age = env.seconds("max_age")
            if max_age is not None and max_age <= timedelta(0):
                max_age = None
    return KafkaSettings(
        bootstrap=env.raw("bootstrap") or defaults.bootstrap,
        topics_in=(
            tuple(name.strip() for name in topics.split(",") if name.strip())
            if topics is not None
            else defaults.topics_in
        ),
        topic_dlq=env.raw("topic_dlq") or defaults.topic_dlq,
        topic_out=env.raw("topic_out") or defaults.topic_out,
        topic_audit=env.raw("topic_audit") or defaults.topic_audit,
        group_id=env.raw("group_id") or defaults.group_id,
        internal_partitions=_or(env.integer("internal_partitions"), defaults.internal_partitions),
        security_protocol=_or(
            env.choice("security_protocol", SecurityProtocol), defaults.security_protocol
        ),
        sasl_mechanism=env.choice("sasl_mechanism", SaslMechanism),
        sasl_username=env.raw("sasl_username"),
        sasl_password=env.raw("sasl_password"),
        tls_ca_file=env.raw("tls_ca_file"),
        tls_cert_file=env.raw("tls_cert_file"),
        tls_key_file=env.raw("tls_key_file"),
        max_event_bytes=_or(env.integer("max_event_bytes"), defaults.max_event_bytes),
        max_age=max_age,
        dedup_ttl=_or(env.seconds("dedup_ttl"), defaults.dedup_ttl),
        dedup_max_entries=_or(env.integer("dedup_max_entries"), defaults.dedup_max_entries),
        output_mode=_or(env.choice("output_mode", OutputMode), defaults.output_mode),
    )


def _mlflow_from_env(env: _EnvReader) -> MlflowSettings:
    uri = env.raw("tracking_uri")
    return MlflowSettings(
        tracking_uri=uri.rstrip("/") if uri else None,
        request_timeout=_or(env.number("request_timeout"), MlflowSettings().request_timeout),
    )


def _handoff_from_env(env: _EnvReader) -> HandoffSettings:
    defaults = HandoffSettings()
    targets: dict[str, tuple[str, ...]] = {}
    for model, urls in _json_object(env, "targets").items():
        listed = [urls] if isinstance(urls, str) else urls
        if not isinstance(listed, list) or not all(isinstance(url, str) for url in listed):
            raise ConfigError(
                f"{env.name('targets')}: the servers of {model!r} must be a URL or a list of URLs"
            )
        targets[model] = tuple(url.strip().rstrip("/") for url in listed if url.strip())
    paths = _json_object(env, "paths")
    if not all(isinstance(path, str) for path in paths.values()):
        raise ConfigError(f"{env.name('paths')}: every value must be a path prefix (a string)")
    return HandoffSettings(
        targets=MappingProxyType(targets),
        paths=MappingProxyType({prefix: str(path) for prefix, path in paths.items()}),
        group_id=env.raw("group_id") or defaults.group_id,
        topic_in=env.raw("topic_in"),
        topic_out=env.raw("topic_out"),
        topic_ledger=env.raw("topic_ledger") or defaults.topic_ledger,
        api_key=env.raw("api_key"),
        request_timeout=_or(env.number("request_timeout"), defaults.request_timeout),
        smoke_prompt=env.raw("smoke_prompt") or defaults.smoke_prompt,
        smoke_max_tokens=_or(env.integer("smoke_max_tokens"), defaults.smoke_max_tokens),
        retry_first_delay=_or(env.number("retry_first_delay"), defaults.retry_first_delay),
        retry_max_delay=_or(env.number("retry_max_delay"), defaults.retry_max_delay),
        retry_report_after=_or(env.integer("retry_report_after"), defaults.retry_report_after),
    )


def _json_object(env: _EnvReader, key: str) -> dict[str, object]:
    text = env.raw(key)
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{env.name(key)} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{env.name(key)} must be a JSON object")
    return value


def _or(value: _T | None, default: _T) -> _T:
    return default if value is None else value

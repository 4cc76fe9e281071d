"""What a training job is, to the core: the request that starts it, its handle, its phases.

A `TrainingRequest` is the fully resolved launch spec of one decision: every template has
been rendered and type-checked, so backends only translate it (into a TrainJob, a local
process) and never interpret event text. Its `name` is derived from the decision, which is
what makes a replayed or retried launch create nothing new.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from orchestrator.jobs.promotion import PromotionPolicy


def _frozen_map() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """LoRA hyper-parameters handed to the trainer as data."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] | None = None
    """None lets the trainer pick the default for the model's architecture."""


@dataclass(frozen=True, slots=True)
class TrainingSettings:
    """Optimisation settings handed to the trainer as data."""

    epochs: float = 1.0
    learning_rate: float = 2e-4
    max_steps: int | None = None
    batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_seq_length: int = 512
    seed: int = 0
    eval_fraction: float = 0.1
    packing: bool = False


@dataclass(frozen=True, slots=True)
class Resources:
    """What one job asks of the cluster (or the local machine)."""

    nodes: int = 1
    gpus_per_node: int = 0
    cpu: str | None = None
    memory: str | None = None


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
"""W3C Trace Context `traceparent`: version, trace id, parent span id, flags (all-zero ids are
invalid, as the W3C spec says)."""


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A producer's W3C trace context, as the CloudEvents distributed-tracing extension carries
    it (`traceparent`, `tracestate`).

    The engine copies it from the deciding event onto its decision records and the job it
    launches; the TrainJob's annotations and the completion event carry it on, so one trace
    id follows a trigger end to end (docs/events.md, "Trace context").
    """

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        """The 32 hex digits that name the whole trace."""
        return self.traceparent.split("-")[1]

    @classmethod
    def of(cls, extensions: Mapping[str, object]) -> TraceContext | None:
        """The trace context in an event's extension attributes; None when there is none or
        its `traceparent` is malformed (a bad trace header never stops a trigger)."""
        parent = extensions.get("traceparent")
        if not isinstance(parent, str) or not _TRACEPARENT.match(parent):
            return None
        state = extensions.get("tracestate")
        return cls(parent, state if isinstance(state, str) and state else None)

    def as_extensions(self) -> dict[str, str]:
        """The extension attributes that carry it on a CloudEvent."""
        extensions = {"traceparent": self.traceparent}
        if self.tracestate:
            extensions["tracestate"] = self.tracestate
        return extensions


@dataclass(frozen=True, slots=True)
class TrainingRequest:
    """One fine-tuning job to run, fully resolved by a launch decision."""

    name: str
    """Deterministic job name: RFC 1035 label, at most 33 characters."""
    rule: str
    rule_version: str
    key: str
    decision_id: str
    causing_event_ids: tuple[str, ...]
    runtime: str
    """Name of the ClusterTrainingRuntime (or local runtime profile) to run on."""
    base_model: str
    dataset: str
    lora: LoraSettings = field(default_factory=LoraSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    resources: Resources = field(default_factory=Resources)
    output_uri: str | None = None
    """Where the adapter goes; None lets the backend choose (a per-job directory)."""
    deadline_seconds: int | None = None
    model_id: str | None = None
    """The model being retrained, for the completion event; usually the rule key."""
    trace: TraceContext | None = None
    """The trace context of the event that completed the launch, if its producer sent one."""
    promotion: PromotionPolicy | None = None
    """The rule's `promote:` block; None: the job's adapter is never judged or promoted."""
    champion_uri: str | None = None
    """The champion adapter of the rule and key when the job was launched, which the trainer
    evaluates beside the candidate; filled in by the service just before the launch."""


class JobPhase(enum.Enum):
    """Where a job is in its life. Final phases never change again."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"

    @property
    def is_final(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)


@dataclass(frozen=True, slots=True)
class JobRef:
    """A handle on a launched job: enough for a backend to find it again."""

    name: str
    backend: str
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class JobResult:
    """What a finished job produced, as the trainer reported it in `result.json`."""

    adapter_uri: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=_frozen_map)


@dataclass(frozen=True, slots=True)
class Observation:
    """A backend saw a job change phase (or make progress)."""

    job: JobRef
    phase: JobPhase
    at: datetime
    reason: str | None = None
    message: str | None = None
    result: JobResult | None = None
    progress: Mapping[str, Any] = field(default_factory=_frozen_map)


@dataclass(frozen=True, slots=True)
class JobContext:
    """What the completion event says about a job besides its phase: where it came from."""

    job: str
    rule: str
    rule_version: str
    key: str
    decision_id: str
    causing_event_ids: tuple[str, ...]
    runtime: str
    base_model: str
    dataset: str
    model_id: str | None = None
    output_uri: str | None = None
    launched_at: datetime | None = None
    trace: TraceContext | None = None
    """The launch's trace context, which the completion event carries on."""
    promotion: PromotionPolicy | None = None
    """How the job's adapter is judged once it succeeded (None: it is not)."""
    champion_uri: str | None = None
    """The champion the job was launched to compare with (None: there was none)."""

    @classmethod
    def from_request(
        cls,
        request: TrainingRequest,
        *,
        launched_at: datetime | None = None,
        output_uri: str | None = None,
    ) -> JobContext:
        """The context of a job about to be launched for *request*."""
        return cls(
            job=request.name,
            rule=request.rule,
            rule_version=request.rule_version,
            key=request.key,
            decision_id=request.decision_id,
            causing_event_ids=request.causing_event_ids,
            runtime=request.runtime,
            base_model=request.base_model,
            dataset=request.dataset,
            model_id=request.model_id,
            output_uri=output_uri if output_uri is not None else request.output_uri,
            launched_at=launched_at,
            trace=request.trace,
            promotion=request.promotion,
            champion_uri=request.champion_uri,
        )

    def as_request(self) -> TrainingRequest:
        """The request this job was launched for, as far as the event vocabulary needs it."""
        return TrainingRequest(
            name=self.job,
            rule=self.rule,
            rule_version=self.rule_version,
            key=self.key,
            decision_id=self.decision_id,
            causing_event_ids=self.causing_event_ids,
            runtime=self.runtime,
            base_model=self.base_model,
            dataset=self.dataset,
            output_uri=self.output_uri,
            model_id=self.model_id,
            trace=self.trace,
            promotion=self.promotion,
            champion_uri=self.champion_uri,
        )

    @classmethod
    def unknown(cls, job: str) -> JobContext:
        """A job with no record and no recoverable provenance: only its name is known."""
        return cls(
            job=job,
            rule="",
            rule_version="",
            key="",
            decision_id="",
            causing_event_ids=(),
            runtime="",
            base_model="",
            dataset="",
        )

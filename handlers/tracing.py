"""OpenTelemetry spans for the worker's decisions, exported over OTLP/HTTP when configured.

The composition root (`handlers/app.py`) builds one `Tracing` and wraps each decision of the keyed
stage (the partition lanes of `handlers/partition_lanes.py`) in `Tracing.decision(...)`. A span is a
child of the producer's span when the event carried a trace context (`traceparent`, the CloudEvents
distributed-tracing extension), so the worker's work shows up inside the producer's trace, under the
same trace id as the decision records, the TrainJob and the completion event (docs/events.md, "Trace
context").

Spans are made here, in `handlers/`, never in the core: `orchestrator/` stays pure.

Configured by OpenTelemetry's own variables, which its exporter reads itself (as faust reads
its `BROKER_*` ones): `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
(and `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, ...). With neither endpoint set,
`Tracing` is a no-op and `opentelemetry` is never imported: it is the optional extra
`tuneloop[otel]`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import TraceContext
from orchestrator.ledger import DecisionRecord

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""The standard variables that name an OTLP endpoint; either one turns tracing on."""
SERVICE_NAME = "tuneloop"
"""The `service.name` of the spans unless `OTEL_SERVICE_NAME` says otherwise."""


class DecisionSpan:
    """What a decision's span is told once the decision is made (nothing, when disabled)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def decided(self, records: tuple[DecisionRecord, ...]) -> None:
        """Record the outcomes and the launched jobs on the span."""
        if self._span is None:
            return
        self._span.set_attribute("tuneloop.outcomes", [r.outcome.value for r in records])
        self._span.set_attribute("tuneloop.rules", sorted({r.rule for r in records}))
        jobs = [r.job_name for r in records if r.job is not None and r.job_name]
        if jobs:
            self._span.set_attribute("tuneloop.jobs", jobs)


@dataclass(frozen=True, slots=True)
class Tracing:
    """The worker's tracer: `provider` is None when no endpoint is configured (no-op)."""

    provider: Any = None
    """An `opentelemetry.sdk.trace.TracerProvider`, kept private to tuneloop (not installed as
    the global provider, so that tests and embedding applications keep theirs)."""

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    @contextlib.contextmanager
    def decision(self, event: CloudEvent, *, key: str) -> Iterator[DecisionSpan]:
        """A `tuneloop.decide` span around the decisions about *event* under *key*, a child
        of the producer's span when *event* carries a trace context."""
        if self.provider is None:
            yield DecisionSpan()
            return
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        trace = TraceContext.of(event.extensions)
        parent = (
            TraceContextTextMapPropagator().extract(carrier=trace.as_extensions())
            if trace is not None
            else None
        )
        tracer = self.provider.get_tracer("tuneloop.worker")
        attributes = {
            "cloudevents.event_id": event.id,
            "cloudevents.event_source": event.source,
            "cloudevents.event_type": event.type,
            "tuneloop.key": key,
        }
        with tracer.start_as_current_span(
            "tuneloop.decide", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            yield DecisionSpan(span)

    def flush(self, timeout_millis: int = 5000) -> bool:
        """Export every finished span now (True when all went out in time)."""
        return True if self.provider is None else bool(self.provider.force_flush(timeout_millis))

    def shutdown(self) -> None:
        """Flush and stop the exporter (also done at interpreter exit)."""
        if self.provider is not None:
            self.provider.shutdown()


def tracing_for(endpoint: str | None, *, service_name: str = SERVICE_NAME) -> Tracing:
    """Spans exported to the OTLP/HTTP collector at *endpoint* (the full traces URL, e.g.
    `http://collector:4318/v1/traces`); a no-op `Tracing` when *endpoint* is None.

    Raises:
        ConfigError: an endpoint is given but `tuneloop[otel]` is not installed.
    """
    if endpoint is None:
        return Tracing()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError(
            f"an OTLP endpoint is configured ({endpoint}) but OpenTelemetry is not installed: "
            "pip install 'tuneloop[otel]', or unset OTEL_EXPORTER_OTLP_ENDPOINT"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    # Batched in the SDK's own thread: a slow collector never holds up a decision.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return Tracing(provider)


def tracing_from_environment(environ: Mapping[str, str]) -> Tracing:
    """The worker's `Tracing`, from OpenTelemetry's standard variables (module docstring):
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, or `OTEL_EXPORTER_OTLP_ENDPOINT` with
    `/v1/traces` appended, as the OTLP specification says."""
    traces = environ.get(ENDPOINT_VARIABLES[0])
    base = environ.get(ENDPOINT_VARIABLES[1])
    endpoint = traces or (base.rstrip("/") + "/v1/traces" if base else None)
    return tracing_for(endpoint, service_name=environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME)


NO_TRACING = Tracing()
"""Spans nowhere: for inputs that are not worth a span, and when nothing is configured."""

"""One trace id from a producer's event to the completion event, through the real API server.

The event carries a W3C `traceparent` (the CloudEvents distributed-tracing extension); the
engine decides a launch from it, `KubernetesBackend` creates the TrainJob on the real API
server, and the completion publisher announces the job's end. The decision record, the
TrainJob's annotations and the completion event must all carry the producer's trace id. The
job is launched once without a completion record, as after a lost state topic, so the
completion event's trace can only come from the TrainJob's annotations; and once through the
service (`Orchestrator`), as the worker does it, from the event to the audit record, the
TrainJob and the completion event.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from kubernetes import client

from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from orchestrator.jobs.completion import CompletionPublisher
from orchestrator.jobs.model import JobPhase, JobRef, JobResult
from orchestrator.ledger import DECISION_EVENT_TYPE, Outcome, to_cloudevent
from orchestrator.rules import engine
from orchestrator.rules.parsing import Source, parse_files
from orchestrator.service import Orchestrator
from orchestrator.testing import InMemoryCompletionStore, RecordingPublisher
from runtimes.kubernetes import manifests
from runtimes.kubernetes.backend import BACKEND_NAME, BackendSettings, KubernetesBackend
from runtimes.kubernetes.catalog import GROUP, VERSION
from tests.contract.backend_contract import until
from tests.contract.test_kubernetes_backend_contract import KubernetesJobController

pytestmark = pytest.mark.kubernetes

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
RULES = """
runtimes: [torch-distributed]
rules:
  - name: drift
    on: {type: io.tuneloop.drift.detected.v1}
    key: "event.data.model_id"
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""
EVENT = CloudEvent(
    id="traced-1",
    source="/monitors/psi",
    type="io.tuneloop.drift.detected.v1",
    time=datetime(2026, 3, 1, 8, 0, tzinfo=UTC),
    datacontenttype="application/json",
    data={"model_id": "model-t", "metric": "psi", "value": 0.5, "threshold": 0.2},
    extensions={"traceparent": TRACEPARENT, "tracestate": "vendor=7"},
)


@pytest.fixture
def objects(kube_api):
    with kube_api.api_client() as api:
        yield client.CustomObjectsApi(api)


def trace_id(traceparent: str) -> str:
    # W3C: version "-" trace id "-" parent id "-" flags.
    return traceparent.split("-")[1]


async def test_the_trace_id_follows_the_event_to_the_record_the_trainjob_and_the_completion(
    objects, k8s_namespace
):
    rules = parse_files([Source("rules.yaml", RULES)])
    (route,) = engine.route(rules, EVENT)
    _, records = engine.evaluate(rules, None, EVENT, key=route.key, now=EVENT.time)
    (launch,) = records
    assert launch.outcome is Outcome.LAUNCH
    assert launch.job is not None
    audit = to_cloudevent(launch)
    assert trace_id(str(audit.extensions["traceparent"])) == TRACE_ID
    assert launch.to_json()["traceparent"] == TRACEPARENT

    settings = BackendSettings(namespace=k8s_namespace, watch_timeout=2, request_timeout=5.0)
    backend = KubernetesBackend(objects, clock=SystemClock(), settings=settings)
    events = RecordingPublisher()
    completion = CompletionPublisher(
        store=InMemoryCompletionStore(),
        publisher=events,
        clock=SystemClock(),
        recover_context=backend.context_of,
    )
    ref = await backend.launch(launch.job)  # no record_launch: the annotations must tell
    trainjob = objects.get_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, manifests.PLURAL, ref.name
    )
    annotations = trainjob["metadata"]["annotations"]
    assert trace_id(annotations["tuneloop.io/traceparent"]) == TRACE_ID
    assert annotations["tuneloop.io/tracestate"] == "vendor=7"

    # Ended through its JobSet's status: no trainer runs in this held namespace.
    await KubernetesJobController(objects, k8s_namespace).move(
        ref, JobPhase.SUCCEEDED, result=JobResult()
    )
    stream = aiter(backend.observe())
    for observation in await until(stream, ref.name, JobPhase.SUCCEEDED):
        await completion.handle(observation)
    await stream.aclose()
    (completed,) = [e for e in events.events if e.type.endswith("finetune.completed.v1")]
    assert trace_id(str(completed.extensions["traceparent"])) == TRACE_ID
    assert completed.extensions["tracestate"] == "vendor=7"


class DictStates:
    def __init__(self) -> None:
        self.states: dict = {}

    def load(self, key):
        return self.states.get(key)

    def save(self, key, state):
        self.states[key] = state


async def test_through_the_service_the_audit_record_trainjob_and_completion_share_the_trace(
    objects, k8s_namespace
):
    settings = BackendSettings(namespace=k8s_namespace, watch_timeout=2, request_timeout=5.0)
    clock = SystemClock()
    backend = KubernetesBackend(objects, clock=clock, settings=settings)
    published = RecordingPublisher()
    service = Orchestrator(
        rules=parse_files([Source("rules.yaml", RULES)]),
        backend=backend,
        publisher=published,
        states=DictStates(),
        completions=InMemoryCompletionStore(),
        clock=clock,
        audit_topic="audit",
        output_topic="out",
    )
    event = replace(EVENT, id="traced-2", data={**EVENT.data, "model_id": "model-s"})
    (key,) = await service.keys_for(event)
    await service.handle(key, event)

    (audited,) = [e for e in published.events if e.type == DECISION_EVENT_TYPE]
    assert trace_id(str(audited.extensions["traceparent"])) == TRACE_ID
    assert trace_id(audited.data["traceparent"]) == TRACE_ID
    # Job names start with the rule and the key (orchestrator/jobs/naming.py).
    (name,) = [n for n in trainjob_names(objects, k8s_namespace) if "model-s" in n]
    trainjob = objects.get_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, manifests.PLURAL, name
    )
    assert trace_id(trainjob["metadata"]["annotations"]["tuneloop.io/traceparent"]) == TRACE_ID

    ref = JobRef(name=name, backend=BACKEND_NAME, namespace=k8s_namespace)
    # Ended through its JobSet's status: no trainer runs in this held namespace.
    await KubernetesJobController(objects, k8s_namespace).move(
        ref, JobPhase.SUCCEEDED, result=JobResult()
    )
    stream = aiter(backend.observe())
    for observation in await until(stream, name, JobPhase.SUCCEEDED):
        await service.handle_observation(key, observation)
    await stream.aclose()
    (completed,) = [e for e in published.events if e.type.endswith("finetune.completed.v1")]
    assert trace_id(str(completed.extensions["traceparent"])) == TRACE_ID


def trainjob_names(objects, namespace):
    listing = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, manifests.PLURAL)
    return [item["metadata"]["name"] for item in listing["items"]]

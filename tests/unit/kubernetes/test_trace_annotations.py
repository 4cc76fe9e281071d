"""The producer's trace context on the TrainJob: written as annotations (on the pods too, by
the runtime patch), read back into the job's context after a restart, absent when the
triggering event carried none."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.jobs.model import TraceContext, TrainingRequest
from runtimes.kubernetes import manifests, results
from runtimes.kubernetes.catalog import RuntimeInfo

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
REQUEST = TrainingRequest(
    name="ft-traced",
    rule="r",
    rule_version="1",
    key="model-a",
    decision_id="d-1",
    causing_event_ids=("e-1",),
    runtime="torch-distributed",
    base_model="tiny",
    dataset="file:///d",
)


def built(request: TrainingRequest) -> dict:
    return manifests.build_trainjob(
        request,
        namespace="ml",
        runtime=RuntimeInfo(name="torch-distributed"),
        settings=manifests.Settings(),
    )


def test_a_traced_request_annotates_its_trainjob_and_pods_with_the_trace_context():
    job = built(replace(REQUEST, trace=TraceContext(TRACEPARENT, "vendor=7")))
    annotations = job["metadata"]["annotations"]
    assert annotations["tuneloop.io/traceparent"] == TRACEPARENT
    assert annotations["tuneloop.io/tracestate"] == "vendor=7"
    (patch,) = job["spec"]["runtimePatches"]
    for replicated in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]["metadata"]
        assert pod["annotations"]["tuneloop.io/traceparent"] == TRACEPARENT


def test_the_trace_context_is_recovered_from_the_annotations():
    job = built(replace(REQUEST, trace=TraceContext(TRACEPARENT)))
    context = results.context_of_trainjob(job)
    assert context is not None
    assert context.trace == TraceContext(TRACEPARENT)


def test_an_untraced_request_has_no_trace_annotations():
    annotations = built(REQUEST)["metadata"]["annotations"]
    assert not {"tuneloop.io/traceparent", "tuneloop.io/tracestate"} & set(annotations)
    assert results.context_of_trainjob(built(REQUEST)).trace is None

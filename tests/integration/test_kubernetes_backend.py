"""KubernetesBackend and the completion publisher against a real cluster with the controllers.

The namespace is held (`tuneloop.io/node-agent=hold`): the Trainer and JobSet controllers make
each TrainJob's JobSet, Jobs and pods and report it Running, and no trainer runs. These tests
need a job to end at a moment they choose (a watcher killed between a status change and its
publish, a restart or a `410` mid-job), so `KubernetesJobController` (the contract's) ends it:
it patches the JobSet's `/status` as the JobSet controller would when its Jobs end, and the
real Trainer marks the TrainJob; each test that does so says it. Real pods reach each phase
in tests/e2e/test_kubernetes_loop.py.
Kafka is not needed either: a `RecordingPublisher` and an `InMemoryCompletionStore` stand for
the output topic and the state topic (the Kafka-backed ones are tested where they live); what
is real is every TrainJob, watch, 409 and 410.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from orchestrator.clock import SystemClock
from orchestrator.errors import JobRejectedError, TransientBackendError
from orchestrator.jobs.completion import CompletionPublisher
from orchestrator.jobs.model import JobPhase, JobResult, TrainingRequest
from orchestrator.testing import InMemoryCompletionStore, RecordingPublisher
from runtimes.kubernetes import async_api, manifests
from runtimes.kubernetes.backend import BACKEND_NAME, BackendSettings, KubernetesBackend
from runtimes.kubernetes.catalog import GROUP, VERSION, RuntimeCatalog
from tests.contract.backend_contract import request, until
from tests.contract.test_kubernetes_backend_contract import KubernetesJobController
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.kubernetes

RUNTIME = "torch-distributed"


@pytest.fixture
def objects(kube_api):
    with kube_api.api_client() as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture
def settings(k8s_namespace):
    return BackendSettings(
        namespace=k8s_namespace,
        watch_timeout=2,
        backoff_initial=0.05,
        backoff_max=0.2,
        request_timeout=5.0,
    )


@pytest.fixture
def controller(objects, k8s_namespace):
    return KubernetesJobController(objects, k8s_namespace)


def orchestrator(api, settings, store, events):
    """One orchestrator process: a backend and a completion publisher over shared state."""
    backend = KubernetesBackend(api, clock=SystemClock(), settings=settings)
    completion = CompletionPublisher(
        store=store,
        publisher=events,
        clock=SystemClock(),
        recover_context=backend.context_of,
    )
    return backend, completion


def trainjob_names(objects, namespace):
    listing = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, manifests.PLURAL)
    return sorted(item["metadata"]["name"] for item in listing["items"])


async def pump(stream, completion, name, phase):
    """Feed observations of *name* to the publisher until *phase* was handled."""
    for observation in await until(stream, name, phase):
        await completion.handle(observation)


async def test_watcher_restart_mid_job_announces_started_and_completed_once(
    objects, settings, controller
):
    store, events = InMemoryCompletionStore(), RecordingPublisher()
    backend, completion = orchestrator(objects, settings, store, events)
    job = request("ft-restart-mid", RUNTIME)
    await completion.record_launch(job)
    ref = await backend.launch(job)
    stream = aiter(backend.observe())
    await controller.move(ref, JobPhase.RUNNING)  # the controllers make it Running themselves
    await pump(stream, completion, job.name, JobPhase.RUNNING)
    await stream.aclose()  # the orchestrator stops mid-job

    # Ended through its JobSet's status (no trainer runs here), while no watcher runs.
    await controller.move(ref, JobPhase.SUCCEEDED, result=JobResult(metrics={"train_loss": 0.7}))
    await asyncio.sleep(2)  # the orchestrator comes back a while after the job finished

    backend, completion = orchestrator(objects, settings, store, events)  # a new process
    stream = aiter(backend.observe())
    await pump(stream, completion, job.name, JobPhase.SUCCEEDED)
    await stream.aclose()

    assert [e.type for e in events.events] == [
        "io.tuneloop.finetune.started.v1",
        "io.tuneloop.finetune.completed.v1",
    ]
    completed = events.events[-1]
    assert completed.extensions["correlationid"] == job.decision_id
    assert completed.extensions["causationid"] == "event-1"
    assert completed.data["metrics"] == {"train_loss": 0.7}
    assert completed.data["adapter_uri"] == f"file:///var/lib/tuneloop/adapters/{job.name}"
    assert completed.data["runtime"] == RUNTIME
    status = objects.get_namespaced_custom_object_status(
        GROUP, VERSION, ref.namespace, manifests.PLURAL, job.name
    )
    (condition,) = status["status"]["conditions"]
    # Finished while no watcher ran: the event says when it finished, not when it was seen.
    assert completed.time == datetime.fromisoformat(condition["lastTransitionTime"])


async def test_killed_between_status_change_and_publish_publishes_once(
    objects, settings, controller
):
    store, events = InMemoryCompletionStore(), RecordingPublisher()
    backend, completion = orchestrator(objects, settings, store, events)
    job = request("ft-killed", RUNTIME)
    await completion.record_launch(job)
    ref = await backend.launch(job)
    # Failed through its JobSet's status, before any watcher runs (no trainer runs here).
    await controller.move(ref, JobPhase.FAILED, reason="FailedJobs")
    stream = aiter(backend.observe())
    (*_, failed) = await until(stream, job.name, JobPhase.FAILED)
    events.fail_next(ConnectionError("the process dies before the broker acknowledged"))
    with pytest.raises(ConnectionError):
        await completion.handle(failed)
    await stream.aclose()

    for _restart in range(2):
        backend, completion = orchestrator(objects, settings, store, events)
        stream = aiter(backend.observe())
        await pump(stream, completion, job.name, JobPhase.FAILED)
        await stream.aclose()

    (announced,) = events.events
    assert announced.type == "io.tuneloop.finetune.failed.v1"
    assert announced.data["reason"] == "FailedJobs"


async def test_a_job_found_without_a_record_gets_its_context_from_the_trainjob(
    objects, settings, controller
):
    store, events = InMemoryCompletionStore(), RecordingPublisher()
    backend, completion = orchestrator(objects, settings, store, events)
    job = request("ft-no-record", RUNTIME)
    ref = await backend.launch(job)  # no record_launch: the state topic lost it
    # Ended through its JobSet's status before any watcher runs (no trainer runs here).
    await controller.move(ref, JobPhase.SUCCEEDED, result=JobResult())
    stream = aiter(backend.observe())
    await pump(stream, completion, job.name, JobPhase.SUCCEEDED)
    await stream.aclose()
    (completed,) = events.events
    assert completed.extensions["correlationid"] == job.decision_id
    assert completed.data["rule"] == job.rule


class CountedLists:
    """The real API, counting the backend's lists of TrainJobs."""

    def __init__(self, api):
        self._api = api
        self.lists = 0

    def __getattr__(self, name):
        return getattr(self._api, name)

    def list_namespaced_custom_object(self, *args, **kwargs):
        self.lists += 1
        return self._api.list_namespaced_custom_object(*args, **kwargs)


class StaleFirstWatch:
    """The backend's real TrainJob calls, except that the first watch asks for a long-gone
    resourceVersion, as a watcher does after a long outage. The server answers that with a
    real 410 Expired."""

    def __init__(self, objects):
        self._objects = objects
        self.watches = 0

    def __getattr__(self, name):
        return getattr(self._objects, name)

    def watch(self, query):
        self.watches += 1
        if self.watches == 1:
            query = replace(query, resource_version="1")
        return self._objects.watch(query)


# The aiohttp session the backend uses, and the synchronous client it keeps for a SOCKS proxy.
CLIENTS = {
    "pooled": lambda api, collection: async_api.AsyncCustomObjects(
        api.api_client, collection, timeout=5.0
    ),
    "threaded": lambda api, collection: async_api.ThreadedCustomObjects(
        api, collection, timeout=5.0
    ),
}


@pytest.mark.parametrize("client_kind", sorted(CLIENTS))
async def test_a_410_makes_the_watcher_list_again_and_miss_nothing(
    objects, settings, controller, client_kind
):
    api = CountedLists(objects)
    collection = async_api.Collection(GROUP, VERSION, settings.namespace, manifests.PLURAL)
    watches = StaleFirstWatch(CLIENTS[client_kind](objects, collection))
    backend = KubernetesBackend(api, clock=SystemClock(), settings=settings, objects=watches)
    ref = await backend.launch(request("ft-gone", RUNTIME))
    stream = aiter(backend.observe())
    await controller.move(ref, JobPhase.RUNNING)  # the controllers make it Running themselves
    await until(stream, "ft-gone", JobPhase.RUNNING)
    # The watcher goes on (its first watch, the 410, the list again) only while it is read.
    # The job ends only after that second list, so it is the watch after the 410 that must see
    # it end: ended first, the second list alone would show it (seen once under load).
    reading = asyncio.ensure_future(until(stream, "ft-gone", JobPhase.SUCCEEDED))
    await wait_for(
        lambda: api.lists >= 2 or reading.done(),
        what="the watcher to list again after the 410",
        timeout=30,
        interval=0.05,
    )
    assert api.lists >= 2  # the first list, and the one after 410 Gone
    # Ended through its JobSet's status (no trainer runs here).
    await controller.move(ref, JobPhase.SUCCEEDED, result=JobResult())
    (*_, done) = await reading
    await stream.aclose()
    await backend.aclose()
    assert done.phase is JobPhase.SUCCEEDED
    assert watches.watches >= 2


async def test_a_decision_replayed_twice_creates_one_trainjob(objects, settings, k8s_namespace):
    job = request("ft-replayed", RUNTIME)
    first = KubernetesBackend(objects, clock=SystemClock(), settings=settings)
    refs = await asyncio.gather(first.launch(job), first.launch(job))
    restarted = KubernetesBackend(objects, clock=SystemClock(), settings=settings)
    refs.append(await restarted.launch(job))
    assert len(set(refs)) == 1
    assert trainjob_names(objects, k8s_namespace) == ["ft-replayed"]


async def test_a_foreign_trainjob_with_our_name_is_a_clear_error(objects, settings, k8s_namespace):
    objects.create_namespaced_custom_object(
        GROUP,
        VERSION,
        k8s_namespace,
        manifests.PLURAL,
        {
            "apiVersion": manifests.API_VERSION,
            "kind": "TrainJob",
            "metadata": {
                "name": "ft-taken",
                "labels": {"app.kubernetes.io/managed-by": "kubeflow-sdk"},
            },
            "spec": {"runtimeRef": {"name": RUNTIME}},
        },
    )
    backend = KubernetesBackend(objects, clock=SystemClock(), settings=settings)
    with pytest.raises(JobRejectedError) as error:
        await backend.launch(request("ft-taken", RUNTIME))
    assert error.value.reason == "NameTaken"
    assert "kubeflow-sdk" in str(error.value)


async def test_a_spec_the_server_refuses_is_rejected_with_the_servers_message(objects, settings):
    invalid = TrainingRequest(
        **{
            **{
                f: getattr(request("ft-invalid", RUNTIME), f)
                for f in TrainingRequest.__dataclass_fields__
            },
            "deadline_seconds": 0,
        }
    )
    backend = KubernetesBackend(objects, clock=SystemClock(), settings=settings)
    with pytest.raises(JobRejectedError) as error:
        await backend.launch(invalid)
    assert error.value.reason == "Invalid"
    assert "activeDeadlineSeconds" in str(error.value)


async def test_a_missing_runtime_fails_the_decision_with_one_failed_event(objects, settings):
    store, events = InMemoryCompletionStore(), RecordingPublisher()
    backend, completion = orchestrator(objects, settings, store, events)
    job = request("ft-no-runtime", "gpu-xl")
    for _replay in range(2):
        try:
            await backend.launch(job)
        except JobRejectedError as error:
            await completion.announce_rejection(
                job, error, backend=BACKEND_NAME, namespace=backend.namespace
            )
    (failed,) = events.events
    assert failed.data["reason"] == "RuntimeNotFound"
    assert "torch-distributed" in failed.data["message"]  # says what does exist


def refuse_jobsets(api: client.ApiClient, namespace: str) -> None:
    """A ResourceQuota of no JobSets in *namespace*: the API server refuses the Trainer's
    JobSet, which leaves the TrainJob without one (kubeflow/trainer#2735: a Warning event is
    all it gets). The local control plane runs no quota controller, so the quota's status,
    without which admission refuses everything it covers as "status unknown", is written
    here as that controller would write it."""
    core = client.CoreV1Api(api)
    hard = {"count/jobsets.jobset.x-k8s.io": "0"}
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "no-jobsets"}, "spec": {"hard": hard}}
    )
    core.patch_namespaced_resource_quota_status(
        "no-jobsets",
        namespace,
        {"status": {"hard": hard, "used": {"count/jobsets.jobset.x-k8s.io": "0"}}},
    )


async def test_a_trainjob_whose_jobset_is_refused_fails_with_a_reason(
    objects, k8s_namespace, kube_api
):
    with kube_api.api_client() as api:
        refuse_jobsets(api, k8s_namespace)
    settings = BackendSettings(
        namespace=k8s_namespace, watch_timeout=1, jobset_timeout=1.0, request_timeout=5.0
    )
    backend = KubernetesBackend(objects, clock=SystemClock(), settings=settings)
    await backend.launch(request("ft-stuck", RUNTIME))
    stream = aiter(backend.observe())
    (*_, failed) = await until(stream, "ft-stuck", JobPhase.FAILED)
    await stream.aclose()
    assert failed.reason == "JobSetNotCreated"


async def test_an_unreachable_api_server_is_a_transient_error_at_once(kube_api, k8s_namespace):
    # The backend tries once and says how long to wait; the service owns the retries.
    if kube_api.server is None:
        pytest.skip("needs the local control plane, whose API server the test can stop")
    sleeps = []

    async def record(seconds):
        sleeps.append(seconds)

    settings = BackendSettings(namespace=k8s_namespace, backoff_initial=0.1, request_timeout=2.0)
    with kube_api.api_client() as api:
        objects = client.CustomObjectsApi(api)
        catalog = RuntimeCatalog(objects, clock=SystemClock(), namespace=k8s_namespace)
        await catalog.runtimes()  # listed while the server is up
        backend = KubernetesBackend(
            objects, clock=SystemClock(), catalog=catalog, settings=settings, sleep=record
        )
        kube_api.server.stop_apiserver()
        try:
            with pytest.raises(TransientBackendError) as error:
                await backend.launch(request("ft-down", RUNTIME))
        finally:
            kube_api.server.start()
    assert sleeps == []
    assert error.value.delay == 0.1


async def test_finished_and_announced_jobs_are_removed_and_nothing_else(
    objects, settings, controller, k8s_namespace
):
    store, events = InMemoryCompletionStore(), RecordingPublisher()
    backend, completion = orchestrator(objects, settings, store, events)
    refs = {}
    for name in ("ft-gc-done", "ft-gc-quiet", "ft-gc-live"):
        job = request(name, RUNTIME)
        await completion.record_launch(job)
        refs[name] = await backend.launch(job)
    # Ended through their JobSets' status (no trainer runs here).
    await controller.move(refs["ft-gc-done"], JobPhase.SUCCEEDED, result=JobResult())
    await controller.move(refs["ft-gc-quiet"], JobPhase.FAILED, reason="FailedJobs")
    stream = aiter(backend.observe())
    await pump(stream, completion, "ft-gc-done", JobPhase.SUCCEEDED)  # announced
    await stream.aclose()  # ft-gc-quiet failed, but its event has not gone out yet

    removed = await backend.remove_finished(
        finished_before=datetime.now(UTC) + timedelta(minutes=1),
        announced=completion.announced_final,
    )
    assert removed == ("ft-gc-done",)
    assert trainjob_names(objects, k8s_namespace) == ["ft-gc-live", "ft-gc-quiet"]

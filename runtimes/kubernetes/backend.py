"""`KubernetesBackend`: tuneloop's jobs as Kubeflow Trainer v2 TrainJobs.

Wired by `handlers/app.py`; implements `orchestrator.ports.TrainingBackend`. It needs nothing
but the Trainer CRDs. TrainJobs are created, read, deleted and watched on the event loop through
one pooled aiohttp session (`async_api.py`, on the connection settings of the
`CustomObjectsApi` it is given; issue 17: a thread per call, and per line of a watch, cost
CPU on every launch); lists (of TrainJobs, runtimes and pods) and the pod watch go through
the synchronous kubernetes client, each call in `asyncio.to_thread`. `aclose` closes the
session (the worker does so on shutdown).

* `launch` - pick the runtime (`catalog.py`), build the TrainJob (`manifests.py`), create it.
  One attempt: 5xx/429/timeouts are raised as `TransientBackendError` carrying the server's
  `Retry-After` (or `backoff_initial`), and the service retries (`orchestrator/service.py`
  owns retries); 4xx is raised at once as `JobRejectedError` with the API server's
  message. `409 AlreadyExists` for a TrainJob with our labels and the same decision id is the
  same job (a replayed decision, or a create whose answer was lost); anything else by that
  name is a clear error.
* `cancel` - *deletes* the TrainJob (background propagation: the JobSet and pods follow).
  Suspending would keep the pods' resources reserved by the JobSet and would leave a job that
  someone must clean up; `concurrency: replace` wants the old job gone. The watcher reports the
  deletion of a job that had not finished as `Failed` with reason `Cancelled` (by us) or
  `Deleted` (by someone else), so every job still ends with exactly one failed/completed.
* `observe` - list, then watch from the list's `resourceVersion` (with bookmarks); on a watch
  that ends normally, watch again from the last version seen; on `410 Gone` list again.
  Phases come from the status (`phase_of`): `Complete`/`Failed`/`Suspended` conditions, else
  `Running` when a trainer job is active, else `Pending`; a job whose JobSet never appeared
  (no `jobsStatus` after `jobset_timeout` seconds) is `Failed` with reason `JobSetNotCreated`.
  Only changes that `tracking.next_transition` accepts are yielded, plus, while a job runs,
  each new report of its trainer in `status.trainerStatus` (`progress.py`) as a `Running`
  observation with reason `Progress`: the dashboard and sweeps read it, the completion
  publisher ignores it. A `Failed` job's message gets the failing container's log tail from
  its pod's status (`failures.py`), when the backend may list pods.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from orchestrator.clock import Clock
from orchestrator.errors import BackendError, TransientBackendError
from orchestrator.jobs.model import JobContext, JobPhase, JobRef, Observation, TrainingRequest
from orchestrator.jobs.tracking import next_transition
from orchestrator.ports import RecallsJobContext, RemovesFinishedJobs
from orchestrator.settings import KubernetesSettings
from runtimes.kubernetes import async_api, failures, manifests, progress, results
from runtimes.kubernetes.catalog import GROUP, VERSION, RuntimeCatalog
from runtimes.kubernetes.errors import foreign_object_error, is_transient, translate
from runtimes.kubernetes.pod_watching import PodFailureWatch

log = structlog.get_logger(__name__)

BACKEND_NAME = "kubernetes"
INITIALIZER_JOBS = frozenset({"dataset-initializer", "model-initializer"})
SELECTOR = f"{manifests.MANAGED_BY_LABEL}={manifests.MANAGED_BY}"


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """How the Kubernetes backend behaves; one per deployment.

    The composition root builds it from the process settings with `from_settings`; tests
    build it directly.
    """

    namespace: str = "default"
    """Namespace the TrainJobs are created in (and watched)."""
    backoff_initial: float = 0.5
    """Seconds to wait after a failed call when the API server named no `Retry-After`: the
    `delay` of a failed create (the service retries it), and the first wait of the watch loop
    (doubled each time)."""
    backoff_max: float = 8.0
    """Upper bound of one watch-loop backoff wait, seconds."""
    request_timeout: float = 15.0
    """Seconds one API call may take before it counts as a transient failure."""
    watch_timeout: int = 60
    """Seconds one watch request stays open; also how often stuck jobs are re-checked."""
    jobset_timeout: float = 600.0
    """Seconds a TrainJob may wait for its JobSet (any `jobsStatus`) before it is reported
    `Failed` with reason `JobSetNotCreated` (Trainer #2735: a JobSet the controller cannot
    create leaves the status empty)."""
    manifests: manifests.Settings = field(default_factory=manifests.Settings)

    @classmethod
    def from_settings(
        cls, kubernetes: KubernetesSettings, *, mlflow_tracking_uri: str | None = None
    ) -> BackendSettings:
        """The backend's settings from the `TUNELOOP_KUBERNETES_*` group of `Settings`, and
        the MLflow server the trainers log to (`TUNELOOP_MLFLOW_TRACKING_URI`; None: none)."""
        built = manifests.Settings()
        return cls(
            namespace=kubernetes.namespace,
            request_timeout=kubernetes.request_timeout,
            watch_timeout=kubernetes.watch_timeout,
            jobset_timeout=kubernetes.jobset_timeout,
            manifests=manifests.Settings(
                image=kubernetes.trainer_image,
                command=built.command,
                output_base_uri=kubernetes.output_base_uri,
                causing_ids_budget=built.causing_ids_budget,
                dataset_secret=kubernetes.dataset_secret,
                model_secret=kubernetes.model_secret,
                storage_secret=kubernetes.storage_secret,
                mlflow_tracking_uri=mlflow_tracking_uri,
            ),
        )


RBAC_RULES: Mapping[str, tuple[str, ...]] = {
    "trainjobs": ("create", "delete", "get", "list", "watch"),
    "trainjobs/status": ("get",),
    "trainingruntimes": ("get", "list", "watch"),
    "clustertrainingruntimes": ("get", "list", "watch"),
}
"""Every verb this backend (and its catalog) uses, per `trainer.kubeflow.org` resource: the
Helm chart's Role/ClusterRole grant exactly these (tests/unit/kubernetes/test_helm_chart.py)."""

CORE_RBAC_RULES: Mapping[str, tuple[str, ...]] = {
    "pods": ("list", "watch"),
}
"""Every verb it uses on core (`""` group) resources: the pods of its TrainJobs are listed and
watched to keep a failing container's log tail (`terminated.message`), which the JobSet
controller deletes with the pods. The chart's Role grants exactly these too."""


def phase_of(
    obj: Mapping[str, Any], *, now: datetime, jobset_timeout: float
) -> tuple[JobPhase, str | None, str | None]:
    """(phase, reason, message) of the TrainJob *obj* at *now*. Pure."""
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    for kind, phase in (
        ("Failed", JobPhase.FAILED),
        ("Complete", JobPhase.SUCCEEDED),
        ("Suspended", JobPhase.SUSPENDED),
    ):
        condition = conditions.get(kind)
        if condition is not None and condition.get("status") == "True":
            return phase, condition.get("reason"), condition.get("message")
    jobs = status.get("jobsStatus") or []
    if any(
        job.get("name") not in INITIALIZER_JOBS and (job.get("active") or 0) > 0 for job in jobs
    ):
        return JobPhase.RUNNING, None, None
    if not jobs:
        # Waiting counts from creation, or from the last resume (Kueue admits by resuming).
        resumed = conditions.get("Suspended")
        since = results.parse_timestamp(
            (resumed or {}).get("lastTransitionTime")
            or (obj.get("metadata") or {}).get("creationTimestamp")
        )
        if since is not None and (now - since).total_seconds() > jobset_timeout:
            return (
                JobPhase.FAILED,
                "JobSetNotCreated",
                f"no JobSet appeared within {jobset_timeout:g}s; see the TrainJob's events "
                "(reason TrainJobResourcesCreationFailed)",
            )
    return JobPhase.PENDING, None, None


def _finished_at(obj: Mapping[str, Any]) -> datetime | None:
    """When the TrainJob reached `Complete` or `Failed`, None if it has not."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return results.parse_timestamp(condition.get("lastTransitionTime"))
    return None


class _ResourceVersionGoneError(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class KubernetesBackend(RemovesFinishedJobs, RecallsJobContext):
    """A `TrainingBackend` on Kubeflow Trainer v2 (see the module docstring).

    Args:
        api: the `CustomObjectsApi` to use.
        clock: stamps observations and times the JobSet timeout.
        catalog: runtimes on offer; one over the same `api` is made when None.
        settings: see `BackendSettings`.
        sleep: how to wait between retries (tests pass a recorder).
        pods: lists a failed job's pods for its log tail; None leaves failures with the
            controller's message only.
        objects: creates, reads and deletes the TrainJobs; by default one pooled aiohttp
            session on *api*'s `ApiClient` settings (`async_api.custom_objects`).
    """

    def __init__(
        self,
        api: CustomObjectsApi,
        *,
        clock: Clock,
        catalog: RuntimeCatalog | None = None,
        settings: BackendSettings | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        pods: CoreV1Api | None = None,
        objects: async_api.CustomObjects | None = None,
    ) -> None:
        self._api = api
        self._pods = pods
        self._clock = clock
        self._settings = settings or BackendSettings()
        self._catalog = catalog or RuntimeCatalog(
            api, clock=clock, namespace=self._settings.namespace
        )
        self._sleep = sleep
        self._pod_failures = (
            None
            if pods is None
            else PodFailureWatch(
                pods,
                namespace=self._settings.namespace,
                selector=SELECTOR,
                timeout=self._settings.watch_timeout,
            )
        )
        self._cancelled: set[str] = set()
        self._objects = objects or async_api.custom_objects(
            api,
            async_api.Collection(GROUP, VERSION, self._settings.namespace, manifests.PLURAL),
            timeout=self._settings.request_timeout,
        )

    async def aclose(self) -> None:
        """Close the connections of the TrainJob calls (a later call opens new ones)."""
        await self._objects.aclose()

    @classmethod
    def from_api_client(
        cls, api_client: ApiClient, *, clock: Clock, settings: BackendSettings | None = None
    ) -> KubernetesBackend:
        """A backend on *api_client* (e.g. from `kubernetes.config.new_client_from_config`)."""
        return cls(
            CustomObjectsApi(api_client),
            clock=clock,
            settings=settings,
            pods=CoreV1Api(api_client),
        )

    @property
    def namespace(self) -> str:
        return self._settings.namespace

    def _ref(self, name: str) -> JobRef:
        return JobRef(name=name, backend=BACKEND_NAME, namespace=self.namespace)

    # --- launch -------------------------------------------------------------------------

    async def launch(self, request: TrainingRequest) -> JobRef:
        runtime = await self._catalog.select(
            request.runtime, needs_gpu=request.resources.gpus_per_node > 0
        )
        body = manifests.build_trainjob(
            request, namespace=self.namespace, runtime=runtime, settings=self._settings.manifests
        )
        doing = f"create TrainJob {self.namespace}/{request.name}"
        # One attempt: the service owns retries (orchestrator/service.py, RetryPolicy).
        try:
            await self._objects.create(body)
        except ApiException as exc:
            if exc.status == 409:
                if await self._is_same_job(request):
                    log.info("job_already_launched", job=request.name)
                    return self._ref(request.name)
                raise TransientBackendError(
                    f"{doing}: a TrainJob of that name was deleted between our create and our "
                    "read; create again",
                    delay=self._settings.backoff_initial,
                ) from exc
            error = translate(exc, doing=doing, retry_delay=self._settings.backoff_initial)
        except Exception as exc:
            error = translate(exc, doing=doing, retry_delay=self._settings.backoff_initial)
        else:
            log.info("job_launched", job=request.name, runtime=runtime.reference)
            return self._ref(request.name)
        if not isinstance(error, TransientBackendError):
            log.warning("job_rejected", job=request.name, error=str(error))
        # error.delay is the server's Retry-After when it sent one, else backoff_initial.
        raise error

    async def _is_same_job(self, request: TrainingRequest) -> bool:
        """After a 409: True if the existing TrainJob is this decision's, raise if foreign."""
        try:
            existing = await self._get(request.name)
        except Exception as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return False
            # A connection that fails here is transient too (it escaped untranslated before).
            raise translate(exc, doing=f"read TrainJob {request.name}") from exc
        metadata = existing.get("metadata") or {}
        labels = metadata.get("labels") or {}
        annotations = metadata.get("annotations") or {}
        if labels.get(manifests.MANAGED_BY_LABEL) != manifests.MANAGED_BY:
            owner = labels.get(manifests.MANAGED_BY_LABEL) or "someone else (no managed-by label)"
            raise foreign_object_error(request.name, namespace=self.namespace, owner=owner)
        theirs = annotations.get(manifests.DECISION_ID)
        if theirs != request.decision_id:
            raise foreign_object_error(
                request.name, namespace=self.namespace, owner=f"tuneloop decision {theirs!r}"
            )
        return True

    # --- cancel -------------------------------------------------------------------------

    async def cancel(self, job: JobRef) -> None:
        try:
            existing = await self._get(job.name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise translate(exc, doing=f"read TrainJob {job.name}") from exc
        phase, _, _ = phase_of(existing, now=self._clock.now(), jobset_timeout=float("inf"))
        if phase.is_final:
            return
        self._cancelled.add(job.name)
        try:
            await self._objects.delete(job.name, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise translate(exc, doing=f"delete TrainJob {job.name}") from exc
        log.info("job_cancelled", job=job.name)

    # --- observe ------------------------------------------------------------------------

    async def observe(self) -> AsyncIterator[Observation]:
        seen: dict[str, JobPhase] = {}
        live: dict[str, Mapping[str, Any]] = {}  # jobs not final yet, for the JobSet timeout
        reported: dict[str, dict[str, Any]] = {}  # each job's last trainer report yielded
        if self._pod_failures is not None:
            self._pod_failures.start()
        try:
            async for observation in self._observe(seen, live, reported):
                yield observation
        finally:
            if self._pod_failures is not None:
                self._pod_failures.stop()

    async def _observe(
        self,
        seen: dict[str, JobPhase],
        live: dict[str, Mapping[str, Any]],
        reported: dict[str, dict[str, Any]],
    ) -> AsyncIterator[Observation]:
        while True:
            version, items = await self._list()
            listed = {obj["metadata"]["name"] for obj in items}
            changes = [await self._observe_object(obj, seen, live, reported) for obj in items]
            # Jobs that vanished while nobody watched (a restart, a 410) were deleted.
            changes += [
                self._observe_deletion(n, seen, live) for n in list(live) if n not in listed
            ]
            for observation in changes:
                if observation is not None:
                    yield observation
            try:
                while True:
                    async for kind, obj in self._watch(version):
                        version = obj.get("metadata", {}).get("resourceVersion") or version
                        observation = await self._observe_event(kind, obj, seen, live, reported)
                        if observation is not None:
                            yield observation
                    # The watch ended on its timeout: time to look at jobs stuck waiting.
                    for obj in list(live.values()):
                        observation = await self._observe_object(obj, seen, live, reported)
                        if observation is not None:
                            yield observation
            except _ResourceVersionGoneError:
                log.info("watch_expired_relisting", resource_version=version)

    async def _observe_event(
        self,
        kind: str,
        obj: Mapping[str, Any],
        seen: dict[str, JobPhase],
        live: dict[str, Mapping[str, Any]],
        reported: dict[str, dict[str, Any]],
    ) -> Observation | None:
        if kind == "BOOKMARK":
            return None
        if kind == "DELETED":
            reported.pop(obj["metadata"]["name"], None)
            return self._observe_deletion(obj["metadata"]["name"], seen, live)
        return await self._observe_object(obj, seen, live, reported)

    async def _observe_object(
        self,
        obj: Mapping[str, Any],
        seen: dict[str, JobPhase],
        live: dict[str, Mapping[str, Any]],
        reported: dict[str, dict[str, Any]],
    ) -> Observation | None:
        name = obj["metadata"]["name"]
        now = self._clock.now()
        phase, reason, message = phase_of(
            obj, now=now, jobset_timeout=self._settings.jobset_timeout
        )
        if phase.is_final:
            live.pop(name, None)
        else:
            live[name] = obj
        report = progress.progress_of(obj)
        if next_transition(seen.get(name), phase) is None:
            if phase is not JobPhase.RUNNING or not report or report == reported.get(name):
                return None
            reported[name] = report
            return Observation(
                job=self._ref(name), phase=phase, at=now, reason="Progress", progress=report
            )
        seen[name] = phase
        if phase.is_final:
            reported.pop(name, None)
        elif report:
            reported[name] = report
        result = None
        if phase is JobPhase.SUCCEEDED:
            output_uri = results.output_uri_of(obj)
            file_result = (
                await asyncio.to_thread(results.read_result_file, output_uri)
                if output_uri
                else None
            )
            result = results.result_of(obj, file_result=file_result)
        elif phase is JobPhase.FAILED:
            result = results.result_of(obj)
            message = await self._failure_message(name, message)
        # A job that finished while nobody watched finished then, not when we noticed. The
        # condition's time has whole seconds only, so a fresh one would read as slightly in
        # the past (and durations as negative): use it only when it is clearly older.
        finished_at = _finished_at(obj) if phase.is_final else None
        at = (
            finished_at
            if finished_at is not None and (now - finished_at).total_seconds() > 1
            else now
        )
        return Observation(
            job=self._ref(name),
            phase=phase,
            at=at,
            reason=reason,
            message=message,
            result=result,
            progress=report,
        )

    async def _failure_message(self, name: str, message: str | None) -> str | None:
        """*message* with the failing trainer container's log tail: what the pod watch kept,
        else what the pods say now.

        Best effort: a job's failure is reported whether or not its pods can be read (they
        may be gone, or the worker may not be allowed to list them)."""
        if self._pods is None or self._pod_failures is None:
            return message
        said = self._pod_failures.take(name)
        if said is not None:
            return failures.failure_message(message, said)
        try:
            response = await self._call(
                self._pods.list_namespaced_pod,
                self.namespace,
                label_selector=f"{failures.JOBSET_NAME_LABEL}={name}",
                _preload_content=False,
            )
            pods = json.loads(response.data).get("items") or []
        except Exception as exc:
            log.warning("failed_pods_unreadable", job=name, error=str(exc))
            return message
        return failures.failure_message(message, failures.failed_container(pods))

    def _observe_deletion(
        self, name: str, seen: dict[str, JobPhase], live: dict[str, Mapping[str, Any]]
    ) -> Observation | None:
        live.pop(name, None)
        if next_transition(seen.get(name), JobPhase.FAILED) is None:
            return None
        seen[name] = JobPhase.FAILED
        cancelled = name in self._cancelled
        self._cancelled.discard(name)
        return Observation(
            job=self._ref(name),
            phase=JobPhase.FAILED,
            at=self._clock.now(),
            reason="Cancelled" if cancelled else "Deleted",
            message=(
                "cancelled by tuneloop (concurrency: replace, or a sweep stopped the trial)"
                if cancelled
                else "the TrainJob was deleted before it finished"
            ),
        )

    async def active_jobs(self) -> frozenset[str]:
        """Our TrainJobs in the namespace that have not finished, whoever launched them: the
        count spans every worker that launches into this namespace."""
        _, items = await self._list()
        now = self._clock.now()
        return frozenset(
            obj["metadata"]["name"]
            for obj in items
            if not phase_of(obj, now=now, jobset_timeout=self._settings.jobset_timeout)[0].is_final
        )

    # --- garbage collection -------------------------------------------------------------

    async def remove_finished(
        self, *, finished_before: datetime, announced: Callable[[str], Awaitable[bool]]
    ) -> tuple[str, ...]:
        """Delete our TrainJobs that finished before *finished_before* and whose outcome was
        announced; return their names.

        The Trainer keeps finished TrainJobs (and their JobSets) forever (no TTL yet,
        kubeflow/trainer#4052). *announced* (e.g. `CompletionPublisher.announced_final`) guards
        the one thing deletion must not do: remove a job before its completion event went out.
        """
        _, items = await self._list()
        removed: list[str] = []
        for obj in items:
            name = obj["metadata"]["name"]
            finished_at = _finished_at(obj)
            if finished_at is None or finished_at >= finished_before:
                continue
            if not await announced(name):
                continue
            try:
                await self._objects.delete(name, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise translate(exc, doing=f"delete TrainJob {name}") from exc
            removed.append(name)
        if removed:
            log.info("finished_jobs_removed", count=len(removed))
        return tuple(removed)

    async def context_of(self, job: JobRef) -> JobContext | None:
        """Provenance of *job* from its annotations: `CompletionPublisher(recover_context=)`."""
        try:
            return results.context_of_trainjob(await self._get(job.name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise translate(exc, doing=f"read TrainJob {job.name}") from exc

    # --- API calls ----------------------------------------------------------------------

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self._settings.request_timeout)
        return await asyncio.to_thread(method, *args, **kwargs)

    async def _get(self, name: str) -> Mapping[str, Any]:
        return await self._objects.get(name)

    async def _list(self) -> tuple[str, list[Mapping[str, Any]]]:
        """Every TrainJob of ours, and the resourceVersion to watch from. Retries transient
        failures forever (with backoff): the watcher must outlive an API server restart."""
        delay = self._settings.backoff_initial
        while True:
            try:
                listing = await self._call(
                    self._api.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    manifests.PLURAL,
                    label_selector=SELECTOR,
                )
            except Exception as exc:
                if not is_transient(exc):
                    raise translate(exc, doing="list TrainJobs") from exc
                log.warning("trainjob_list_failed", error=str(exc), delay=delay)
                await self._sleep(delay)
                delay = min(delay * 2, self._settings.backoff_max)
                continue
            return str(listing["metadata"].get("resourceVersion", "")), list(listing["items"])

    async def _watch(self, version: str) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        """Events after *version* until the server ends the watch.

        Raises:
            _ResourceVersionGoneError: *version* is too old (410).
        """
        lines = self._objects.watch(
            async_api.WatchQuery(
                label_selector=SELECTOR,
                resource_version=version,
                timeout_seconds=self._settings.watch_timeout,
                connect_timeout=self._settings.request_timeout,
            )
        )
        answered = False  # whether a line came: an error after that is a dropped connection
        try:
            while True:
                try:
                    line = await anext(lines)
                except StopAsyncIteration:
                    return
                except ApiException as exc:  # an error status: the server did not answer
                    if exc.status == 410:
                        raise _ResourceVersionGoneError from exc
                    if not is_transient(exc):
                        raise translate(exc, doing="watch TrainJobs") from exc
                    await self._sleep(self._settings.backoff_initial)
                    return
                except Exception as exc:
                    if isinstance(exc, BackendError) or not is_transient(exc):
                        if answered:
                            raise
                        raise translate(exc, doing="watch TrainJobs") from exc
                    if not answered:
                        await self._sleep(self._settings.backoff_initial)
                    return  # connection dropped: the caller watches again from `version`
                answered = True
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _ResourceVersionGoneError
                    log.warning("watch_error", status=obj)
                    await self._sleep(self._settings.backoff_initial)
                    return
                yield str(kind), obj
        finally:
            await lines.aclose()

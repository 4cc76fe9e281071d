"""The backend contract, run against `KubernetesBackend` on a real cluster with the controllers.

On the local control plane the Kubeflow Trainer and JobSet controllers run, and the test's
namespace is held (`tuneloop.io/node-agent=hold`): a TrainJob gets its JobSet, Jobs and pods
from the real controllers, the pods stay Pending, and the Trainer itself reports the job
Running (its Jobs are active). `KubernetesJobController` moves a job the rest of the way
where no trainer runs, each phase by the means closest to the real one:

- Running: nothing to do but resume a suspended TrainJob; the controllers do the rest;
- Suspended: `spec.suspend: true` on the TrainJob, as Kueue does; the Trainer suspends the
  JobSet and writes the `Suspended` condition;
- Succeeded, Failed: the JobSet's `/status` is patched with the condition the JobSet controller
  writes when its Jobs complete or fail (no container runs here, so no Job can), and the real
  Trainer copies it to the TrainJob. A result's metrics are patched into the TrainJob's
  `trainerStatus`, which the trainer's own reports to the Trainer's status server fill in a
  real run.

A TrainJob's own `Failed` or `Suspended` condition cannot be patched: the Trainer recomputes
both on its next reconcile (it drops a Failed condition that no JobSet or deadline backs).
tests/e2e/test_kubernetes_loop.py has real pods produce each phase.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from orchestrator.clock import SystemClock
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation
from orchestrator.ports import TrainingBackend
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from runtimes.kubernetes.catalog import GROUP, VERSION
from tests.contract.backend_contract import WAIT, BackendContract, request

pytestmark = pytest.mark.kubernetes

TEST_SETTINGS = BackendSettings(
    watch_timeout=2, backoff_initial=0.05, backoff_max=0.2, request_timeout=5.0
)
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, reason: str, message: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
    }


def jobset_outcome(phase: JobPhase, *, reason: str | None = None) -> dict[str, Any]:
    """The `status` fields JobSet v0.12.0 writes when its Jobs complete or fail
    (pkg/constants: AllJobsCompleted, FailedJobs and their messages)."""
    if phase is JobPhase.SUCCEEDED:
        return {
            "conditions": [
                _condition("Completed", "AllJobsCompleted", "jobset completed successfully")
            ],
            "terminalState": "Completed",
        }
    if phase is JobPhase.FAILED:
        return {
            "conditions": [
                _condition(
                    "Failed",
                    reason or "FailedJobs",
                    "jobset failed due to one or more job failures",
                )
            ],
            "terminalState": "Failed",
        }
    raise ValueError(f"a JobSet does not end in {phase}")


def trainer_report(result: JobResult) -> dict[str, Any]:
    """The TrainJob's `trainerStatus` after the trainer's last report to the status server."""
    return {
        "progressPercentage": 100,
        "metrics": [{"name": k, "value": str(v)} for k, v in result.metrics.items()],
        "lastUpdatedTime": _now(),
    }


class KubernetesJobController:
    """A `JobController` for TrainJobs in a held namespace (see the module docstring).

    `end_sync` is the same for code that is not async (the fault suites' harness)."""

    def __init__(self, api: client.CustomObjectsApi, namespace: str) -> None:
        self._api = api
        self._namespace = namespace

    async def move(
        self,
        job: JobRef,
        phase: JobPhase,
        *,
        reason: str | None = None,
        result: JobResult | None = None,
    ) -> None:
        if phase is JobPhase.RUNNING:
            await asyncio.to_thread(self._suspend, job.name, False)
        elif phase is JobPhase.SUSPENDED:
            await asyncio.to_thread(self._suspend, job.name, True)
        else:
            await asyncio.to_thread(self.end_sync, job.name, phase, reason=reason, result=result)

    def end_sync(
        self,
        name: str,
        phase: JobPhase,
        *,
        reason: str | None = None,
        result: JobResult | None = None,
        timeout: float = 60.0,
        wait: bool = True,
    ) -> None:
        """End TrainJob *name* in *phase* (Succeeded or Failed) through its JobSet; with
        *wait*, return once the Trainer has marked the TrainJob, so that a watcher started
        afterwards finds it ended (tests that end a job before watching need that)."""
        if result is not None and result.metrics:
            self._api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self._namespace,
                "trainjobs",
                name,
                {"status": {"trainerStatus": trainer_report(result)}},
            )
        outcome = {"status": jobset_outcome(phase, reason=reason)}
        deadline = time.monotonic() + timeout
        while True:
            try:
                # The Trainer names the JobSet after the TrainJob, on its first reconcile.
                self._api.patch_namespaced_custom_object_status(
                    JOBSET_GROUP, JOBSET_VERSION, self._namespace, "jobsets", name, outcome
                )
                break
            except client.ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        condition = "Complete" if phase is JobPhase.SUCCEEDED else "Failed"
        while wait and not self._has_condition(name, condition):
            if time.monotonic() > deadline:
                raise AssertionError(f"the Trainer did not mark {name} {condition} in {timeout} s")
            time.sleep(0.1)

    def _has_condition(self, name: str, kind: str) -> bool:
        found = self._api.get_namespaced_custom_object_status(
            GROUP, VERSION, self._namespace, "trainjobs", name
        )
        conditions = (found.get("status") or {}).get("conditions") or []
        return any(c["type"] == kind and c["status"] == "True" for c in conditions)

    def _suspend(self, name: str, suspend: bool) -> None:
        current = self._api.get_namespaced_custom_object(
            GROUP, VERSION, self._namespace, "trainjobs", name
        )
        if bool(current["spec"].get("suspend")) != suspend:
            self._api.patch_namespaced_custom_object(
                GROUP, VERSION, self._namespace, "trainjobs", name, {"spec": {"suspend": suspend}}
            )


@pytest.fixture
def objects(kube_api):
    with kube_api.api_client() as api:
        yield client.CustomObjectsApi(api)


class TestKubernetesBackendContract(BackendContract):
    @pytest.fixture
    def backend(self, objects, k8s_namespace):
        settings = BackendSettings(
            namespace=k8s_namespace,
            watch_timeout=TEST_SETTINGS.watch_timeout,
            backoff_initial=TEST_SETTINGS.backoff_initial,
            backoff_max=TEST_SETTINGS.backoff_max,
            request_timeout=TEST_SETTINGS.request_timeout,
        )
        return KubernetesBackend(objects, clock=SystemClock(), settings=settings)

    @pytest.fixture
    def runtime(self):
        return "torch-distributed"

    @pytest.fixture
    def controller(self, objects, k8s_namespace):
        return KubernetesJobController(objects, k8s_namespace)

    async def listening(self, backend: TrainingBackend, runtime: str) -> AsyncIterator[Observation]:
        # The watcher lists on its first read, and the controllers may have moved a job on by
        # then; a job of its own, once seen, proves the list is done and the watch follows.
        stream = aiter(backend.observe())
        marker = await backend.launch(request("ft-listening", runtime))

        async def seen() -> None:
            async for observation in stream:
                if observation.job.name == marker.name:
                    return

        await asyncio.wait_for(seen(), WAIT)
        return stream

"""The backend contract, run against `KubernetesBackend` on the real API server.

`TrainerStatusPatcher` plays the Trainer controller: it writes TrainJob `/status` the way the
Trainer v2.3.0 controller does (conditions copied from the JobSet, `jobsStatus` from its
replicated jobs, `trainerStatus` from the status server). It does so also where the controllers
run (`TUNELOOP_LOCAL_KUBERNETES=control-plane`): the contract moves a job to each phase when
the shared suite says so (Running, then Failed with a given reason, then a result), which a
controller does on its own schedule. tests/e2e/test_kubernetes_loop.py has the controllers
produce those phases themselves.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from orchestrator.clock import SystemClock
from orchestrator.jobs.model import JobPhase, JobRef, JobResult
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from runtimes.kubernetes.catalog import GROUP, VERSION
from tests.contract.backend_contract import BackendContract

pytestmark = pytest.mark.kubernetes

TEST_SETTINGS = BackendSettings(
    watch_timeout=2, backoff_initial=0.05, backoff_max=0.2, request_timeout=5.0
)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
    }


def _node_job(*, active: int = 0, succeeded: int = 0, failed: int = 0) -> dict[str, Any]:
    return {
        "name": "node",
        "active": active,
        "ready": active,
        "succeeded": succeeded,
        "failed": failed,
        "suspended": 0,
    }


def trainer_status(
    phase: JobPhase, *, reason: str | None = None, result: JobResult | None = None
) -> dict[str, Any]:
    """The `status` the Trainer controller would write for a job in *phase*."""
    if phase is JobPhase.RUNNING:
        return {
            "conditions": [_condition("Suspended", "False", "Resumed", "TrainJob is resumed")],
            "jobsStatus": [_node_job(active=1)],
        }
    if phase is JobPhase.SUSPENDED:
        return {
            "conditions": [
                _condition("Suspended", "True", reason or "Suspended", "TrainJob is suspended")
            ],
            "jobsStatus": [_node_job()],
        }
    if phase is JobPhase.SUCCEEDED:
        status: dict[str, Any] = {
            "conditions": [
                _condition("Complete", "True", "AllJobsCompleted", "jobset completed successfully")
            ],
            "jobsStatus": [_node_job(succeeded=1)],
        }
        if result is not None and result.metrics:
            status["trainerStatus"] = {
                "progressPercentage": 100,
                "metrics": [{"name": k, "value": str(v)} for k, v in result.metrics.items()],
                "lastUpdatedTime": _now(),
            }
        return status
    if phase is JobPhase.FAILED:
        return {
            "conditions": [
                _condition(
                    "Failed",
                    "True",
                    reason or "FailedJobs",
                    "jobset failed due to one or more job failures",
                )
            ],
            "jobsStatus": [_node_job(failed=1)],
        }
    raise ValueError(f"the controller does not write {phase}")


class TrainerStatusPatcher:
    """A `JobController` that patches `/status` like the Trainer controller."""

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
        await asyncio.to_thread(
            self._api.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            self._namespace,
            "trainjobs",
            job.name,
            {"status": trainer_status(phase, reason=reason, result=result)},
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
        return TrainerStatusPatcher(objects, k8s_namespace)

"""One contract for every `TrainingBackend`: the same tests against the fake and the real ones.

As faststream runs one suite against its test broker and real brokers, each backend's test
module subclasses `BackendContract` and provides three fixtures:

* `backend` - a fresh backend instance (function scope);
* `runtime` - the name of a runtime on which launches succeed;
* `controller` - a `JobController` that moves a launched job the way the real scheduler would.

The controller-helper protocol (`JobController`):

    async def move(job: JobRef, phase: JobPhase, *, reason: str | None = None,
                   result: JobResult | None = None) -> None

It makes the job *be* in `phase`, by whatever means the backend's world has:

* in-memory: `InMemoryBackend.move(...)` (its test hook);
* Kubernetes: the real controllers, in a namespace whose pods stay Pending: Running comes
  from them, Suspended from `spec.suspend`, and an end from the JobSet's `/status`, which
  the Trainer copies (`trainerStatus.metrics` for the result; see
  test_kubernetes_backend_contract.py);
* local process: running a real short job (the trainer engineer's module).

`move` may return before the backend notices; the tests wait for the observation. Only
`RUNNING`, `SUCCEEDED`, `FAILED` (with a reason) and `SUSPENDED` are asked for. A controller
that cannot produce a phase (a real process cannot be made "suspended") raises
`pytest.skip`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

import pytest

from orchestrator.errors import JobRejectedError
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation, TrainingRequest
from orchestrator.ports import TrainingBackend

WAIT = 15.0
"""Seconds to wait for an observation before the test fails."""


class JobController(Protocol):
    """Moves a launched job between phases (see the module docstring)."""

    async def move(
        self,
        job: JobRef,
        phase: JobPhase,
        *,
        reason: str | None = None,
        result: JobResult | None = None,
    ) -> None: ...


def request(name: str, runtime: str, *, decision_id: str | None = None) -> TrainingRequest:
    return TrainingRequest(
        name=name,
        rule="drift",
        rule_version="1",
        key="model-a",
        decision_id=decision_id or f"decision-{name}",
        causing_event_ids=("event-1",),
        runtime=runtime,
        base_model="tiny",
        dataset="file:///data/rows.jsonl",
        model_id="model-a",
    )


async def until(
    stream: AsyncIterator[Observation], name: str, phase: JobPhase
) -> list[Observation]:
    """Observations of job *name* up to and including the first in *phase*."""
    seen: list[Observation] = []

    async def read() -> None:
        async for observation in stream:
            if observation.job.name != name:
                continue
            seen.append(observation)
            if observation.phase is phase:
                return

    try:
        await asyncio.wait_for(read(), WAIT)
    except TimeoutError:
        pytest.fail(f"{name} never observed {phase}; saw {[o.phase for o in seen]}")
    return seen


class BackendContract:
    """What every backend promises. Subclasses provide `backend`, `runtime`, `controller`,
    and may override `listening`."""

    async def listening(self, backend: TrainingBackend, runtime: str) -> AsyncIterator[Observation]:
        """A stream of *backend*'s observations that sees every job launched after it returns.

        `observe()` may start lazily, on the first read; a backend whose first read is a
        listing, and whose jobs can move on by themselves before it (Kubernetes, where the
        controllers run), overrides this to make sure the watch has begun.
        """
        return aiter(backend.observe())

    async def test_launch_returns_a_ref_named_after_the_request(
        self, backend: TrainingBackend, runtime: str
    ):
        ref = await backend.launch(request("ft-launch", runtime))
        assert ref.name == "ft-launch"

    async def test_launching_the_same_decision_twice_starts_one_job(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        first = await backend.launch(request("ft-twice", runtime))
        second = await backend.launch(request("ft-twice", runtime))
        assert first == second
        stream = aiter(backend.observe())
        await controller.move(first, JobPhase.SUCCEEDED, result=JobResult("file:///a"))
        observed = await until(stream, "ft-twice", JobPhase.SUCCEEDED)
        assert [o.phase for o in observed].count(JobPhase.SUCCEEDED) == 1
        await stream.aclose()  # type: ignore[attr-defined]

    async def test_a_launched_job_is_active_until_it_finishes(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        assert "ft-active" not in await backend.active_jobs()
        job = await backend.launch(request("ft-active", runtime))
        assert "ft-active" in await backend.active_jobs()
        stream = aiter(backend.observe())
        await controller.move(job, JobPhase.SUCCEEDED, result=JobResult("file:///a"))
        await until(stream, "ft-active", JobPhase.SUCCEEDED)
        await stream.aclose()  # type: ignore[attr-defined]
        assert "ft-active" not in await backend.active_jobs()

    async def test_another_decision_with_the_same_name_is_rejected(
        self, backend: TrainingBackend, runtime: str
    ):
        await backend.launch(request("ft-clash", runtime, decision_id="one"))
        with pytest.raises(JobRejectedError) as error:
            await backend.launch(request("ft-clash", runtime, decision_id="two"))
        assert error.value.reason == "NameTaken"

    async def test_missing_runtime_rejects_the_job(self, backend: TrainingBackend):
        with pytest.raises(JobRejectedError) as error:
            await backend.launch(request("ft-noruntime", "no-such-runtime"))
        assert error.value.reason == "RuntimeNotFound"
        assert "no-such-runtime" in str(error.value)

    async def test_watcher_sees_pending_running_succeeded_with_the_result(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        stream = await self.listening(backend, runtime)
        ref = await backend.launch(request("ft-life", runtime))
        await until(stream, "ft-life", JobPhase.PENDING)
        await controller.move(ref, JobPhase.RUNNING)
        await until(stream, "ft-life", JobPhase.RUNNING)
        await controller.move(
            ref, JobPhase.SUCCEEDED, result=JobResult("file:///out", {"train_loss": 0.25})
        )
        (*_, done) = await until(stream, "ft-life", JobPhase.SUCCEEDED)
        assert done.result is not None
        assert done.result.adapter_uri
        assert done.result.metrics["train_loss"] == 0.25
        await stream.aclose()  # type: ignore[attr-defined]

    async def test_failed_job_is_observed_with_its_reason(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        stream = aiter(backend.observe())
        ref = await backend.launch(request("ft-fail", runtime))
        await controller.move(ref, JobPhase.FAILED, reason="FailedJobs")
        (*_, failed) = await until(stream, "ft-fail", JobPhase.FAILED)
        assert failed.reason == "FailedJobs"
        await stream.aclose()  # type: ignore[attr-defined]

    async def test_a_restarted_watcher_finds_jobs_in_their_current_phase(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        first = aiter(backend.observe())
        ref = await backend.launch(request("ft-restart", runtime))
        await controller.move(ref, JobPhase.RUNNING)
        await until(first, "ft-restart", JobPhase.RUNNING)
        await first.aclose()  # type: ignore[attr-defined]
        await controller.move(ref, JobPhase.SUCCEEDED, result=JobResult("file:///out"))
        second = aiter(backend.observe())
        (*_, done) = await until(second, "ft-restart", JobPhase.SUCCEEDED)
        assert done.job == ref
        await second.aclose()  # type: ignore[attr-defined]

    async def test_cancelled_running_job_ends_failed_as_cancelled(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        stream = aiter(backend.observe())
        ref = await backend.launch(request("ft-cancel", runtime))
        await controller.move(ref, JobPhase.RUNNING)
        await until(stream, "ft-cancel", JobPhase.RUNNING)
        await backend.cancel(ref)
        (*_, failed) = await until(stream, "ft-cancel", JobPhase.FAILED)
        assert failed.reason == "Cancelled"
        await stream.aclose()  # type: ignore[attr-defined]

    async def test_cancelling_unknown_or_finished_jobs_does_nothing(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        ref = await backend.launch(request("ft-done", runtime))
        await controller.move(ref, JobPhase.SUCCEEDED, result=JobResult("file:///out"))
        stream = aiter(backend.observe())
        await until(stream, "ft-done", JobPhase.SUCCEEDED)
        await backend.cancel(ref)
        await backend.cancel(
            JobRef(name="ft-unknown", backend=ref.backend, namespace=ref.namespace)
        )
        await stream.aclose()  # type: ignore[attr-defined]
        again = aiter(backend.observe())
        (*_, still) = await until(again, "ft-done", JobPhase.SUCCEEDED)
        assert still.phase is JobPhase.SUCCEEDED
        await again.aclose()  # type: ignore[attr-defined]

    async def test_suspended_job_is_observed_and_resumes(
        self, backend: TrainingBackend, runtime: str, controller: JobController
    ):
        stream = aiter(backend.observe())
        ref = await backend.launch(request("ft-suspend", runtime))
        await controller.move(ref, JobPhase.SUSPENDED, reason="Suspended")
        await until(stream, "ft-suspend", JobPhase.SUSPENDED)
        await controller.move(ref, JobPhase.RUNNING)
        await until(stream, "ft-suspend", JobPhase.RUNNING)
        await stream.aclose()  # type: ignore[attr-defined]

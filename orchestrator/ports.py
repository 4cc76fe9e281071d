"""The ports of the core: what it needs from the outside world, as protocols.

Adapters implement them: `runtimes/kubernetes` and `runtimes/localprocess` are
`TrainingBackend`s; `handlers/` provides the `EventPublisher`. In-memory fakes for tests live
in `orchestrator/testing.py`.

Some backends can do more than every backend must. Each such capability is its own
`runtime_checkable` protocol below, which a backend declares by subclassing it; the
composition root (`handlers/app.py`) asks `isinstance(backend, Capability)` and wires the
capability only then:

- `RemovesFinishedJobs`: a backend whose finished jobs stay until removed (Kubeflow Trainer
  keeps TrainJobs forever); the worker sweeps the announced ones.
- `RecallsJobContext`: a backend that stores a job's provenance with the job, so a worker
  that has no record of it (restarted, or another worker launched it) can still name its
  rule key.

`ChampionStore` says where the current champion adapter of each rule and key is: the
composition root backs it with a faust Table (`handlers/app.py`), or with MLflow's registry
when tracking is configured; tests use `orchestrator.testing.InMemoryChampionStore`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Protocol, runtime_checkable

from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobContext, JobRef, Observation, TrainingRequest


class TrainingBackend(Protocol):
    """Where training jobs run."""

    async def launch(self, request: TrainingRequest) -> JobRef:
        """Start the job. Launching the same `request.name` twice returns the same JobRef
        and starts nothing new.

        Raises:
            TransientBackendError: try again later.
            JobRejectedError: the job can never run as asked.
        """
        ...

    async def cancel(self, job: JobRef) -> None:
        """Stop the job if it runs; cancelling a finished or unknown job does nothing."""
        ...

    def observe(self) -> AsyncIterator[Observation]:
        """Phase changes of the jobs this backend launched, including those found again
        after a restart."""
        ...

    async def active_jobs(self) -> frozenset[str]:
        """Names of the jobs this backend launched that have not finished (queued, pending,
        suspended or running): what `limits.max_concurrent_jobs` counts.

        Raises:
            TransientBackendError: try again later.
        """
        ...


class ChampionStore(Protocol):
    """Where the champion adapter of each (rule, key) is: the one a new adapter must beat.

    The service reads it when it launches a job of a rule with `promote:` (the trainer
    evaluates that champion beside the candidate) and again when the job succeeded, and moves
    it only when the gate (`orchestrator/jobs/promotion.py`) promotes. It is read and written
    only by the worker that owns the key's partition, one input at a time.
    """

    async def current(self, rule: str, key: str) -> str | None:
        """The adapter URI of the champion of *rule* and *key*; None before the first
        promotion.

        Raises:
            TransientBackendError: the store cannot answer now; try again later.
        """
        ...

    async def promote(
        self,
        rule: str,
        key: str,
        adapter_uri: str,
        job_name: str,
        scores: Mapping[str, float],
    ) -> None:
        """Make *adapter_uri*, the adapter of *job_name*, the champion of *rule* and *key*;
        *scores* are its metrics as the gate saw them. Promoting the same adapter again does
        nothing new (a replayed completion does).

        Raises:
            TransientBackendError: the store cannot take it now; try again later.
        """
        ...


class EventPublisher(Protocol):
    """Where tuneloop's own CloudEvents go (completions, decisions)."""

    async def publish(self, event: CloudEvent, *, topic: str | None = None) -> None:
        """Hand the event to the transport; it is on the broker before the input that caused
        it is committed.

        It need not wait for the broker's acknowledgement of this one event: the worker's
        `FaustTopicPublisher` returns once the record is queued in faust's producer, and
        faust flushes that producer before it commits any input offset. Waiting per event
        capped a partition at a few dozen events a second. A crash before the flush replays
        the input, which publishes the same events again, with the same ids.
        """
        ...


@runtime_checkable
class RemovesFinishedJobs(Protocol):
    """A backend whose finished jobs stay until someone removes them."""

    async def remove_finished(
        self, *, finished_before: datetime, announced: Callable[[str], Awaitable[bool]]
    ) -> tuple[str, ...]:
        """Remove this backend's jobs that finished before *finished_before* and whose
        outcome *announced* confirms was published; return their names.

        Raises:
            TransientBackendError: try again at the next sweep.
        """
        ...


@runtime_checkable
class RecallsJobContext(Protocol):
    """A backend that stores each job's provenance (rule, key, decision) with the job."""

    async def context_of(self, job: JobRef) -> JobContext | None:
        """What *job* was launched for; None when the job or its provenance is gone.

        Raises:
            TransientBackendError: try again later.
        """
        ...

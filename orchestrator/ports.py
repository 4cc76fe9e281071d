"""The ports of the core: what it needs from the outside world, as protocols.

Adapters implement them: `runtimes/kubernetes` and `runtimes/localprocess` are
`TrainingBackend`s; `handlers/` provides the `EventPublisher`. In-memory fakes for tests live
in `orchestrator/testing.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobRef, Observation, TrainingRequest


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


class EventPublisher(Protocol):
    """Where tuneloop's own CloudEvents go (completions, decisions)."""

    async def publish(self, event: CloudEvent, *, topic: str | None = None) -> None:
        """Send the event durably; return once the broker has acknowledged it."""
        ...

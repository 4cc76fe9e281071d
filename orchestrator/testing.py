"""In-memory stand-ins for the core's ports, shipped for tests and dry runs.

`InMemoryBackend` is a `TrainingBackend` whose jobs move only when told to (`move`), the way
httpx's `MockTransport` answers only what it is told. `RecordingPublisher` is an
`EventPublisher` that keeps what it was given. `InMemoryCompletionStore` is a
`CompletionStore` and `InMemoryChampionStore` a `ChampionStore` that forget on exit. Used by
unit tests, the backend contract suite (`tests/contract/`) and `tuneloop simulate`-like
tools; never in production wiring.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from orchestrator.clock import Clock
from orchestrator.errors import BackendError, JobRejectedError
from orchestrator.events import CloudEvent
from orchestrator.jobs.completion import CompletionRecord
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation, TrainingRequest
from orchestrator.jobs.tracking import next_transition

BACKEND_NAME = "in-memory"


@dataclass(slots=True)
class _Job:
    request: TrainingRequest
    ref: JobRef
    phase: JobPhase = JobPhase.PENDING
    reason: str | None = None
    message: str | None = None
    result: JobResult | None = None


class InMemoryBackend:
    """A `TrainingBackend` that keeps its jobs in a dict and moves them on request.

    Args:
        clock: stamps observations.
        runtimes: the runtime names it accepts; None accepts any. Launching on another one
            raises `JobRejectedError(reason="RuntimeNotFound")`, as a real cluster would.
    """

    def __init__(self, clock: Clock, *, runtimes: frozenset[str] | None = None) -> None:
        self._clock = clock
        self._runtimes = runtimes
        self._jobs: dict[str, _Job] = {}
        self._subscribers: list[asyncio.Queue[Observation]] = []
        self._launch_errors: list[BackendError] = []
        self._cancel_errors: list[BackendError] = []
        self.launch_calls = 0
        """How many times `launch` was called, replays included."""

    async def launch(self, request: TrainingRequest) -> JobRef:
        self.launch_calls += 1
        if self._launch_errors:
            raise self._launch_errors.pop(0)
        existing = self._jobs.get(request.name)
        if existing is not None:
            if existing.request.decision_id != request.decision_id:
                raise JobRejectedError(
                    f"job {request.name!r} already exists for decision "
                    f"{existing.request.decision_id!r}, not {request.decision_id!r}",
                    reason="NameTaken",
                )
            return existing.ref
        if self._runtimes is not None and request.runtime not in self._runtimes:
            raise JobRejectedError(
                f"runtime {request.runtime!r} does not exist; known: {sorted(self._runtimes)}",
                reason="RuntimeNotFound",
            )
        job = _Job(request=request, ref=JobRef(name=request.name, backend=BACKEND_NAME))
        self._jobs[request.name] = job
        self._emit(job, JobPhase.PENDING)
        return job.ref

    async def cancel(self, job: JobRef) -> None:
        """Cancelled jobs fail with reason `Cancelled`; finished or unknown ones are left."""
        if self._cancel_errors:
            raise self._cancel_errors.pop(0)
        known = self._jobs.get(job.name)
        if known is None or known.phase.is_final:
            return
        self.move(job.name, JobPhase.FAILED, reason="Cancelled", message="cancelled on request")

    async def observe(self) -> AsyncIterator[Observation]:
        """Every job's current phase first (as a backend finds its jobs after a restart),
        then each change as it happens."""
        queue: asyncio.Queue[Observation] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            for job in list(self._jobs.values()):
                yield self._observation(job)
            while True:
                yield await queue.get()
        finally:
            self._subscribers.remove(queue)

    async def active_jobs(self) -> frozenset[str]:
        return frozenset(name for name, job in self._jobs.items() if not job.phase.is_final)

    # --- test hooks -------------------------------------------------------------------

    def move(
        self,
        name: str,
        phase: JobPhase,
        *,
        reason: str | None = None,
        message: str | None = None,
        result: JobResult | None = None,
    ) -> None:
        """Move job *name* to *phase*, as the real scheduler would; moves that
        `next_transition` ignores (backwards, after the end) change nothing."""
        job = self._jobs[name]
        if next_transition(job.phase, phase) is None:
            return
        self._emit(job, phase, reason=reason, message=message, result=result)

    def fail_next_launch(self, error: BackendError) -> None:
        """Make the next `launch` raise *error* (once); calls queue up, one per launch."""
        self._launch_errors.append(error)

    def fail_next_cancel(self, error: BackendError) -> None:
        """Make the next `cancel` raise *error* (once); calls queue up, one per cancel."""
        self._cancel_errors.append(error)

    def phase_of(self, name: str) -> JobPhase | None:
        """The phase of job *name*, None if it was never launched."""
        job = self._jobs.get(name)
        return job.phase if job is not None else None

    def request_of(self, name: str) -> TrainingRequest:
        """The request job *name* was launched with (KeyError if it never was)."""
        return self._jobs[name].request

    @property
    def job_names(self) -> tuple[str, ...]:
        """Names of every job launched, in launch order."""
        return tuple(self._jobs)

    def _emit(
        self,
        job: _Job,
        phase: JobPhase,
        *,
        reason: str | None = None,
        message: str | None = None,
        result: JobResult | None = None,
    ) -> None:
        job.phase, job.reason, job.message, job.result = phase, reason, message, result
        observation = self._observation(job)
        for queue in self._subscribers:
            queue.put_nowait(observation)

    def _observation(self, job: _Job) -> Observation:
        return Observation(
            job=job.ref,
            phase=job.phase,
            at=self._clock.now(),
            reason=job.reason,
            message=job.message,
            result=job.result,
        )


@dataclass(frozen=True, slots=True)
class Published:
    """One event a `RecordingPublisher` was given."""

    event: CloudEvent
    topic: str | None


@dataclass(slots=True)
class RecordingPublisher:
    """An `EventPublisher` that keeps every event, in order."""

    published: list[Published] = field(default_factory=list)
    _failures: list[Exception] = field(default_factory=list)

    async def publish(self, event: CloudEvent, *, topic: str | None = None) -> None:
        if self._failures:
            raise self._failures.pop(0)
        self.published.append(Published(event=event, topic=topic))

    @property
    def events(self) -> tuple[CloudEvent, ...]:
        """The events published so far."""
        return tuple(item.event for item in self.published)

    def fail_next(self, error: Exception) -> None:
        """Make the next `publish` raise *error* (once), as a broker outage would."""
        self._failures.append(error)


@dataclass(slots=True)
class InMemoryCompletionStore:
    """A `CompletionStore` in a dict; `records` is there to look at (and to share between
    two publishers standing for one orchestrator before and after a restart)."""

    records: dict[str, CompletionRecord] = field(default_factory=dict)

    async def load(self, job: str) -> CompletionRecord | None:
        return self.records.get(job)

    async def save(self, record: CompletionRecord) -> None:
        self.records[record.job] = record


@dataclass(frozen=True, slots=True)
class Champion:
    """What an `InMemoryChampionStore` holds for one rule and key."""

    adapter_uri: str
    job_name: str
    scores: Mapping[str, float]


@dataclass(slots=True)
class InMemoryChampionStore:
    """A `ChampionStore` in a dict keyed by (rule, key); `champions` is there to look at, and
    `promotions` counts every `promote` call (replays included)."""

    champions: dict[tuple[str, str], Champion] = field(default_factory=dict)
    promotions: int = 0
    _failures: list[Exception] = field(default_factory=list)

    async def current(self, rule: str, key: str) -> str | None:
        if self._failures:
            raise self._failures.pop(0)
        champion = self.champions.get((rule, key))
        return champion.adapter_uri if champion is not None else None

    async def promote(
        self,
        rule: str,
        key: str,
        adapter_uri: str,
        job_name: str,
        scores: Mapping[str, float],
    ) -> None:
        if self._failures:
            raise self._failures.pop(0)
        self.promotions += 1
        self.champions[(rule, key)] = Champion(
            adapter_uri=adapter_uri, job_name=job_name, scores=MappingProxyType(dict(scores))
        )

    def fail_next(self, error: Exception) -> None:
        """Make the next call raise *error* (once), as an unreachable store would."""
        self._failures.append(error)

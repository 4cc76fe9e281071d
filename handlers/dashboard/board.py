"""What the dashboard shows: the newest decisions, jobs and dead letters, kept in memory.

Fed by `tailing.py` (the audit topic's decision records, the output topic's `finetune.*`
events, the dead-letter topic's records) and by the worker's observation pump (job phases
and training progress, `Board.observe`). Every feed only adds to or updates a bounded ring:
the board is a read model, rebuilt from the topics after a restart, and nothing in it is
ever written back.

A decision record is kept as the audit event's JSON data, not parsed into a
`DecisionRecord`: an outcome or reason added later (the why-not records, for one) shows up
on the page without a change here.

Pages that are open learn of each change through `subscribe` (server-sent events).
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator import event_json
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import Observation
from orchestrator.ledger import format_time

DEFAULT_HISTORY = 500
"""How many decisions, jobs and dead letters each ring keeps: enough for a screen of
filters, small enough that a busy worker's dashboard costs a few megabytes at most."""

SUBSCRIBER_BACKLOG = 64
"""Changes one slow page may fall behind by before it misses some (it reloads the table on
the next one anyway, so a missed notice only delays it)."""


class Change(enum.StrEnum):
    """What changed, named to live pages as the server-sent event's name."""

    DECISIONS = "decisions"
    JOBS = "jobs"
    DEAD_LETTERS = "dead-letters"


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One decision record as the audit topic carried it."""

    decision_id: str
    outcome: str
    reason: str
    rule: str
    key: str
    time: str
    event_ids: tuple[str, ...]
    message: str
    job_name: str

    @classmethod
    def from_audit(cls, data: Mapping[str, Any], *, fallback_id: str) -> DecisionRow:
        """The row of an audit event's data; a missing field reads as empty, never fails."""
        return cls(
            decision_id=str(data.get("decision_id") or fallback_id),
            outcome=str(data.get("outcome") or ""),
            reason=str(data.get("reason") or ""),
            rule=str(data.get("rule") or ""),
            key=str(data.get("key") or ""),
            time=str(data.get("time") or ""),
            event_ids=tuple(str(i) for i in data.get("event_ids") or ()),
            message=str(data.get("message") or ""),
            job_name=str(data.get("job_name") or (data.get("job") or {}).get("name") or ""),
        )


@dataclass(slots=True)
class JobRow:
    """One job, as its launch decision, its observations and its `finetune.*` events told it.

    Mutable on purpose: the board updates it in place as news of the job arrives.
    """

    name: str
    rule: str = ""
    key: str = ""
    decision_id: str = ""
    phase: str = ""
    progress: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    adapter_uri: str = ""
    completion_event_id: str = ""
    completion_event: dict[str, Any] = field(default_factory=dict)
    """The `finetune.completed` or `.failed` event in the CloudEvents JSON format."""
    updated: str = ""

    @property
    def percent(self) -> float | None:
        """How far training is, from the trainer's steps or the cluster's percentage."""
        if "percent" in self.progress:
            return float(self.progress["percent"])
        step, total = self.progress.get("step"), self.progress.get("total_steps")
        if isinstance(step, int | float) and isinstance(total, int | float) and total > 0:
            return 100.0 * float(step) / float(total)
        return None

    @property
    def eta_seconds(self) -> float | None:
        """The trainer's own estimate of the time left (it measures its steps)."""
        eta = self.progress.get("eta_seconds")
        return float(eta) if isinstance(eta, int | float) else None


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """One DLQ record: the reason tuneloop attached and the original record, byte for byte."""

    code: str
    message: str
    origin: str
    """`topic/partition@offset` of the refused record."""
    at: str
    position: str
    """`partition-offset` on the DLQ topic: the record's address for downloading it."""
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


class Board:
    """The rings the pages read, and the live pages' subscriptions."""

    def __init__(self, *, history: int = DEFAULT_HISTORY) -> None:
        self._history = history
        self._decisions: collections.deque[DecisionRow] = collections.deque(maxlen=history)
        self._decision_ids: set[str] = set()
        self._jobs: collections.OrderedDict[str, JobRow] = collections.OrderedDict()
        self._dead_letters: collections.deque[DeadLetterRow] = collections.deque(maxlen=history)
        self._subscribers: set[asyncio.Queue[Change | None]] = set()
        self._closed = False

    # --- what the pages read ------------------------------------------------------------

    def decisions(
        self, *, rule: str = "", key: str = "", outcome: str = ""
    ) -> tuple[DecisionRow, ...]:
        """Newest first; an empty filter matches everything."""
        return tuple(
            row
            for row in reversed(self._decisions)
            if (not rule or row.rule == rule)
            and (not key or row.key == key)
            and (not outcome or row.outcome == outcome)
        )

    def jobs(self) -> tuple[JobRow, ...]:
        """Newest first."""
        return tuple(reversed(self._jobs.values()))

    def dead_letters(self) -> tuple[DeadLetterRow, ...]:
        """Newest first."""
        return tuple(reversed(self._dead_letters))

    def dead_letter(self, position: str) -> DeadLetterRow | None:
        return next((row for row in self._dead_letters if row.position == position), None)

    # --- what the feeds add -------------------------------------------------------------

    def add_decision(self, data: Mapping[str, Any], *, event_id: str) -> None:
        """A decision record from the audit topic (a record read twice is kept once)."""
        row = DecisionRow.from_audit(data, fallback_id=event_id)
        if row.decision_id in self._decision_ids:
            return
        if len(self._decisions) == self._history:
            self._decision_ids.discard(self._decisions[0].decision_id)
        self._decisions.append(row)
        self._decision_ids.add(row.decision_id)
        if row.outcome == "launch" and row.job_name:
            job = self._job(row.job_name)
            job.rule, job.key, job.decision_id = row.rule, row.key, row.decision_id
            job.updated = job.updated or row.time
            self._notify(Change.JOBS)
        self._notify(Change.DECISIONS)

    def add_job_event(self, event: CloudEvent) -> None:
        """A `finetune.*` event of the output topic: the job's milestone and its results."""
        data = event.data if isinstance(event.data, Mapping) else {}
        name = str(data.get("job") or event.subject or "")
        if not name:
            return
        job = self._job(name)
        job.rule = job.rule or str(data.get("rule") or "")
        job.key = job.key or str(data.get("key") or "")
        job.decision_id = job.decision_id or str(data.get("decision_id") or "")
        job.phase = str(data.get("phase") or job.phase)
        if isinstance(data.get("metrics"), Mapping):
            job.metrics = dict(data["metrics"])
        job.adapter_uri = str(data.get("adapter_uri") or job.adapter_uri)
        if event.type.endswith((".completed.v1", ".failed.v1")):
            job.completion_event_id = event.id
            job.completion_event = event_json.to_json(event)
        job.updated = format_time(event.time) if event.time else job.updated
        self._notify(Change.JOBS)

    def observe(self, observation: Observation) -> None:
        """A phase change or a progress report the worker's backend just saw."""
        job = self._job(observation.job.name)
        job.phase = observation.phase.value
        if observation.progress:
            job.progress = dict(observation.progress)
        if observation.result is not None:
            job.metrics = dict(observation.result.metrics) or job.metrics
            job.adapter_uri = observation.result.adapter_uri or job.adapter_uri
        job.updated = format_time(observation.at)
        self._notify(Change.JOBS)

    def add_dead_letter(self, row: DeadLetterRow) -> None:
        if self.dead_letter(row.position) is None:
            self._dead_letters.append(row)
            self._notify(Change.DEAD_LETTERS)

    # --- live pages ---------------------------------------------------------------------

    async def subscribe(self) -> AsyncIterator[Change]:
        """What changes from now on, until the caller stops iterating or the board closes."""
        # One place more than the backlog, so that `close` always finds room for its None.
        queue: asyncio.Queue[Change | None] = asyncio.Queue(maxsize=SUBSCRIBER_BACKLOG + 1)
        self._subscribers.add(queue)
        try:
            while not self._closed:
                change = await queue.get()
                if change is None:
                    return
                yield change
        finally:
            self._subscribers.discard(queue)

    def close(self) -> None:
        """End every live page's stream: the worker is stopping, and a stream left open would
        hold its web server up until the server's shutdown timeout."""
        self._closed = True
        for queue in self._subscribers:
            queue.put_nowait(None)

    def _notify(self, change: Change) -> None:
        for queue in self._subscribers:
            if queue.qsize() < SUBSCRIBER_BACKLOG:
                queue.put_nowait(change)

    def _job(self, name: str) -> JobRow:
        job = self._jobs.get(name)
        if job is None:
            job = self._jobs[name] = JobRow(name=name)
            while len(self._jobs) > self._history:
                self._jobs.popitem(last=False)
        return job

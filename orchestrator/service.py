"""The use case: what happens to one key when an event, a job observation or a timer arrives.

`handlers/app.py` calls an `Orchestrator` from the keyed agent, one key at a time and every
input of a key in order, so nothing here needs a lock. It calls ports only: the
`TrainingBackend`, the `EventPublisher`, and two stores (the rule state per key, the
completion records per job), which the wiring backs with faust Tables (changelog topics) and
tests with dicts.

Why a crash anywhere loses nothing and doubles nothing:
- a launch is idempotent by its deterministic job name: re-running a decision after a crash
  finds the job already there and creates nothing;
- the rule state and the Kafka offset are committed together after the handler returns; a
  crash before that replays the input against the old state, which decides the same thing;
- a completion event is published before it is recorded, with an id derived from the job and
  the milestone: a replay publishes the *same* event again, which consumers dedupe on
  (source, id) — see `orchestrator/jobs/completion.py`.

Retries have one owner, this module (`RetryPolicy`). A backend makes one attempt per call and
says how long to wait (`TransientBackendError.delay`, e.g. the API server's `Retry-After`);
the intake never retries a sink. Here is where the retry belongs because only here is known
what may wait: the key's inputs stay in order while its partition waits, a launch replayed
after the wait is still idempotent by its job name, and time comes from the injected `sleep`,
so the whole policy is tested without a clock. Retrying in the backend as well multiplied the
waits (5 attempts inside each of ours), and the intake's retry of the whole input could
never run, since nothing retryable escapes `Orchestrator.handle`. (A backend's `observe()`
stream re-lists and re-watches by itself: it has no caller that could retry it.)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

import structlog

from orchestrator import signals
from orchestrator.clock import Clock
from orchestrator.errors import JobRejectedError, TransientBackendError
from orchestrator.events import CloudEvent
from orchestrator.jobs.completion import CompletionPublisher, CompletionStore
from orchestrator.jobs.model import JobPhase, JobRef, Observation, TrainingRequest
from orchestrator.ledger import DecisionRecord, Outcome, to_cloudevent
from orchestrator.ports import EventPublisher, TrainingBackend
from orchestrator.rules import engine, why_not
from orchestrator.rules.engine import JobFinished, KeyState, RuleSet

log = structlog.get_logger("tuneloop.service")

_Result = TypeVar("_Result")


class KeyStateStore(Protocol):
    """The rule state of each key (a faust Table in production)."""

    def load(self, key: str) -> KeyState | None:
        """The state of *key*, None when the key was never seen (or its state expired)."""
        ...

    def save(self, key: str, state: KeyState) -> None:
        """Replace the state of *key*."""
        ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to wait between tries of a backend call that failed with
    `TransientBackendError` (a launch, a cancel, counting the active jobs).

    It never gives up: a trigger that qualified must not be lost because the API server was
    down for a while. The keyed partition waits meanwhile, which keeps the order of decisions
    per key.
    """

    initial_delay: float = 0.5
    """Seconds before the first retry, or the backend's `delay` when that is longer."""
    max_delay: float = 30.0
    """Seconds between retries at most (the delay doubles up to this)."""


class Orchestrator:
    """Runs the rule engine for one key at a time and carries out what it decides."""

    def __init__(
        self,
        *,
        rules: RuleSet,
        backend: TrainingBackend,
        publisher: EventPublisher,
        states: KeyStateStore,
        completions: CompletionStore,
        clock: Clock,
        audit_topic: str | None = None,
        output_topic: str | None = None,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        why_not_per_minute: int = why_not.DEFAULT_PER_MINUTE,
    ) -> None:
        self._rules = rules
        self._backend = backend
        self._publisher = publisher
        self._states = states
        self._completions_store = completions
        self._completions = CompletionPublisher(
            store=completions, publisher=publisher, clock=clock, topic=output_topic
        )
        self._clock = clock
        self._audit_topic = audit_topic
        self._retry = retry
        self._sleep = sleep
        # Launches check the global job limit one at a time, so that two partitions of this
        # worker cannot both take the last free slot.
        self._slots = asyncio.Lock()
        # This worker's count of why-not records per rule: diagnostic records, so a restart
        # that forgets it costs at most one minute's allowance again (rules/why_not.py).
        self._why_not = why_not.WhyNotLimit(per_minute=why_not_per_minute)
        self.retries = 0
        """Backend calls retried so far (a metric: the backend refuses or is unreachable)."""

    @property
    def rules(self) -> RuleSet:
        return self._rules

    def replace_rules(self, rules: RuleSet) -> None:
        """Use *rules* for every later input (hot reload). Running jobs are not touched."""
        self._rules = rules

    async def keys_for(self, event: CloudEvent) -> tuple[str, ...]:
        """The keys *event* must be handled under (distinct, in rule order).

        Rules that name the event's type but did not consider it leave their why-not records
        (`why_not_records`) in the audit topic here, since they have no key to be handled
        under.
        """
        await self.audit(self.why_not_records(event))
        return tuple(dict.fromkeys(route.key for route in engine.route(self._rules, event)))

    def why_not_records(self, event: CloudEvent) -> tuple[DecisionRecord, ...]:
        """Why the rules that name *event*'s type did not consider it (`ignore`, `error`),
        as many as the per-rule limit still allows this minute; to be passed to `audit`."""
        records = engine.why_not(self._rules, event, now=self._clock.now())
        if not records:
            return ()
        self._why_not, written = why_not.limit(self._why_not, records)
        return written

    async def audit(self, records: tuple[DecisionRecord, ...]) -> None:
        """Publish *records* to the audit topic, in order."""
        for record in records:
            await self._audit(record)

    def wakeup_of(self, key: str) -> datetime | None:
        """When timers of *key* are next due (None: nothing until the next event)."""
        state = self._states.load(key)
        return engine.next_wakeup(state) if state is not None else None

    async def handle(
        self,
        key: str,
        event: CloudEvent,
        *,
        arrived_at: datetime | None = None,
        sequence: int | None = None,
        position: engine.InputPosition | None = None,
    ) -> tuple[DecisionRecord, ...]:
        """Handle one input of *key*: a producer's event or an internal signal.

        *sequence* is the input's delivery order among the inputs of *key* and *position*
        where its record sits on the input topic (see `engine.evaluate`), so that an event
        the transport re-delivers is still counted.
        """
        signal = signals.read_signal(event)
        if isinstance(signal, signals.Tick):
            return await self.handle_tick(key)
        if isinstance(signal, Observation):
            return await self.handle_observation(key, signal)
        return await self.handle_event(
            key, event, arrived_at=arrived_at, sequence=sequence, position=position
        )

    async def handle_event(
        self,
        key: str,
        event: CloudEvent,
        *,
        arrived_at: datetime | None = None,
        sequence: int | None = None,
        position: engine.InputPosition | None = None,
    ) -> tuple[DecisionRecord, ...]:
        now = self._clock.now()
        state, records = engine.evaluate(
            self._rules,
            self._states.load(key),
            event,
            key=key,
            now=now,
            arrived_at=arrived_at or now,
            sequence=sequence,
            position=position,
        )
        return await self._commit(key, state, records)

    async def handle_tick(self, key: str) -> tuple[DecisionRecord, ...]:
        state, records = engine.tick(
            self._rules, self._states.load(key), key=key, now=self._clock.now()
        )
        return await self._commit(key, state, records)

    async def handle_observation(
        self, key: str, observation: Observation
    ) -> tuple[DecisionRecord, ...]:
        """Announce the job's milestone (once) and, when it finished, tell the engine."""
        await self._completions.handle(observation)
        if not observation.phase.is_final:
            return ()
        record = await self._completions_store.load(observation.job.name)
        rule = record.context.rule if record is not None and record.context else None
        if not rule:
            return ()
        finished = JobFinished(
            rule=rule,
            key=key,
            job_name=observation.job.name,
            succeeded=observation.phase is JobPhase.SUCCEEDED,
            at=observation.at,
        )
        return await self._finish(key, finished)

    async def _finish(self, key: str, finished: JobFinished) -> tuple[DecisionRecord, ...]:
        state, records = engine.observe(
            self._rules, self._states.load(key), finished, key=key, now=self._clock.now()
        )
        return await self._commit(key, state, records)

    # --- carrying out decisions ---------------------------------------------------------

    async def _commit(
        self, key: str, state: KeyState, records: tuple[DecisionRecord, ...]
    ) -> tuple[DecisionRecord, ...]:
        """Carry out *records*, then keep *state*. A job the backend refused for good counts
        as finished at once, so that `concurrency: forbid` does not wait for it forever."""
        rejected: list[JobFinished] = []
        for record in records:
            await self._audit(record)
            if record.outcome is Outcome.CANCEL and record.job_name:
                log.info("job_cancel", job=record.job_name, rule=record.rule, key=record.key)
                await self._retrying(
                    functools.partial(
                        self._backend.cancel, JobRef(name=record.job_name, backend="")
                    ),
                    "job_cancel_retry",
                    job=record.job_name,
                )
            elif (
                record.outcome is Outcome.LAUNCH
                and record.job is not None
                and not await self._launch(record.job)
            ):
                rejected.append(
                    JobFinished(
                        rule=record.rule,
                        key=key,
                        job_name=record.job.name,
                        succeeded=False,
                        at=record.time,
                    )
                )
        self._states.save(key, state)
        for finished in rejected:
            records = (*records, *await self._finish(key, finished))
        return records

    async def _audit(self, record: DecisionRecord) -> None:
        await self._publisher.publish(to_cloudevent(record), topic=self._audit_topic)

    async def _launch(self, request: TrainingRequest) -> bool:
        """Launch *request*, retrying while the backend is unavailable; False if refused."""
        await self._completions.record_launch(request)
        if self._rules.limits.max_concurrent_jobs is None:
            return await self._launch_now(request)
        async with self._slots:
            await self._wait_for_a_slot(request)
            return await self._launch_now(request)

    async def _wait_for_a_slot(self, request: TrainingRequest) -> None:
        """Hold *request* while `limits.max_concurrent_jobs` jobs are active.

        The backend counts the active jobs, so the limit spans every worker that launches
        into it (a race between two workers can still overshoot it by one each). A job that
        is already active (a launch replayed after a restart) is never held. The key's
        partition waits meanwhile, like a launch waiting for the API server, and nothing is
        lost: the hold ends when a job finishes or a rule reload raises the limit.
        """
        delay = self._retry.initial_delay
        held = False
        while True:
            active = await self._retrying(
                self._backend.active_jobs, "job_slots_unknown", job=request.name
            )
            if request.name in active or engine.may_launch(self._rules, running=len(active)):
                if held:
                    log.info("job_launch_released", job=request.name, active=len(active))
                return
            if not held:
                held = True
                log.warning(
                    "job_launch_held",
                    job=request.name,
                    rule=request.rule,
                    key=request.key,
                    active=len(active),
                    limit=self._rules.limits.max_concurrent_jobs,
                )
            await self._sleep(delay)
            delay = min(delay * 2, self._retry.max_delay)

    async def _launch_now(self, request: TrainingRequest) -> bool:
        try:
            job = await self._retrying(
                functools.partial(self._backend.launch, request),
                "job_launch_retry",
                job=request.name,
            )
        except JobRejectedError as exc:
            log.error("job_rejected", job=request.name, reason=exc.reason, error=str(exc))
            await self._completions.announce_rejection(request, exc, backend="")
            return False
        log.info("job_launched", job=job.name, rule=request.rule, key=request.key)
        return True

    async def _retrying(
        self, call: Callable[[], Awaitable[_Result]], retry_event: str, **context: str
    ) -> _Result:
        """*call* until it does not raise `TransientBackendError` (see `RetryPolicy`)."""
        delay = self._retry.initial_delay
        attempt = 0
        while True:
            attempt += 1
            try:
                return await call()
            except TransientBackendError as exc:
                wait = max(delay, exc.delay)
                self.retries += 1
                log.warning(retry_event, attempt=attempt, wait_s=wait, error=str(exc), **context)
                await self._sleep(wait)
                delay = min(delay * 2, self._retry.max_delay)

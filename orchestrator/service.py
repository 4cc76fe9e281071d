"""The use case: what happens to one key when an event, a job observation or a timer arrives.

`handlers/app.py` calls an `Orchestrator` from stage 2 of the intake (its partition lanes), one key
at a time and every input of a key in order, so nothing here needs a lock. It calls ports only: the
`TrainingBackend`, the `EventPublisher`, and two stores (the rule state per key, the completion
records per job), which the wiring backs with faust Tables (changelog topics) and tests with dicts.

Why a crash anywhere loses nothing and doubles nothing:
- a launch is idempotent by its deterministic job name: re-running a decision after a crash
  finds the job already there and creates nothing;
- the rule state and the Kafka offset are committed together after the handler returns; a
  crash before that replays the input against the old state, which decides the same thing;
- a completion event is published before it is recorded, with an id derived from the job and
  the milestone: a replay publishes the *same* event again, which consumers dedupe on
  (source, id) — see `orchestrator/jobs/completion.py`.
- the promotion gate decides once per job: its decision is recorded with the job before the
  champion moves and before `finetune.completed` carries it, so a replay moves the champion
  to the same adapter (a no-op) and announces the same decision.

Promotion (a rule with `promote:`, docs/rules.md): a launch asks the `ChampionStore` for the
champion of the rule and key and hands it to the trainer, which scores both adapters on the
same held-out split; when the job succeeds, `orchestrator/jobs/promotion.py` judges the
scores, the champion moves only if it promotes, and a `promote` or `decline` record goes to
the audit topic, where `tuneloop explain` shows it.

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
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol, TypeVar

import structlog

from orchestrator import signals
from orchestrator.clock import Clock
from orchestrator.errors import JobRejectedError, TransientBackendError
from orchestrator.events import CloudEvent
from orchestrator.jobs import promotion
from orchestrator.jobs.completion import CompletionPublisher, CompletionRecord, CompletionStore
from orchestrator.jobs.model import JobContext, JobPhase, JobRef, Observation, TrainingRequest
from orchestrator.jobs.tracking import Milestone, next_transition
from orchestrator.ledger import DecisionRecord, Outcome, Reason, to_cloudevent
from orchestrator.ports import ChampionStore, EventPublisher, TrainingBackend
from orchestrator.rules import engine, why_not
from orchestrator.rules.engine import JobFinished, KeyState, RuleSet
from orchestrator.sweeps import announcing, driving, suggesting
from orchestrator.sweeps.state import SweepStatus, TrialState
from orchestrator.sweeps.tracking import SweepTracker
from orchestrator.vocabulary.output import EventType

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
        champions: ChampionStore | None = None,
        suggesters: suggesting.Suggesters = suggesting.PURE,
        sweep_tracker: SweepTracker | None = None,
    ) -> None:
        """*champions* is where each rule and key's champion adapter is; without one, jobs
        of rules with `promote:` are judged as if there were never a champion, and nothing
        is remembered (tests and tools only: the worker always has one). *suggesters* choose
        the trials of sweeps, by algorithm (the composition root adds TPE). *sweep_tracker*
        records each sweep as a whole (MLflow's parent run of its trials), when tracking is
        configured."""
        self._rules = rules
        self._backend = backend
        self._publisher = publisher
        self._states = states
        self._completions_store = completions
        self._completions = CompletionPublisher(
            store=completions, publisher=publisher, clock=clock, topic=output_topic
        )
        self._champions = champions
        self._suggesters = suggesters
        self._sweep_tracker = sweep_tracker
        self._output_topic = output_topic
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
        self._why_not, written = engine.why_not_written(
            self._rules, self._why_not, event, now=self._clock.now()
        )
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
            return await self.handle_tick(key, at=signal.at)
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

    async def handle_tick(
        self, key: str, *, at: datetime | None = None
    ) -> tuple[DecisionRecord, ...]:
        """Timers of *key* may be due; *at* is when the tick was sent (a sweep's budget is
        judged at that time, so a replayed tick decides as the first one did)."""
        now = self._clock.now()
        state, records = engine.tick(self._rules, self._states.load(key), key=key, now=now)
        step = None
        if state.sweeps:
            step = driving.tick(state.sweeps, now=at or now, suggesters=self._suggesters)
        return await self._commit(key, state, records, step)

    async def handle_observation(
        self, key: str, observation: Observation
    ) -> tuple[DecisionRecord, ...]:
        """Announce the job's milestone (once) and, when it finished, tell the engine; a job
        that succeeded is judged by the promotion gate first, when its rule asks for it. A
        sweep's trial is its sweep's business instead (`_observe_trial`)."""
        state = self._states.load(key)
        if state is not None and driving.owns(state.sweeps, observation.job.name):
            return await self._observe_trial(key, state, observation)
        if observation.phase is JobPhase.SUCCEEDED:
            await self._judge(observation)
        published = await self._completions.handle(observation)
        if not observation.phase.is_final:
            return ()
        record = await self._completions_store.load(observation.job.name)
        completed = any(event.type == EventType.FINETUNE_COMPLETED for event in published)
        judged = _promotion_record(record, observation) if completed else None
        if judged is not None:
            await self._audit(judged)
        rule = record.context.rule if record is not None and record.context else None
        if not rule:
            return (judged,) if judged is not None else ()
        finished = JobFinished(
            rule=rule,
            key=key,
            job_name=observation.job.name,
            succeeded=observation.phase is JobPhase.SUCCEEDED,
            at=observation.at,
        )
        finishing = await self._finish(key, finished)
        return (judged, *finishing) if judged is not None else finishing

    async def _judge(self, observation: Observation) -> None:
        """Apply the promotion gate to a job that succeeded, before it is announced: decide
        once (the decision is recorded with the job), then move the champion if it promotes.

        Replayed (a crash after the decision, before the announcement), the recorded decision
        stands, and promoting the same adapter again changes nothing.
        """
        job = observation.job.name
        record = await self._completions_store.load(job)
        context = record.context if record is not None else None
        if (
            record is None
            or context is None
            or context.promotion is None
            or Milestone.COMPLETED in record.announced
            or next_transition(record.phase, observation.phase) is None
        ):
            return
        decision = record.promotion
        if decision is None:
            current = await self._current_champion(context)
            result = observation.result
            decision = promotion.decide(
                context.promotion,
                adapter_uri=result.adapter_uri if result is not None else None,
                metrics=result.metrics if result is not None else {},
                evaluated_champion=context.champion_uri,
                current_champion=current,
            )
            await self._completions.record_promotion(job, decision)
            log.info(
                "promotion_decided",
                job=job,
                rule=context.rule,
                key=context.key,
                promoted=decision.promoted,
                verdict=decision.verdict.value,
                reason=decision.reason,
            )
        if decision.promoted and decision.candidate_uri and self._champions is not None:
            metrics = observation.result.metrics if observation.result is not None else {}
            await self._retrying(
                functools.partial(
                    self._champions.promote,
                    context.rule,
                    context.key,
                    decision.candidate_uri,
                    job,
                    promotion.scores(metrics),
                ),
                "champion_promote_retry",
                job=job,
            )

    async def _current_champion(self, context: JobContext) -> str | None:
        if self._champions is None:
            return None
        return await self._retrying(
            functools.partial(self._champions.current, context.rule, context.key),
            "champion_lookup_retry",
            job=context.job,
        )

    async def _finish(self, key: str, finished: JobFinished) -> tuple[DecisionRecord, ...]:
        state, records = engine.observe(
            self._rules, self._states.load(key), finished, key=key, now=self._clock.now()
        )
        return await self._commit(key, state, records)

    # --- carrying out decisions ---------------------------------------------------------

    async def _commit(
        self,
        key: str,
        state: KeyState,
        records: tuple[DecisionRecord, ...],
        step: driving.Step | None = None,
    ) -> tuple[DecisionRecord, ...]:
        """Carry out *records* (and what the key's sweeps decided, *step*), then keep
        *state*. A job the backend refused for good counts as finished at once, so that
        `concurrency: forbid` does not wait for it forever; so does a sweep that ended."""
        rejected: list[JobFinished] = []
        for record in records:
            await self._audit(record)
            spec = engine.sweep_of(self._rules, record)
            if spec is not None and record.job is not None:
                started = driving.start(
                    step.sweeps if step is not None else state.sweeps,
                    spec,
                    record.job,
                    now=self._clock.now(),
                    suggesters=self._suggesters,
                )
                step = started if step is None else driving.merge(step, started)
            elif record.outcome is Outcome.CANCEL and record.job_name:
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
        if step is not None:
            state, ended = await self._sweep(key, state, step)
            rejected += ended
            records = (*records, *step.records)
        self._states.save(key, state)
        for finished in rejected:
            records = (*records, *await self._finish(key, finished))
        return records

    async def _audit(self, record: DecisionRecord) -> None:
        await self._publisher.publish(to_cloudevent(record), topic=self._audit_topic)

    async def _launch(self, request: TrainingRequest, *, announce: bool = True) -> bool:
        """Launch *request*, retrying while the backend is unavailable; False if refused.

        Raises:
            JobRejectedError: refused, and *announce* is False (a sweep's trial: its sweep
                counts it as failed instead of announcing `finetune.failed`).
        """
        request = await self._with_champion(request)
        await self._completions.record_launch(request)
        if self._rules.limits.max_concurrent_jobs is None:
            return await self._launch_now(request, announce=announce)
        async with self._slots:
            await self._wait_for_a_slot(request)
            return await self._launch_now(request, announce=announce)

    async def _with_champion(self, request: TrainingRequest) -> TrainingRequest:
        """*request* with the champion its adapter will be compared with, for a rule with
        `promote:`. A replayed launch keeps the champion its first attempt recorded, so the
        job the backend finds again is judged against the adapter it was given."""
        if request.promotion is None:
            return request
        known = await self._completions_store.load(request.name)
        if known is not None and known.context is not None:
            return replace(request, champion_uri=known.context.champion_uri)
        context = JobContext.from_request(request)
        return replace(request, champion_uri=await self._current_champion(context))

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

    async def _launch_now(self, request: TrainingRequest, *, announce: bool) -> bool:
        try:
            job = await self._retrying(
                functools.partial(self._backend.launch, request),
                "job_launch_retry",
                job=request.name,
            )
        except JobRejectedError as exc:
            log.error("job_rejected", job=request.name, reason=exc.reason, error=str(exc))
            if not announce:
                raise
            await self._completions.announce_rejection(request, exc, backend="")
            return False
        log.info("job_launched", job=job.name, rule=request.rule, key=request.key)
        return True

    # --- sweeps (orchestrator/sweeps/: the decisions; here: carrying them out) ----------

    async def _observe_trial(
        self, key: str, state: KeyState, observation: Observation
    ) -> tuple[DecisionRecord, ...]:
        """A trial's job made progress or ended: its sweep decides what follows. Its phases
        are recorded without `finetune.*` events, except a completed trial's, which waits
        for its sweep to end (the best one's `finetune.completed` goes out then)."""
        step = driving.observe(state.sweeps, observation, suggesters=self._suggesters)
        sweep = driving.sweep_with(step.sweeps, observation.job.name)
        trial = sweep.trial_of(observation.job.name) if sweep is not None else None
        candidate = (
            trial is not None
            and trial.state is TrialState.COMPLETED
            and (sweep is None or sweep.end is None or sweep.end.best == trial.index)
        )
        if not (observation.phase.is_final and candidate):
            await self._completions.handle(observation, publish=False)
        if not step.changed:
            return ()
        return await self._commit(key, state, (), step)

    async def _sweep(
        self, key: str, state: KeyState, step: driving.Step
    ) -> tuple[KeyState, list[JobFinished]]:
        """Carry out *step*: audit, cancel, launch trials (a trial the backend refuses fails,
        which may start another), announce the sweeps that ended. Returns the key's state
        with its sweeps, and the ended sweeps as finished jobs of their rules."""
        ended: list[JobFinished] = []
        while True:
            for record in step.records:
                await self._audit(record)
            for job in step.cancels:
                log.info("trial_cancel", job=job, key=key)
                await self._retrying(
                    functools.partial(self._backend.cancel, JobRef(name=job, backend="")),
                    "job_cancel_retry",
                    job=job,
                )
            await self._track_sweeps_of(step)
            refused: list[tuple[TrainingRequest, JobRejectedError]] = []
            for request in step.launches:
                try:
                    await self._launch(request, announce=False)
                except JobRejectedError as exc:
                    refused.append((request, exc))
            for done in step.finished:
                ended.append(await self._conclude(key, done))
            if not refused:
                break
            sweeps = step.sweeps
            step = driving.Step(sweeps=sweeps)
            for request, refusal in refused:
                more = driving.rejected(
                    step.sweeps,
                    request,
                    reason=f"{refusal.reason}: {refusal}",
                    at=self._clock.now(),
                    suggesters=self._suggesters,
                )
                step = driving.merge(step, more)
        return engine.with_sweeps(self._rules, state, step.sweeps, now=self._clock.now()), ended

    async def _track_sweeps_of(self, step: driving.Step) -> None:
        """Tell the sweep tracker about the sweeps *step* launches trials of, before they
        launch: a trial's run finds its sweep's record when it starts."""
        if self._sweep_tracker is None:
            return
        names = dict.fromkeys(
            sweep.name
            for request in step.launches
            if (sweep := driving.sweep_with(step.sweeps, request.name)) is not None
        )
        for name in names:
            await self._sweep_tracker.started(step.sweeps[name])

    async def _conclude(self, key: str, done: driving.Finished) -> JobFinished:
        """A sweep ended: its best trial goes through the promotion gate and is announced
        (`finetune.completed`), the other completed trials are recorded quietly, and the
        sweep's one result goes out. Replayed after a crash, the gate's recorded decision
        stands and every event has the id it had."""
        sweep, best = done.sweep, done.best
        assert sweep.end is not None
        for trial in sweep.trials:
            if trial.state is TrialState.COMPLETED and trial.index != sweep.end.best:
                quiet = driving.success_of(trial)
                await self._completions.handle(quiet, publish=False)
        decision = None
        if best is not None:
            await self._judge(best)
            published = await self._completions.handle(best)
            record = await self._completions_store.load(best.job.name)
            decision = record.promotion if record is not None else None
            judged = _promotion_record(record, best) if published else None
            if judged is not None:
                await self._audit(judged)
        event = announcing.sweep_completed(sweep, promotion=decision)
        await self._publisher.publish(event, topic=self._output_topic)
        if self._sweep_tracker is not None:
            await self._sweep_tracker.ended(sweep)
        log.info(
            "sweep_ended",
            sweep=sweep.name,
            key=key,
            status=sweep.end.status.value,
            reason=sweep.end.reason.value,
            best=best.job.name if best is not None else None,
            promoted=decision.promoted if decision is not None else None,
        )
        return JobFinished(
            rule=sweep.base.rule,
            key=key,
            job_name=sweep.name,
            succeeded=sweep.end.status is SweepStatus.SUCCEEDED,
            at=sweep.end.at,
        )

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


def _promotion_record(
    record: CompletionRecord | None, observation: Observation
) -> DecisionRecord | None:
    """The audit record of the gate's decision about a job that succeeded: `promote` or
    `decline`, about the events that caused the job, so `tuneloop explain --event` follows an
    event to whether its adapter became the champion."""
    if record is None or record.context is None or record.promotion is None:
        return None
    context, decision = record.context, record.promotion
    return DecisionRecord(
        outcome=Outcome.PROMOTE if decision.promoted else Outcome.DECLINE,
        reason=Reason(decision.verdict.value),
        rule=context.rule,
        rule_version=context.rule_version,
        key=context.key,
        time=observation.at,
        event_ids=context.causing_event_ids,
        message=decision.reason,
        job_name=context.job,
        trace=context.trace,
    )

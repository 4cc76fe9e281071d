"""`HandoffService`: promoted adapters in, vLLM calls and `adapter.*` events out.

The hand-off consumer (`handlers/handoff/consumer.py`) calls `accept` for each event of
the completion topic and commits the record once it returns; everything else happens in one
asyncio task per serving target, so a target that is down delays nothing but itself.

- `accept` decides with the pure core (`orchestrator/handoff/`): which version the event
  asks for, which targets it goes to, whether a target was asked before (the ledger). It
  publishes the `handoff_failed` of a version no server can read, writes the changed slots
  to the ledger topic, and wakes the targets that have work. When it returns, the request
  is durable: a restart finds it in the ledger, not in the completion topic.
- A target's task makes the calls of `steps.steps_for` for each pending slot, through
  `VllmClient`. It is the one place that retries: a target that does not answer is tried
  again after `RetryPolicy.delay`, for as long as it takes, with one `handoff_failed`
  (`will_retry: true`) after `report_after` tries; a refusal is rolled back, published and
  recorded. A served version is published, then recorded: killed between the two, the
  restarted hand-off repeats the calls (each is harmless twice) and publishes the same event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import structlog

from handlers.handoff.ledger_topic import KafkaLedger
from handlers.handoff.vllm import VllmClient
from handlers.publishing import KafkaEventPublisher
from orchestrator.clock import Clock
from orchestrator.errors import TransientBackendError
from orchestrator.events import CloudEvent
from orchestrator.handoff import announcing, ledger, steps, versions
from orchestrator.handoff.errors import AdapterRejectedError, FailureReason, TargetUnavailableError
from orchestrator.handoff.ledger import Outcome, Slot, SlotKey
from orchestrator.handoff.steps import Action, RetryPolicy, Step
from orchestrator.handoff.versions import Skipped, Version
from orchestrator.settings import HandoffSettings

log = structlog.get_logger("tuneloop.handoff")


@dataclass(frozen=True, slots=True)
class _Attempt:
    """How one pass over a slot's calls ended (a target that did not answer raises)."""

    refused: Step | None = None
    message: str = ""
    smoke_text: str = ""


class HandoffService:
    """The hand-off's state (the ledger) and its per-target tasks."""

    def __init__(
        self,
        settings: HandoffSettings,
        *,
        ledger_topic: KafkaLedger,
        publisher: KafkaEventPublisher,
        http: httpx.AsyncClient,
        clock: Clock,
        topic_out: str,
    ) -> None:
        self._settings = settings
        self._ledger_topic = ledger_topic
        self._publisher = publisher
        self._http = http
        self._clock = clock
        self._topic_out = topic_out
        self._policy = RetryPolicy(
            first_delay=settings.retry_first_delay,
            max_delay=settings.retry_max_delay,
            report_after=settings.retry_report_after,
        )
        self._ledger: dict[SlotKey, Slot] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def ledger(self) -> Mapping[SlotKey, Slot]:
        """The ledger as this process knows it (a read-only view)."""
        return self._ledger

    async def start(self) -> None:
        """Read the ledger and resume every target that still has work.

        Raises:
            TransientBackendError: Kafka did not answer.
        """
        await self._ledger_topic.ensure_topic()
        self._ledger = await self._ledger_topic.load()
        targets = sorted({key.target for key in self._ledger})
        resumed = [target for target in targets if ledger.pending(self._ledger, target)]
        log.info("handoff_started", slots=len(self._ledger), resumed=resumed)
        for target in resumed:
            self._wake(target)

    async def stop(self) -> None:
        """Cancel the targets' tasks (a call in flight is repeated after a restart)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def accept(self, event: CloudEvent) -> None:
        """Take one event of the completion topic; return once what it asks is durable.

        Raises:
            TransientBackendError: Kafka did not acknowledge; call again with the same event.
        """
        found = versions.version_of(event, paths=self._settings.paths)
        if isinstance(found, Skipped):
            if found.reason is not versions.SkipReason.NOT_A_COMPLETION:
                log.info(
                    "handoff_skipped", event_id=event.id, reason=found.reason, detail=found.detail
                )
            return
        targets = versions.targets_for(self._settings.targets, found.model)
        if not targets:
            log.info(
                "handoff_skipped",
                event_id=event.id,
                reason=versions.SkipReason.NO_TARGETS,
                model=found.model,
            )
            return
        intake = ledger.accept(self._ledger, found, targets)
        for key in intake.keys(Outcome.REFUSED):
            refused = intake.changed[key]
            await self._publish_failure(
                found,
                key,
                reason=refused.reason or FailureReason.ADAPTER_NOT_REACHABLE,
                message=refused.message,
                will_retry=False,
                attempts=0,
                step=None,
                still_served=refused.served,
            )
        await self._ledger_topic.put(intake.changed)
        self._ledger.update(intake.changed)
        for key in intake.keys(Outcome.DUPLICATE):
            log.info("handoff_duplicate", lora_name=found.lora_name, target=key.target)
        for key in intake.keys(Outcome.PENDING):
            log.info("handoff_accepted", lora_name=found.lora_name, target=key.target)
            self._wake(key.target)

    def _wake(self, target: str) -> None:
        self._wakeups.setdefault(target, asyncio.Event()).set()
        task = self._tasks.get(target)
        if task is None or task.done():
            self._tasks[target] = asyncio.create_task(
                self._serve_target(target), name=f"handoff {target}"
            )

    async def _serve_target(self, target: str) -> None:
        client = VllmClient(target, http=self._http, api_key=self._settings.api_key)
        wakeup = self._wakeups[target]
        while True:
            wakeup.clear()
            try:
                for key in ledger.pending(self._ledger, target):
                    await self._serve_slot(client, key)
            except Exception:
                # A bug must not end the target's task for good: say so, and start over.
                log.exception("handoff_target_error", target=target)
                await asyncio.sleep(self._policy.max_delay)
                continue
            if not ledger.pending(self._ledger, target):
                await wakeup.wait()

    async def _serve_slot(self, client: VllmClient, key: SlotKey) -> None:
        failures = 0
        trying: str | None = None
        while True:
            slot = self._ledger[key]
            version = slot.desired
            calls = steps.steps_for(slot)
            if version is None or not calls:
                return
            if version.lora_name != trying:
                # A newer version arrived meanwhile: its tries, and its report, are its own.
                trying, failures = version.lora_name, 0
            try:
                attempt = await self._attempt(client, calls, version)
                if attempt.refused is None:
                    await self._served(key, version, slot, attempt.smoke_text)
                else:
                    await self._refused(client, key, version, attempt)
            except (TargetUnavailableError, TransientBackendError) as exc:
                failures += 1
                log.warning(
                    "handoff_retrying",
                    lora_name=version.lora_name,
                    target=key.target,
                    attempts=failures,
                    error=str(exc),
                )
                if self._policy.reports(failures):
                    with contextlib.suppress(TransientBackendError):
                        await self._publish_failure(
                            version,
                            key,
                            reason=FailureReason.TARGET_UNAVAILABLE,
                            message=str(exc),
                            will_retry=True,
                            attempts=failures,
                            step=None,
                            still_served=slot.served,
                        )
                await asyncio.sleep(self._policy.delay(failures))

    async def _attempt(
        self, client: VllmClient, calls: tuple[Step, ...], version: Version
    ) -> _Attempt:
        smoke_text = ""
        for call in calls:
            try:
                if call.action is Action.LOAD:
                    await client.load_adapter(call.lora_name, call.lora_path or "")
                elif call.action is Action.CHECK:
                    listed = {model.id: model.root for model in await client.models()}
                    problem = steps.listing_problem(listed, call)
                    if problem is not None:
                        return _Attempt(refused=call, message=problem)
                elif call.action is Action.SMOKE:
                    smoke_text = await client.complete(
                        call.lora_name,
                        self._settings.smoke_prompt,
                        max_tokens=self._settings.smoke_max_tokens,
                    )
                else:
                    await client.unload_adapter(call.lora_name)
            except AdapterRejectedError as exc:
                if steps.served_anyway(call):
                    log.warning(
                        "handoff_unload_refused",
                        lora_name=call.lora_name,
                        target=client.base_url,
                        error=str(exc),
                    )
                    continue
                return _Attempt(refused=call, message=str(exc))
            log.info(
                "handoff_step_done",
                action=call.action,
                lora_name=call.lora_name,
                target=client.base_url,
                version=version.lora_name,
            )
        return _Attempt(smoke_text=smoke_text)

    async def _served(self, key: SlotKey, version: Version, slot: Slot, smoke_text: str) -> None:
        await self._publisher.publish(
            announcing.adapter_served(
                version,
                target=key.target,
                replaced=slot.served if slot.served != version.lora_name else None,
                smoke_text=smoke_text,
                at=self._clock.now(),
            ),
            topic=self._topic_out,
        )
        changed = {key: ledger.loaded(self._ledger[key], version)}
        await self._ledger_topic.put(changed)
        self._ledger.update(changed)
        log.info("handoff_served", lora_name=version.lora_name, target=key.target)

    async def _refused(
        self, client: VllmClient, key: SlotKey, version: Version, attempt: _Attempt
    ) -> None:
        assert attempt.refused is not None
        for undo in steps.rollback_for(attempt.refused, version):
            try:
                await client.unload_adapter(undo.lora_name)
            except (TargetUnavailableError, AdapterRejectedError) as exc:
                log.warning(
                    "handoff_rollback_failed",
                    lora_name=undo.lora_name,
                    target=key.target,
                    error=str(exc),
                )
        reason = steps.reason_for(attempt.refused)
        slot = self._ledger[key]
        await self._publish_failure(
            version,
            key,
            reason=reason,
            message=attempt.message,
            will_retry=False,
            attempts=1,
            step=attempt.refused.action,
            still_served=slot.served,
        )
        changed = {key: ledger.rejected(slot, version, reason=reason, message=attempt.message)}
        await self._ledger_topic.put(changed)
        self._ledger.update(changed)
        log.warning(
            "handoff_refused",
            lora_name=version.lora_name,
            target=key.target,
            reason=reason,
            message=attempt.message,
        )

    async def _publish_failure(
        self,
        version: Version,
        key: SlotKey,
        *,
        reason: FailureReason,
        message: str,
        will_retry: bool,
        attempts: int,
        step: Action | None,
        still_served: str | None,
    ) -> None:
        await self._publisher.publish(
            announcing.handoff_failed(
                version,
                target=key.target,
                reason=reason,
                message=message,
                will_retry=will_retry,
                attempts=attempts,
                step=step,
                still_served=still_served,
                at=self._clock.now(),
            ),
            topic=self._topic_out,
        )

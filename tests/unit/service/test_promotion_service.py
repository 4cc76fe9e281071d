"""The service applies the promotion gate: the champion goes to the trainer, moves only on
promotion, and `finetune.completed` and the audit topic say what was decided, once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator import signals
from orchestrator.clock import FixedClock
from orchestrator.errors import TransientBackendError
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation
from orchestrator.ledger import DECISION_EVENT_TYPE, Outcome, Reason, from_cloudevent
from orchestrator.rules.parsing import Source, parse_files
from orchestrator.rules.state import KeyState
from orchestrator.service import Orchestrator, RetryPolicy
from orchestrator.testing import (
    InMemoryBackend,
    InMemoryChampionStore,
    InMemoryCompletionStore,
    RecordingPublisher,
)
from orchestrator.vocabulary.registry import SchemaRegistry

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
COMPLETED = "io.tuneloop.finetune.completed.v1"

RULES = """
rules:
  - name: drift-retrain
    on: {{type: io.tuneloop.drift.detected.v1}}
    key: "event.data.model_id"
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "file:///data/${{ key }}.jsonl"
{promote}
"""
GATED = RULES.format(promote="      promote: {metric: eval_loss, min_delta: 0.01}")
UNGATED = RULES.format(promote="")


class DictStates:
    def __init__(self) -> None:
        self.states: dict[str, KeyState] = {}

    def load(self, key: str) -> KeyState | None:
        return self.states.get(key)

    def save(self, key: str, state: KeyState) -> None:
        self.states[key] = state


def drift(n: int) -> CloudEvent:
    return CloudEvent(
        id=f"d{n}",
        source="/monitors/x",
        type="io.tuneloop.drift.detected.v1",
        time=T0 + timedelta(minutes=n),
        datacontenttype="application/json",
        data={"model_id": "m1", "metric": "psi", "value": 0.3, "threshold": 0.2},
    )


class World:
    def __init__(self, rules_text: str = GATED) -> None:
        self.clock = FixedClock(T0 + timedelta(hours=1))
        self.rules = parse_files([Source("rules.yaml", rules_text)])
        self.backend = InMemoryBackend(self.clock)
        self.publisher = RecordingPublisher()
        self.states = DictStates()
        self.completions = InMemoryCompletionStore()
        self.champions = InMemoryChampionStore()
        self.sleeps: list[float] = []

    def orchestrator(self) -> Orchestrator:
        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        return Orchestrator(
            rules=self.rules,
            backend=self.backend,
            publisher=self.publisher,
            states=self.states,
            completions=self.completions,
            champions=self.champions,
            clock=self.clock,
            audit_topic="audit",
            output_topic="out",
            retry=RetryPolicy(initial_delay=0.1),
            sleep=sleep,
        )

    def completed(self) -> list[CloudEvent]:
        return [e for e in self.publisher.events if e.type == COMPLETED]

    def audited(self, *outcomes: Outcome):
        records = [
            from_cloudevent(e) for e in self.publisher.events if e.type == DECISION_EVENT_TYPE
        ]
        return [r for r in records if r.outcome in outcomes]

    def champion(self) -> str | None:
        found = self.champions.champions.get(("drift-retrain", "m1"))
        return found.adapter_uri if found is not None else None


async def launch(orch: Orchestrator, n: int) -> str:
    """Send drift event *n*, which launches a job; its name."""
    (key,) = await orch.keys_for(drift(n))
    records = await orch.handle(key, drift(n))
    (launched,) = [r for r in records if r.outcome is Outcome.LAUNCH]
    assert launched.job_name is not None
    return launched.job_name


async def succeed(orch: Orchestrator, job: str, adapter: str | None, **metrics: object) -> None:
    observation = Observation(
        job=JobRef(name=job, backend="in-memory"),
        phase=JobPhase.SUCCEEDED,
        at=T0 + timedelta(hours=2),
        result=JobResult(adapter_uri=adapter, metrics=metrics),
    )
    await orch.handle("m1", signals.observation_event(observation, key="m1"))


async def test_the_first_adapter_of_a_key_is_promoted_and_announced_so():
    world = World()
    orch = world.orchestrator()
    job = await launch(orch, 1)
    assert world.backend.request_of(job).champion_uri is None

    await succeed(orch, job, "s3://a/ft-1", eval_loss=1.5, perplexity=4.48, token_accuracy=0.4)

    (completed,) = world.completed()
    SchemaRegistry.builtin().validate(completed)
    assert completed.data["promoted"] is True
    assert completed.data["adapter_uri"] == "s3://a/ft-1"
    assert completed.data["promotion"] == {
        "metric": "eval_loss",
        "mode": "min",
        "min_delta": 0.01,
        "candidate": 1.5,
        "champion": None,
        "champion_uri": None,
        "candidate_uri": "s3://a/ft-1",
        "verdict": "no-champion",
        "reason": "no champion yet: the first adapter is promoted (eval_loss 1.5)",
    }
    assert world.champion() == "s3://a/ft-1"
    kept = world.champions.champions[("drift-retrain", "m1")]
    assert kept.job_name == job
    assert dict(kept.scores) == {"eval_loss": 1.5, "perplexity": 4.48, "token_accuracy": 0.4}
    (promoted,) = world.audited(Outcome.PROMOTE, Outcome.DECLINE)
    assert promoted.outcome is Outcome.PROMOTE
    assert promoted.reason is Reason.NO_CHAMPION
    assert promoted.job_name == job
    assert promoted.event_ids == ("d1",), "the record is about the events that caused the job"


async def test_a_worse_candidate_is_compared_with_the_champion_and_declined():
    world = World()
    orch = world.orchestrator()
    first = await launch(orch, 1)
    await succeed(orch, first, "s3://a/ft-1", eval_loss=1.5)
    second = await launch(orch, 2)
    assert world.backend.request_of(second).champion_uri == "s3://a/ft-1"

    await succeed(orch, second, "s3://a/ft-2", eval_loss=1.8, champion_eval_loss=1.5)

    declined = world.completed()[-1]
    SchemaRegistry.builtin().validate(declined)
    assert declined.data["promoted"] is False
    assert declined.data["adapter_uri"] == "s3://a/ft-2", "the adapter is still announced"
    assert declined.data["promotion"]["candidate"] == 1.8
    assert declined.data["promotion"]["champion"] == 1.5
    assert declined.data["promotion"]["champion_uri"] == "s3://a/ft-1"
    assert declined.data["promotion"]["verdict"] == "not-better"
    assert world.champion() == "s3://a/ft-1"
    assert world.champions.promotions == 1
    record = world.audited(Outcome.DECLINE)[0]
    assert record.reason is Reason.NOT_BETTER
    assert record.message == "eval_loss 1.8 against the champion's 1.5: worse"


async def test_a_better_candidate_takes_the_champions_place():
    world = World()
    orch = world.orchestrator()
    first = await launch(orch, 1)
    await succeed(orch, first, "s3://a/ft-1", eval_loss=1.5)
    second = await launch(orch, 2)

    await succeed(orch, second, "s3://a/ft-2", eval_loss=1.2, champion_eval_loss=1.5)

    assert world.completed()[-1].data["promoted"] is True
    assert world.champion() == "s3://a/ft-2"
    assert world.audited(Outcome.PROMOTE)[-1].reason is Reason.BETTER


async def test_a_champion_moved_while_the_job_ran_voids_its_comparison():
    world = World()
    orch = world.orchestrator()
    first = await launch(orch, 1)
    await succeed(orch, first, "s3://a/ft-1", eval_loss=1.5)
    second = await launch(orch, 2)
    await world.champions.promote("drift-retrain", "m1", "s3://elsewhere/x", "manual", {})

    await succeed(orch, second, "s3://a/ft-2", eval_loss=0.1, champion_eval_loss=1.5)

    assert world.completed()[-1].data["promotion"]["verdict"] == "champion-changed"
    assert world.champion() == "s3://elsewhere/x"


async def test_a_completion_replayed_after_a_crash_announces_the_decision_it_first_made():
    world = World()
    orch = world.orchestrator()
    job = await launch(orch, 1)
    world.publisher.fail_next(ConnectionError("the broker went away"))
    with pytest.raises(ConnectionError):
        await succeed(orch, job, "s3://a/ft-1", eval_loss=1.5)
    # The decision was recorded and the champion moved before the publish failed.
    assert world.champion() == "s3://a/ft-1"

    restarted = world.orchestrator()
    await succeed(restarted, job, "s3://a/ft-1", eval_loss=1.5)
    await succeed(restarted, job, "s3://a/ft-1", eval_loss=1.5)

    (completed,) = world.completed()
    assert completed.data["promoted"] is True
    assert completed.data["promotion"]["verdict"] == "no-champion", "not a tie with itself"
    assert world.champion() == "s3://a/ft-1"
    assert len(world.audited(Outcome.PROMOTE)) == 1


async def test_a_replayed_launch_keeps_the_champion_its_first_attempt_recorded():
    world = World()
    orch = world.orchestrator()
    first = await launch(orch, 1)
    await succeed(orch, first, "s3://a/ft-1", eval_loss=1.5)
    before = dict(world.states.states)
    second = await launch(orch, 2)
    await world.champions.promote("drift-retrain", "m1", "s3://elsewhere/x", "manual", {})

    world.states.states = before  # the state write was lost: the launch replays
    assert await launch(world.orchestrator(), 2) == second

    context = world.completions.records[second].context
    assert context is not None
    assert context.champion_uri == "s3://a/ft-1"


async def test_an_unreachable_champion_store_is_asked_again_until_it_answers():
    world = World()
    orch = world.orchestrator()
    world.champions.fail_next(TransientBackendError("mlflow is down", delay=2.0))

    job = await launch(orch, 1)

    assert world.sleeps == [2.0]
    assert world.backend.request_of(job).champion_uri is None


async def test_a_rule_without_promote_announces_no_promotion_and_keeps_no_champion():
    world = World(UNGATED)
    orch = world.orchestrator()
    world.champions.fail_next(AssertionError("a rule without promote never asks"))
    job = await launch(orch, 1)

    await succeed(orch, job, "s3://a/ft-1", eval_loss=1.5)

    (completed,) = world.completed()
    assert "promoted" not in completed.data
    assert "promotion" not in completed.data
    assert world.champions.champions == {}
    assert world.audited(Outcome.PROMOTE, Outcome.DECLINE) == []


async def test_a_failed_job_is_never_judged_and_leaves_the_champion():
    world = World()
    orch = world.orchestrator()
    first = await launch(orch, 1)
    await succeed(orch, first, "s3://a/ft-1", eval_loss=1.5)
    second = await launch(orch, 2)
    failed = Observation(
        job=JobRef(name=second, backend="in-memory"),
        phase=JobPhase.FAILED,
        at=T0 + timedelta(hours=3),
        reason="StorageError",
        message="the upload failed halfway: no manifest was written",
    )
    await orch.handle("m1", signals.observation_event(failed, key="m1"))

    assert world.champion() == "s3://a/ft-1"
    assert world.champions.promotions == 1
    assert len(world.audited(Outcome.PROMOTE, Outcome.DECLINE)) == 1

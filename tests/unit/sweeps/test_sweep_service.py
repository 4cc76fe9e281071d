"""The service runs a sweep: trials launched and cancelled through the backend, one result,
the best trial through the promotion gate, and nothing twice when inputs are replayed.

Stand-ins: the shipped in-memory backend, publisher and stores (`orchestrator.testing`); the
observations are written here by hand, as the backend would send them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orchestrator import signals
from orchestrator.clock import FixedClock
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
SWEEP_COMPLETED = "io.tuneloop.finetune.sweep.completed.v1"

RULES = """
rules:
  - name: sweep-on-drift
    on: {{type: io.tuneloop.drift.detected.v1}}
    key: "event.data.model_id"
    launch:
      runtime: {runtime}
      base_model: tiny
      dataset: "file:///data/${{ key }}.jsonl"
      promote: {{metric: eval_loss}}
      sweep:
        algorithm: grid
        parameters:
          training.learning_rate: {{values: [1.0e-3, 2.0e-3, 5.0e-4, 1.0e-9]}}
        parallel: 2
        early_stopping: {{median: {{min_trials: 2, start_step: 5}}}}
{extra}
"""


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
    def __init__(self, *, runtime: str = "local", extra: str = "") -> None:
        self.clock = FixedClock(T0 + timedelta(hours=1))
        self.rules = parse_files([Source("r.yaml", RULES.format(runtime=runtime, extra=extra))])
        self.backend = InMemoryBackend(self.clock, runtimes=frozenset({"local"}))
        self.publisher = RecordingPublisher()
        self.states = DictStates()
        self.completions = InMemoryCompletionStore()
        self.champions = InMemoryChampionStore()
        self.cancelled: list[str] = []
        cancel = self.backend.cancel

        async def recorded_cancel(job: JobRef) -> None:
            self.cancelled.append(job.name)
            await cancel(job)

        self.backend.cancel = recorded_cancel  # type: ignore[method-assign]

    def orchestrator(self) -> Orchestrator:
        async def sleep(seconds: float) -> None:
            return None

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

    def out(self, event_type: str) -> list[CloudEvent]:
        return [e for e in self.publisher.events if e.type == event_type]

    def audited(self, *outcomes: Outcome):
        records = [
            from_cloudevent(e) for e in self.publisher.events if e.type == DECISION_EVENT_TYPE
        ]
        return [r for r in records if r.outcome in outcomes]

    def trial(self, index: int) -> str:
        """The job of trial *index*, read from its launch record."""
        (record,) = [
            r
            for r in self.audited(Outcome.LAUNCH)
            if r.reason is Reason.TRIAL and r.message.startswith(f"trial {index} ")
        ]
        assert record.job_name is not None
        return record.job_name

    def rate(self, job: str) -> float:
        return self.backend.request_of(job).training.learning_rate


async def send(orch: Orchestrator, observation: Observation) -> None:
    await orch.handle("m1", signals.observation_event(observation, key="m1"))


def progress(job: str, step: int, loss: float, minutes: int = 90) -> Observation:
    return Observation(
        job=JobRef(name=job, backend="in-memory"),
        phase=JobPhase.RUNNING,
        at=T0 + timedelta(minutes=minutes),
        reason="Progress",
        progress={"step": step, "loss": loss, "total_steps": 20},
    )


def success(job: str, eval_loss: float, minutes: int = 100) -> Observation:
    return Observation(
        job=JobRef(name=job, backend="in-memory"),
        phase=JobPhase.SUCCEEDED,
        at=T0 + timedelta(minutes=minutes),
        result=JobResult(adapter_uri=f"s3://a/{job}", metrics={"eval_loss": eval_loss}),
    )


async def first_two_done(world: World, orch: Orchestrator) -> None:
    """The sweep starts; trials 0 and 1 report losses and complete (1.0 and 1.1)."""
    (key,) = await orch.keys_for(drift(1))
    await orch.handle(key, drift(1))
    await send(orch, progress(world.trial(0), 10, 2.0))
    await send(orch, progress(world.trial(1), 10, 2.2))
    await send(orch, success(world.trial(0), 1.0))
    await send(orch, success(world.trial(1), 1.1))


async def test_a_sweep_runs_its_trials_prunes_the_one_behind_and_promotes_the_best():
    world = World()
    orch = world.orchestrator()
    (key,) = await orch.keys_for(drift(1))
    records = await orch.handle(key, drift(1))

    (sweep_launch,) = [r for r in records if r.outcome is Outcome.LAUNCH and r.reason is None]
    sweep = sweep_launch.job_name
    assert world.backend.job_names == (world.trial(0), world.trial(1))
    assert [world.rate(job) for job in world.backend.job_names] == [1e-3, 2e-3]
    assert sweep not in world.backend.job_names, "the sweep itself is no job"

    await send(orch, progress(world.trial(0), 10, 2.0))
    await send(orch, progress(world.trial(1), 10, 2.2))
    await send(orch, success(world.trial(0), 1.0))
    await send(orch, success(world.trial(1), 1.1))
    assert [world.rate(world.trial(i)) for i in (2, 3)] == [5e-4, 1e-9]

    # Trial 3 (learning rate 1e-9) is behind the median (2.1) of the two completed at step 10.
    await send(orch, progress(world.trial(3), 10, 3.0))
    assert world.cancelled == [world.trial(3)]
    assert world.backend.phase_of(world.trial(3)) is JobPhase.FAILED
    await send(orch, progress(world.trial(2), 10, 1.9))
    await send(orch, success(world.trial(2), 0.8))

    (result,) = world.out(SWEEP_COMPLETED)
    SchemaRegistry.builtin().validate(result)
    assert result.id == f"{sweep}.sweep-completed"
    assert result.extensions["correlationid"] == sweep_launch.decision_id
    data = result.data
    assert (data["status"], data["reason"]) == ("succeeded", "max-trials")
    assert [(t["job"], t["state"], t["metric"]) for t in data["trials"]] == [
        (world.trial(0), "completed", 1.0),
        (world.trial(1), "completed", 1.1),
        (world.trial(2), "completed", 0.8),
        (world.trial(3), "pruned", None),
    ]
    assert data["trials"][3]["parameters"] == {"training.learning_rate": 1e-9}
    assert data["best"]["job"] == world.trial(2)
    assert data["best"]["adapter_uri"] == f"s3://a/{world.trial(2)}"
    assert data["promoted"] is True
    assert data["promotion"]["verdict"] == "no-champion"

    # Only the best trial is announced as a fine-tune, promoted; the champion is its adapter.
    (completed,) = world.out(COMPLETED)
    assert completed.data["job"] == world.trial(2)
    assert completed.data["promoted"] is True
    assert world.out("io.tuneloop.finetune.started.v1") == []
    assert world.out("io.tuneloop.finetune.failed.v1") == []
    champion = world.champions.champions[("sweep-on-drift", "m1")]
    assert champion.adapter_uri == f"s3://a/{world.trial(2)}"

    (pruned,) = world.audited(Outcome.CANCEL)
    assert pruned.reason is Reason.PRUNED
    assert pruned.event_ids == ("d1",), "every sweep record is about the events that caused it"
    (concluded,) = world.audited(Outcome.CONCLUDE)
    assert (concluded.reason, concluded.job_name) == (Reason.MAX_TRIALS, world.trial(2))

    # The cancelled trial's end, arriving late, announces nothing either.
    cancelled = world.backend.phase_of(world.trial(3))
    late = Observation(
        job=JobRef(name=world.trial(3), backend="in-memory"),
        phase=cancelled,
        at=T0 + timedelta(minutes=101),
        reason="Cancelled",
    )
    await send(orch, late)
    assert world.out("io.tuneloop.finetune.failed.v1") == []
    # The sweep was the rule's running job: ended, the rule launches again.
    records = await orch.handle(key, drift(2))
    assert any(r.outcome is Outcome.LAUNCH and r.reason is None for r in records)


async def test_while_its_sweep_runs_a_forbid_rule_does_not_start_another():
    world = World()
    orch = world.orchestrator()
    await first_two_done(world, orch)
    records = await orch.handle("m1", drift(2))
    assert [(r.outcome, r.reason) for r in records] == [(Outcome.SUPPRESS, Reason.CONCURRENCY)]
    assert len(world.backend.job_names) == 4


async def test_a_sweep_replayed_after_a_lost_state_write_launches_nothing_twice():
    world = World()
    orch = world.orchestrator()
    await first_two_done(world, orch)
    before = dict(world.states.states)
    await send(orch, success(world.trial(2), 0.8))
    await send(orch, success(world.trial(3), 0.9))
    launched = world.backend.job_names
    assert len(world.out(SWEEP_COMPLETED)) == 1

    # The worker died before its state writes were kept: the inputs come again to a new one.
    world.states.states = before
    restarted = world.orchestrator()
    await send(restarted, success(world.trial(2), 0.8))
    await send(restarted, success(world.trial(3), 0.9))

    assert world.backend.job_names == launched
    results = world.out(SWEEP_COMPLETED)
    assert len({e.id for e in results}) == 1, "the same result, by id, which consumers dedupe"
    assert results[0].data == results[-1].data
    assert len({e.id for e in world.out(COMPLETED)}) == 1
    assert world.champions.promotions == 1


async def test_trials_the_backend_refuses_fail_and_the_sweep_fails_without_finetune_events():
    world = World(runtime="elsewhere")
    orch = world.orchestrator()
    (key,) = await orch.keys_for(drift(1))
    await orch.handle(key, drift(1))

    assert world.backend.job_names == ()
    (result,) = world.out(SWEEP_COMPLETED)
    assert (result.data["status"], result.data["reason"]) == ("failed", "max-trials")
    assert [t["state"] for t in result.data["trials"]] == ["failed"] * 4
    assert result.data["trials"][0]["reason"].startswith("RuntimeNotFound: ")
    assert result.data["best"] is None
    assert "promoted" not in result.data
    assert world.out("io.tuneloop.finetune.failed.v1") == []


async def test_the_budget_cancels_the_running_trials_when_a_tick_finds_it_spent():
    world = World(extra="        budget: 30m")
    orch = world.orchestrator()
    (key,) = await orch.keys_for(drift(1))
    await orch.handle(key, drift(1))
    state = world.states.states[key]
    deadline = world.clock.now() + timedelta(minutes=30)
    assert orch.wakeup_of(key) == deadline

    tick = signals.Tick(key=key, at=deadline)
    await orch.handle(key, signals.tick_event(tick))

    assert sorted(world.cancelled) == sorted([world.trial(0), world.trial(1)])
    (result,) = world.out(SWEEP_COMPLETED)
    assert (result.data["status"], result.data["reason"]) == ("failed", "budget")
    assert [t["state"] for t in result.data["trials"]] == ["cancelled", "cancelled"]
    assert state.sweeps  # the state before the tick had it running

"""The use case on fakes: decisions are carried out once, whatever is replayed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator import signals
from orchestrator.clock import FixedClock
from orchestrator.errors import JobRejectedError, TransientBackendError
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobRef, JobResult, Observation
from orchestrator.ledger import DECISION_EVENT_TYPE, Outcome
from orchestrator.rules.parsing import Source, parse_files
from orchestrator.rules.state import KeyState
from orchestrator.service import Orchestrator, RetryPolicy
from orchestrator.testing import InMemoryBackend, InMemoryCompletionStore, RecordingPublisher

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)

RULES = """
runtimes: [torch-distributed]
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 2
    concurrency: forbid
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""


class DictStates:
    def __init__(self) -> None:
        self.states: dict[str, KeyState] = {}

    def load(self, key: str) -> KeyState | None:
        return self.states.get(key)

    def save(self, key: str, state: KeyState) -> None:
        self.states[key] = state


def drift(n: int, *, model: str = "m1", at: datetime = T0) -> CloudEvent:
    return CloudEvent(
        id=f"d{n}",
        source="/monitors/x",
        type="io.tuneloop.drift.detected.v1",
        time=at + timedelta(minutes=n),
        datacontenttype="application/json",
        data={"model_id": model, "metric": "psi", "value": 0.3, "threshold": 0.2},
    )


class World:
    def __init__(self, rules_text: str = RULES) -> None:
        self.clock = FixedClock(T0 + timedelta(hours=1))
        self.rules = parse_files([Source("rules.yaml", rules_text)])
        self.backend = InMemoryBackend(self.clock)
        self.publisher = RecordingPublisher()
        self.states = DictStates()
        self.completions = InMemoryCompletionStore()
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
            clock=self.clock,
            audit_topic="audit",
            output_topic="out",
            retry=RetryPolicy(initial_delay=0.1),
            sleep=sleep,
        )

    def published(self, type_: str) -> list[CloudEvent]:
        return [e for e in self.publisher.events if e.type == type_]


async def feed(orch: Orchestrator, event: CloudEvent) -> list[Outcome]:
    outcomes = []
    for key in await orch.keys_for(event):
        outcomes += [r.outcome for r in await orch.handle(key, event)]
    return outcomes


async def test_enough_events_launch_one_job_and_every_decision_is_audited():
    world = World()
    orch = world.orchestrator()

    assert await feed(orch, drift(1)) == [Outcome.ACCUMULATE]
    assert await feed(orch, drift(2)) == [Outcome.LAUNCH]

    assert world.backend.launch_calls == 1
    audited = world.published(DECISION_EVENT_TYPE)
    assert len(audited) == 2
    assert {p.topic for p in world.publisher.published} == {"audit"}


async def test_a_replayed_event_after_a_crash_launches_nothing_new():
    world = World()
    orch = world.orchestrator()
    await feed(orch, drift(1))
    await feed(orch, drift(2))

    restarted = world.orchestrator()  # same stores, as after a restart
    outcomes = await feed(restarted, drift(2))

    assert Outcome.LAUNCH not in outcomes
    assert len(world.backend.job_names) == 1


async def test_a_replayed_decision_against_old_state_reuses_the_same_job():
    world = World()
    orch = world.orchestrator()
    await feed(orch, drift(1))
    before = dict(world.states.states)
    await feed(orch, drift(2))

    world.states.states = before  # the state write was lost in the crash; the input replays
    assert await feed(world.orchestrator(), drift(2)) == [Outcome.LAUNCH]

    assert world.backend.launch_calls == 2
    assert len(world.backend.job_names) == 1


async def test_a_finished_job_is_announced_once_and_releases_forbid():
    world = World()
    orch = world.orchestrator()
    await feed(orch, drift(1))
    await feed(orch, drift(2))
    (job,) = world.backend.job_names
    assert await feed(orch, drift(3)) == [Outcome.ACCUMULATE]
    assert await feed(orch, drift(4)) == [Outcome.SUPPRESS]  # forbid: one job in flight

    ref = JobRef(name=job, backend="in-memory")
    observations = [
        Observation(job=ref, phase=JobPhase.PENDING, at=T0),
        Observation(job=ref, phase=JobPhase.RUNNING, at=T0),
        Observation(
            job=ref, phase=JobPhase.SUCCEEDED, at=T0, result=JobResult(adapter_uri="file:///a")
        ),
    ]
    for observation in observations * 2:  # the backend repeats itself after a re-list
        signal = signals.observation_event(observation, key="m1")
        await orch.handle("m1", signal)

    completed = world.published("io.tuneloop.finetune.completed.v1")
    started = world.published("io.tuneloop.finetune.started.v1")
    assert len(completed) == 1
    assert len(started) == 1
    assert completed[0].data["adapter_uri"] == "file:///a"
    # the window that was held back by `forbid` still qualifies: the next event launches
    assert await feed(orch, drift(5)) == [Outcome.LAUNCH]


async def test_a_launch_is_retried_while_the_backend_is_unavailable():
    world = World()
    orch = world.orchestrator()
    world.backend.fail_next_launch(TransientBackendError("api server down", delay=0.2))
    await feed(orch, drift(1))
    await feed(orch, drift(2))

    assert world.sleeps == [0.2]
    assert len(world.backend.job_names) == 1


async def test_a_launch_the_backend_keeps_refusing_waits_longer_each_time_and_never_gives_up():
    world = World()
    orch = world.orchestrator()
    for _ in range(4):
        world.backend.fail_next_launch(TransientBackendError("api server down", delay=0.05))
    await feed(orch, drift(1))
    assert await feed(orch, drift(2)) == [Outcome.LAUNCH]

    # the policy's 0.1 s doubles; the backend's shorter 0.05 s never shortens a wait
    assert world.sleeps == [0.1, 0.2, 0.4, 0.8]
    assert (world.backend.launch_calls, orch.retries) == (5, 4)


async def test_a_wait_the_backend_asks_for_is_kept_when_longer_than_the_policys():
    world = World()
    orch = world.orchestrator()
    world.backend.fail_next_launch(TransientBackendError("429", delay=3.0))
    await feed(orch, drift(1))
    await feed(orch, drift(2))

    assert world.sleeps == [3.0]


REPLACING = RULES.replace("concurrency: forbid", "concurrency: replace")


async def test_a_cancel_is_retried_while_the_backend_is_unavailable():
    world = World(REPLACING)
    orch = world.orchestrator()
    await feed(orch, drift(1))
    await feed(orch, drift(2))
    (first,) = world.backend.job_names
    world.backend.fail_next_cancel(TransientBackendError("api server down", delay=0.1))

    await feed(orch, drift(3))
    outcomes = await feed(orch, drift(4))  # a second window: the new job replaces the first

    assert Outcome.CANCEL in outcomes
    assert world.backend.phase_of(first) is JobPhase.FAILED
    assert world.sleeps == [0.1]


async def test_a_refused_launch_publishes_a_failure_and_frees_the_key():
    world = World()
    orch = world.orchestrator()
    world.backend.fail_next_launch(JobRejectedError("no such runtime", reason="RuntimeNotFound"))
    await feed(orch, drift(1))
    await feed(orch, drift(2))

    (failed,) = world.published("io.tuneloop.finetune.failed.v1")
    assert failed.data["reason"] == "RuntimeNotFound"
    await feed(orch, drift(3))
    assert await feed(orch, drift(4)) == [Outcome.LAUNCH]


async def test_internal_signal_types_are_recognised():
    tick = signals.tick_event(signals.Tick(key="m1", at=T0))
    assert signals.is_internal(tick.type)
    assert signals.read_signal(tick) == signals.Tick(key="m1", at=T0)
    assert signals.read_signal(drift(1)) is None
    with pytest.raises(ValueError, match="unknown internal signal"):
        signals.read_signal(CloudEvent(id="x", source="/x", type="io.tuneloop.internal.nope"))


LIMITED = RULES.replace(
    "runtimes: [torch-distributed]\n",
    "runtimes: [torch-distributed]\nlimits: {max_concurrent_jobs: 1}\n",
)


async def test_a_launch_over_the_global_job_limit_waits_until_a_job_finishes():
    world = World(LIMITED)
    orch = world.orchestrator()
    await feed(orch, drift(1, model="m1"))
    await feed(orch, drift(2, model="m1"))  # m1's job takes the only slot
    first = world.backend.job_names[0]

    async def sleep_until_the_first_job_ends(seconds: float) -> None:
        world.sleeps.append(seconds)
        if len(world.sleeps) == 3:  # the hold lasts three looks at the backend
            world.backend.move(first, JobPhase.SUCCEEDED)

    orch._sleep = sleep_until_the_first_job_ends
    await feed(orch, drift(1, model="m2"))
    assert await feed(orch, drift(2, model="m2")) == [Outcome.LAUNCH]

    assert len(world.backend.job_names) == 2
    assert world.sleeps == [0.1, 0.2, 0.4]  # backing off, as for an unavailable backend


async def test_a_replayed_launch_of_an_active_job_is_not_held_by_the_limit():
    world = World(LIMITED)
    orch = world.orchestrator()
    await feed(orch, drift(1))
    before = dict(world.states.states)
    await feed(orch, drift(2))

    world.states.states = before  # the state write was lost; the launch replays
    assert await feed(world.orchestrator(), drift(2)) == [Outcome.LAUNCH]

    assert world.sleeps == []
    assert len(world.backend.job_names) == 1


async def test_raising_the_limit_in_a_rule_reload_releases_a_held_launch():
    world = World(LIMITED)
    orch = world.orchestrator()
    await feed(orch, drift(1, model="m1"))
    await feed(orch, drift(2, model="m1"))

    async def reload_during_the_hold(seconds: float) -> None:
        world.sleeps.append(seconds)
        orch.replace_rules(parse_files([Source("rules.yaml", LIMITED.replace(": 1}", ": 2}"))]))

    orch._sleep = reload_during_the_hold
    await feed(orch, drift(1, model="m2"))
    assert await feed(orch, drift(2, model="m2")) == [Outcome.LAUNCH]

    assert len(world.backend.job_names) == 2
    assert world.sleeps == [0.1]


async def test_without_a_limit_launches_never_ask_the_backend_what_is_active():
    world = World()
    orch = world.orchestrator()

    async def must_not_be_called() -> frozenset[str]:
        raise AssertionError("active_jobs was called")

    world.backend.active_jobs = must_not_be_called  # type: ignore[method-assign]
    for model in ("m1", "m2", "m3"):
        await feed(orch, drift(1, model=model))
        assert await feed(orch, drift(2, model=model)) == [Outcome.LAUNCH]

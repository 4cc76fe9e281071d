"""The wired worker on the real broker: events in, one launch, one completion event out.

The backend here is the in-memory one, moved by the test the way a cluster would move a job,
so this test is about the worker's wiring (rules, cooldown, forbid, the started and completed
events), not about training. The same loop with real training, on the local-process backend,
is tests/e2e/test_local_loop.py; the Kubernetes backend runs it in the fault suites
(tests/e2e/test_fault_*.py), and all three backends meet one contract in tests/contract.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.clock import SystemClock
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobResult
from orchestrator.testing import InMemoryBackend
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions, read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

RULES = """
runtimes: [torch-distributed]
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
      where: "event.data.value > event.data.threshold"
    key: "event.data.model_id"
    window: 6h
    count: 2
    cooldown: 1h
    concurrency: forbid
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""


def drift(n: int, *, model: str = "m1", value: float = 0.3) -> CloudEvent:
    return drift_alarm(f"drift-{n}", model=model, value=value, n=n)


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "loop")


async def test_qualifying_events_launch_one_job_and_its_completion_is_announced_once(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    backend = InMemoryBackend(SystemClock())
    worker = build_test_worker(
        worker_settings(kafka_bootstrap, topics), rules=rules, backend=backend
    )

    async def completion_announced() -> bool:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return any(e.type.endswith("completed.v1") for e in out)

    async with running(worker):
        events = [drift(1), drift(2, value=0.1), drift(3)]
        await send_events(kafka_bootstrap, topics["in"], events)
        await wait_for(
            lambda: len(backend.job_names) == 1, what="the launch", timeout=60, interval=0.1
        )
        await send_events(kafka_bootstrap, topics["in"], [drift(4), drift(5)])  # cooldown + forbid
        (job,) = backend.job_names
        backend.move(job, JobPhase.RUNNING)
        backend.move(job, JobPhase.SUCCEEDED, result=JobResult(adapter_uri="file:///adapter"))
        await wait_for(
            lambda: worker.counts.signals_sent >= 3,
            what="the observations",
            timeout=60,
            interval=0.1,
        )
        await wait_for(completion_announced, what="the completion event", timeout=60, interval=0.5)

        # drift 4 and 5 reach the keyed topic through stage 1's transactions, and may come
        # after the job's observations: wait for their decisions too
        async def suppressed() -> bool:
            decisions = await read_decisions(kafka_bootstrap, topics["audit"])
            return any(d["outcome"] == "suppress" for d in decisions)

        await wait_for(suppressed, what="the decision on drift 5", timeout=60, interval=0.5)

    out = await read_topic(kafka_bootstrap, topics["out"])
    outcomes = [d["outcome"] for d in await read_decisions(kafka_bootstrap, topics["audit"])]
    assert outcomes.count("launch") == 1
    assert "suppress" in outcomes
    assert backend.launch_calls == 1
    completed = [e for e in out if e.type == "io.tuneloop.finetune.completed.v1"]
    started = [e for e in out if e.type == "io.tuneloop.finetune.started.v1"]
    assert len(completed) == 1
    assert len(started) == 1
    assert completed[0].data["adapter_uri"] == "file:///adapter"
    assert completed[0].extensions["causationid"] in {"drift-1", "drift-3"}

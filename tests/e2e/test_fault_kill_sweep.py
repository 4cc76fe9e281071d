"""Fault suite: `kill -9` the worker in the middle of a sweep.

A real `tuneloop run --backend local` process (the fault harness's `WorkerProcess`) runs a
sweep of four trials, two at a time, on the tiny model. The test kills it with SIGKILL twice:
soon after the first trials were launched (so, sometimes, between a launch and the state
write that remembers it), and soon after a trial finished (between its end and the next
trial's launch). The trainers run in their own sessions and outlive the worker, as the local
backend intends; each time a new worker process takes over the same consumer group and job
directory.

What must hold, whatever the kills interrupted: exactly the four trials the rule asks for
were ever started (one job directory each, all of one sweep), every one of them ran to its
end, and one sweep result and one `finetune.completed` (the best trial's) went out, by id.
The expected numbers come from the rule (grid of four, parallel two), not from the worker.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from pathlib import Path

import pytest

from orchestrator.events import CloudEvent
from tests.e2e.harness import COMPLETED, WorkerConfig, WorkerProcess, wait_for
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_topic, send_events
from tests.fixtures.worker import worker_topics

pytestmark = [pytest.mark.kafka, pytest.mark.training, pytest.mark.timeout(480)]

SWEEP_COMPLETED = "io.tuneloop.finetune.sweep.completed.v1"
TRIALS = 4

RULES = """
runtimes: [local]
rules:
  - name: sweep-on-drift
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    launch:
      runtime: local
      base_model: tiny
      dataset: "file://{dataset}"
      training: {{max_steps: 30, batch_size: 16, max_seq_length: 64}}
      promote: {{metric: eval_loss}}
      sweep:
        algorithm: grid
        parameters:
          training.learning_rate: {{values: [1.0e-3, 2.0e-3, 3.0e-3, 5.0e-4]}}
        parallel: 2
"""


def trial_dirs(jobs: Path) -> list[Path]:
    return sorted(p for p in jobs.iterdir() if p.is_dir()) if jobs.exists() else []


def finished(jobs: Path) -> list[Path]:
    return [p for p in trial_dirs(jobs) if (p / "exit.json").exists()]


async def test_killing_the_worker_mid_sweep_doubles_and_loses_no_trial_and_one_result(
    kafka_bootstrap: str,
    new_topic: TopicFactory,
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
) -> None:
    rng = random.Random(16)
    topics = worker_topics(new_topic, "sweep-kill")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(dataset=reverse_dataset))
    jobs = tmp_path / "jobs"
    config = WorkerConfig(
        bootstrap=kafka_bootstrap,
        topics=topics,
        group=f"sweep-kill-{uuid.uuid4().hex[:8]}",
        rules=rules,
        kubeconfig=None,
        namespace=None,
        backend="local",
        extra_environment={"TUNELOOP_LOCAL_ROOT": str(jobs), "TUNELOOP_LOCAL_MAX_JOBS": "2"},
    )
    worker = WorkerProcess(config, tmp_path / "worker.log")

    async def result() -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return [e for e in out if e.type == SWEEP_COMPLETED]

    async def kill_and_restart(at_most: float) -> None:
        await asyncio.sleep(rng.uniform(0, at_most))
        worker.kill()
        worker.start()

    worker.start()
    try:
        await send_events(kafka_bootstrap, topics["in"], [drift_alarm("sweep-kill-1")])
        await wait_for(
            lambda: len(trial_dirs(jobs)) >= 1,
            what="the first trial's job",
            timeout=120,
            on_timeout=worker.log_tail,
        )
        await kill_and_restart(at_most=2.0)
        await wait_for(
            lambda: len(finished(jobs)) >= 1,
            what="a trial's end",
            timeout=180,
            on_timeout=worker.log_tail,
        )
        await kill_and_restart(at_most=1.5)
        await wait_for(result, what="the sweep's result", timeout=300, on_timeout=worker.log_tail)
        await asyncio.sleep(2.0)  # a duplicate, had one been made, would be out by now
    finally:
        worker.stop()

    assert worker.kills == 2
    out = await read_topic(kafka_bootstrap, topics["out"])
    sweeps = [e for e in out if e.type == SWEEP_COMPLETED]
    assert len({e.id for e in sweeps}) == 1, [e.id for e in sweeps]
    data = sweeps[0].data

    # Exactly the four trials of one sweep were started, and each ran to its end.
    started = trial_dirs(jobs)
    assert len(started) == TRIALS, [p.name for p in started]
    assert sorted(t["job"] for t in data["trials"]) == [p.name for p in started]
    assert [t["state"] for t in data["trials"]] == ["completed"] * TRIALS
    for directory in started:
        exit_info = json.loads((directory / "exit.json").read_text())
        assert exit_info["returncode"] == 0, (directory.name, exit_info)

    assert data["status"] == "succeeded"
    completions = {e.id for e in out if e.type == COMPLETED}
    assert completions == {f"{data['best']['job']}.completed"}
    assert {e.type for e in out} == {SWEEP_COMPLETED, COMPLETED}

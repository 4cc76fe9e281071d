"""A hyperparameter sweep end to end: the real broker, the wired worker, the local-process
backend running the real trainer on the tiny model.

One drift alarm fires a rule whose launch has a `sweep:` block: a grid of four learning rates,
two trials at a time, the median rule from step 40 on once two trials completed. The grid's
order makes the story known from the construction:

- trials 0 and 1 (1e-3, 2e-3) run first and complete: they are the median rule's reference;
- trial 2 (3e-3) trains faster than both: never behind, it completes with the lowest loss;
- trial 3 (1e-9) does not train at all: its training loss stays at the untrained model's,
  behind the median at its first report past step 40, so it is cancelled long before its 300
  steps are done.

Why step 40: a reported loss is one batch's, sampled every 0.2 s, while the references are
the completed trials' bests. Measured per step on this dataset and seed, a single 3e-3 batch
loss is above the median of the 1e-3 and 2e-3 trials' bests at steps 12 to 34 (by up to
0.04) and never after; from step 10 the rule pruned trial 2 in one CI run.

No champion exists yet, so the best trial's adapter is promoted: one `finetune.completed`
(promoted) for it, none for the others, and one `sweep.completed` listing all four.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.events import CloudEvent
from orchestrator.vocabulary.registry import SchemaRegistry
from runtimes.localprocess.backend import LocalProcessBackend
from tests.e2e.harness import COMPLETED
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import read_decisions, read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [pytest.mark.kafka, pytest.mark.training, pytest.mark.timeout(300)]

SWEEP_COMPLETED = "io.tuneloop.finetune.sweep.completed.v1"
STEPS = 300
RATES = (1e-3, 2e-3, 3e-3, 1e-9)

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
      training: {{max_steps: {steps}, batch_size: 16, max_seq_length: 64}}
      promote: {{metric: eval_loss}}
      sweep:
        objective: {{metric: eval_loss, mode: min}}
        algorithm: grid
        parameters:
          training.learning_rate: {{values: [{rates}]}}
        parallel: 2
        early_stopping: {{median: {{min_trials: 2, start_step: 40}}}}
"""


@pytest.fixture
def topics(new_topic: TopicFactory) -> dict[str, str]:
    return worker_topics(new_topic, "sweep")


def steps_run(jobs: Path, job: str) -> int:
    """The last step the trainer of *job* reported in its progress lines."""
    steps = [
        json.loads(line).get("step", 0)
        for line in (jobs / job / "stdout.log").read_text().splitlines()
        if line.startswith("{") and '"progress"' in line
    ]
    return max(steps, default=0)


async def test_a_sweep_prunes_the_trial_that_does_not_learn_and_promotes_the_best(
    kafka_bootstrap: str,
    topics: dict[str, str],
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the clock of this test starts
    reverse_dataset: Path,
) -> None:
    rules = tmp_path / "rules.yaml"
    rates = ", ".join(f"{rate:.1e}" for rate in RATES)
    rules.write_text(RULES.format(dataset=reverse_dataset, steps=STEPS, rates=rates))
    jobs = tmp_path / "jobs"

    async def result() -> list[CloudEvent]:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return [e for e in out if e.type == SWEEP_COMPLETED]

    async with LocalProcessBackend(
        jobs,
        max_concurrent=2,
        poll_interval=0.2,
        # One thread per trainer (two share the machine's cores); a progress line every
        # 0.2 s, so the median rule sees a trial's loss within its first few dozen steps.
        trainer_overrides={"cpu_threads": 1, "save_steps": 0, "progress_interval": 0.2},
    ) as backend:
        worker = build_test_worker(
            worker_settings(kafka_bootstrap, topics), rules=rules, backend=backend
        )
        async with running(worker):
            await send_events(kafka_bootstrap, topics["in"], [drift_alarm("sweep-drift-1")])
            await wait_for(result, what="the sweep's result", timeout=240)
            crash = worker.app._crash_reason

    assert crash is None, crash
    out = await read_topic(kafka_bootstrap, topics["out"])
    (sweep,) = [e for e in out if e.type == SWEEP_COMPLETED]
    SchemaRegistry.builtin().validate(sweep)
    data = sweep.data
    trials = data["trials"]
    assert [t["parameters"]["training.learning_rate"] for t in trials] == list(RATES)
    assert [t["state"] for t in trials] == ["completed", "completed", "completed", "pruned"]
    assert (data["status"], data["reason"]) == ("succeeded", "max-trials")

    # The trial that does not learn was cancelled early, as its job directory shows.
    pruned = trials[3]
    assert "worse than the median" in pruned["reason"]
    exit_info = json.loads((jobs / pruned["job"] / "exit.json").read_text())
    assert exit_info["cancelled"] is True
    assert steps_run(jobs, pruned["job"]) < STEPS
    for trial in trials[:3]:
        assert steps_run(jobs, trial["job"]) == STEPS

    # The fastest learner is the best, and the one adapter announced, promoted.
    best = data["best"]
    assert best["job"] == trials[2]["job"]
    assert best["metric"] == min(t["metric"] for t in trials[:3])
    assert data["promoted"] is True
    (completed,) = [e for e in out if e.type == COMPLETED]
    assert completed.data["job"] == best["job"]
    assert completed.data["promoted"] is True
    assert completed.data["adapter_uri"] == best["adapter_uri"]
    adapter = Path(str(best["adapter_uri"]).removeprefix("file://"))
    assert (adapter / "adapter_model.safetensors").is_file()
    assert {e.type for e in out} == {SWEEP_COMPLETED, COMPLETED}, "no finetune.* per trial"

    decisions = await read_decisions(kafka_bootstrap, topics["audit"])
    story = [(d["outcome"], d["reason"]) for d in decisions if d["outcome"] != "ignore"]
    assert story.count(("launch", "trial")) == 4
    assert story.count(("cancel", "pruned")) == 1
    assert story[-2:] == [("conclude", "max-trials"), ("promote", "no-champion")]

"""Fault suite 1: `kill -9` the worker again and again while events flow and jobs finish.

A real `tuneloop run --backend kubernetes` process consumes a deterministic stream from the
real broker and creates TrainJobs on the real API server. The test kills it with SIGKILL at
random points: while it consumes (and so, sometimes, between a decision and its create), and
right after TrainJobs were moved to Complete (between the status change and the completion
event). Each time a new process takes over the same group. At the end each model the stream
plan sent three qualifying alarms must have exactly one TrainJob, the others none, and each
job must have exactly one `finetune.completed` event id on the output topic.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from tests.e2e.harness import FaultEnv, StreamPlan, Summary, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.kubernetes, pytest.mark.slow]


async def kill_worker_repeatedly(
    *,
    plan: StreamPlan,
    consume_kills: int,
    completion_kills: int,
    env: FaultEnv,
) -> Summary:
    rng = random.Random(plan.seed)
    run = env.prepare_run(plan, group=f"fault-kill-{uuid.uuid4().hex[:8]}")
    run.workers = env.workers(run.config)
    (worker,) = run.workers
    started_with = [0]

    def restart() -> None:
        worker.kill()
        started_with[0] = run.created()
        worker.start()

    async def kill_once_it_worked(*, at_most: float) -> None:
        # Kill only a worker that has done something since it started (created a job), so
        # each kill lands mid-work, not during start-up; then at a random moment after that.
        await wait_for(
            lambda: run.created() > started_with[0] or run.created() == len(run.expected),
            what="the restarted worker to create a TrainJob",
            timeout=180,
            on_timeout=run.diagnosis,
        )
        await asyncio.sleep(rng.uniform(0, at_most))
        restart()

    async def between_chunks(sent: int) -> None:
        if worker.kills < consume_kills and sent < len(run.events):
            await kill_once_it_worked(at_most=2.0)

    async def kill_soon_after_status_change(_: int) -> None:
        # Some completions of the slice are out, others not yet: a kill between the status
        # change and the publish.
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        restart()

    worker.start()
    await run.send(chunk=max(1, plan.events // (consume_kills + 1)), between=between_chunks)
    await run.wait_for_launches()
    await run.complete_all(slices=completion_kills + 1, after_slice=kill_soon_after_status_change)
    return await run.summary(suite="kill -9 worker", faults=f"kills={worker.kills}")


# The loss this suite once found (faust re-delivering a dropped keyed record behind later
# ones around a rebalance) is fixed by counting events by their delivery sequence; see
# docs/guarantees.md.
@pytest.mark.timeout(600)
async def test_killing_the_worker_five_times_loses_and_doubles_no_launch_or_completion(
    fault_env: FaultEnv,
) -> None:
    summary = await kill_worker_repeatedly(
        plan=StreamPlan(seed=1, events=2000, launch_share=0.3),
        consume_kills=3,
        completion_kills=2,
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()
    assert summary.faults == "kills=5"


@pytest.mark.soak
@pytest.mark.timeout(3600)
async def test_soak_twenty_kills_over_ten_thousand_events(
    fault_env: FaultEnv,
) -> None:
    summary = await kill_worker_repeatedly(
        plan=StreamPlan(seed=2, events=10_000, launch_share=0.5),
        consume_kills=16,
        completion_kills=4,
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()
    assert len(summary.expected) >= 200
    assert summary.faults == "kills=20"

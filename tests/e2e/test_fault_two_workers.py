"""Fault suite 2: two workers in one consumer group, one killed with SIGKILL mid-stream.

Both `tuneloop run` processes share the group, so the input and the keyed topic are split
between them (the test waits until the broker shows both as members of a stable group). One is
killed mid-stream; after its session times out its partitions move to the survivor, which
rebuilds the rule state of those keys from the changelog topics: a model whose first alarms
were counted by the dead worker launches on the survivor when its third alarm arrives. Each
model the stream plan sent three qualifying alarms must have exactly one TrainJob, the others
none, each job with exactly one `finetune.completed` event id.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.e2e.harness import FaultEnv, StreamPlan, Summary, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.kubernetes, pytest.mark.slow]


def stable_members(bootstrap: str, group: str) -> int:
    """How many members *group* has once the broker shows it `Stable` (assignment done)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        description = admin.describe_groups([group]).get(group) or {}
    except KafkaError:  # no coordinator yet: the group is still forming
        return 0
    finally:
        admin.close()
    if str(description.get("group_state") or description.get("state")) != "Stable":
        return 0
    return len(description.get("members") or ())


async def two_workers_one_killed(
    *,
    plan: StreamPlan,
    env: FaultEnv,
) -> Summary:
    group = f"fault-two-{uuid.uuid4().hex[:8]}"
    run = env.prepare_run(plan, group=group)
    run.workers = env.workers(run.config, count=2)
    survivor, victim = run.workers
    for worker in run.workers:
        worker.start()
    half = len(run.events) // 2

    async def kill_one_at_half(sent: int) -> None:
        if sent != half:
            return
        await wait_for(
            lambda: stable_members(env.bootstrap, group) == 2,
            what="both workers to hold partitions",
            timeout=180,
            on_timeout=run.diagnosis,
        )
        await asyncio.sleep(1.0)  # both are consuming the first half now
        victim.kill()

    await run.send(chunk=half, between=kill_one_at_half)
    await run.wait_for_launches()
    await run.complete_all()
    assert survivor.running, "the surviving worker died"
    return await run.summary(suite="two workers, one killed", faults=f"kills={victim.kills}")


@pytest.mark.timeout(600)
async def test_a_killed_worker_hands_its_partitions_and_state_to_the_other_without_loss(
    fault_env: FaultEnv,
) -> None:
    summary = await two_workers_one_killed(
        plan=StreamPlan(seed=3, events=800, launch_share=0.4),
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()


@pytest.mark.soak
@pytest.mark.timeout(3600)
async def test_soak_two_workers_one_killed_over_ten_thousand_events(
    fault_env: FaultEnv,
) -> None:
    summary = await two_workers_one_killed(
        plan=StreamPlan(seed=4, events=10_000, launch_share=0.5),
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()
    assert len(summary.expected) >= 200

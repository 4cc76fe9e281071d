"""Fault suite 4: the Kubernetes API server is unavailable for 30 s while events flow.

A real `tuneloop run --backend kubernetes` has created some TrainJobs when the test stops the
local API server (etcd keeps its data) and keeps producing. Launches decided meanwhile fail
with connection refused: the backend tries once, and the service (the one owner of retries)
retries with backoff without giving up, holding the key's partition so that decisions keep
their order. When the server returns, the backlog drains: exactly one TrainJob for each
model the stream plan sent three qualifying alarms and none for the others (a create whose
answer was lost is recognised by its decision id, not doubled), and the job watch resumes,
so each job gets exactly one `finetune.completed` event id.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.e2e.harness import FaultEnv, StreamPlan, Summary, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.kubernetes, pytest.mark.slow]

OUTAGE_SECONDS = 30.0


async def api_outage_mid_stream(
    *,
    plan: StreamPlan,
    outages: int,
    env: FaultEnv,
) -> Summary:
    server = env.kube_api.server
    if server is None:
        pytest.skip("the Kubernetes API here is external; this test stops a local one")
    run = env.prepare_run(plan, group=f"fault-api-{uuid.uuid4().hex[:8]}")
    run.workers = env.workers(run.config)
    (worker,) = run.workers
    worker.start()
    chunk = max(1, len(run.events) // (2 * outages + 1))
    done = [0]
    created_before = [0]

    async def outage_every_other_chunk(sent: int) -> None:
        if done[0] >= outages or sent // chunk % 2 == 0:
            return
        # The previous outage must be over before the next one: counting TrainJobs asks the
        # API server, and back-to-back outages would test nothing more.
        for task in restore:
            await task
        await wait_for(
            lambda: run.created() > created_before[0],
            what="the worker to create a TrainJob",
            timeout=180,
            on_timeout=run.diagnosis,
        )
        # Down for OUTAGE_SECONDS while the next chunk of events is produced. The next
        # outage waits for a TrainJob beyond those that exist now: the launches decided
        # meanwhile are created once the server is back. (Counted when the server came back
        # instead, the retried launches could all be created before the count, and with no
        # more events sent, the wait had nothing left to see: soak, seed 8.)
        created_before[0] = await asyncio.to_thread(run.created)
        await asyncio.to_thread(server.stop_apiserver)
        restore.append(asyncio.create_task(back_after(OUTAGE_SECONDS)))
        done[0] += 1

    restore: list[asyncio.Task[None]] = []

    async def back_after(seconds: float) -> None:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(server.start)

    try:
        await run.send(chunk=chunk, between=outage_every_other_chunk)
        for task in restore:
            await task
    finally:
        for task in restore:
            task.cancel()
        if not server.running():
            server.start()
    await run.wait_for_launches()
    await run.complete_all()
    assert worker.running, "the worker exited during the API outage"
    return await run.summary(
        suite="API server outage", faults=f"outages={done[0]}x{OUTAGE_SECONDS:.0f}s"
    )


@pytest.mark.timeout(600)
async def test_launches_decided_while_the_api_server_is_down_are_retried_once_it_returns(
    fault_env: FaultEnv,
) -> None:
    summary = await api_outage_mid_stream(
        plan=StreamPlan(seed=7, events=800, launch_share=0.4),
        outages=1,
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()


@pytest.mark.soak
@pytest.mark.timeout(3600)
async def test_soak_three_api_outages_over_ten_thousand_events(
    fault_env: FaultEnv,
) -> None:
    summary = await api_outage_mid_stream(
        plan=StreamPlan(seed=8, events=10_000, launch_share=0.5),
        outages=3,
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()
    assert len(summary.expected) >= 200

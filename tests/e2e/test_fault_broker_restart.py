"""Fault suite 3: the Kafka broker is restarted mid-stream on the same data directory.

A real `tuneloop run` consumes while the local broker is stopped (controlled shutdown; the
soak version also crashes it with SIGKILL) and started again on the same ports and data. The
worker and the test's producer reconnect on their own; nothing is restarted by hand. The
models the stream plan sent three qualifying alarms must have exactly one TrainJob each, the
others none, each job must have exactly one `finetune.completed` event id, and the worker
process must have survived.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from devservices.kafka import LocalKafka
from tests.e2e.harness import FaultEnv, StreamPlan, Summary, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.kubernetes, pytest.mark.slow]


async def restart_broker_mid_stream(
    *,
    plan: StreamPlan,
    crashes: tuple[bool, ...],
    broker: LocalKafka,
    env: FaultEnv,
) -> Summary:
    run = env.prepare_run(plan, group=f"fault-broker-{uuid.uuid4().hex[:8]}")
    run.workers = env.workers(run.config)
    (worker,) = run.workers
    worker.start()
    chunk = len(run.events) // (len(crashes) + 1)
    restarts = list(crashes)
    before = [0]

    async def restart_once_it_worked(sent: int) -> None:
        if not restarts:
            return
        await wait_for(
            lambda: run.created() > before[0],
            what="the worker to create a TrainJob",
            timeout=180,
            on_timeout=run.diagnosis,
        )
        crash = restarts.pop(0)
        await asyncio.to_thread(broker.restart, graceful=not crash)
        before[0] = run.created()

    await run.send(chunk=chunk, between=restart_once_it_worked)
    await run.wait_for_launches()
    await run.complete_all()
    assert worker.running, "the worker exited during the broker restart"
    kinds = ",".join("crash" if c else "graceful" for c in crashes)
    return await run.summary(suite="broker restart", faults=f"broker restarts={kinds}")


@pytest.mark.timeout(600)
async def test_a_broker_restart_mid_stream_loses_and_doubles_nothing(
    kafka_broker: LocalKafka,
    fault_env: FaultEnv,
) -> None:
    summary = await restart_broker_mid_stream(
        plan=StreamPlan(seed=5, events=800, launch_share=0.4),
        crashes=(False,),
        broker=kafka_broker,
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()


@pytest.mark.soak
@pytest.mark.timeout(3600)
async def test_soak_broker_stopped_and_crashed_over_ten_thousand_events(
    kafka_broker: LocalKafka,
    fault_env: FaultEnv,
) -> None:
    summary = await restart_broker_mid_stream(
        plan=StreamPlan(seed=6, events=10_000, launch_share=0.5),
        crashes=(False, True, False),
        broker=kafka_broker,
        env=fault_env,
    )
    print(summary.line())
    summary.assert_exact()
    assert len(summary.expected) >= 200

"""Fault suite 1: `kill -9` the worker again and again while events flow and jobs finish.

A real `tuneloop run --backend kubernetes` process consumes a deterministic stream from the
real broker and creates TrainJobs on the real API server. The test kills it with SIGKILL at
random points: while it consumes (and so, sometimes, between a decision and its create), and
right after TrainJobs were moved to Complete (between the status change and the completion
event). Each time a new process takes over the same group. At the end the TrainJobs must be
exactly the launches `tuneloop simulate` computed for the same file, and each of them must
have exactly one `finetune.completed` event id on the output topic.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from handlers.local_services.kubernetes import KubeEndpoint
from tests.e2e.harness import (
    StreamPlan,
    Summary,
    WorkerConfig,
    WorkerProcess,
    complete_trainjobs,
    completions_by_job,
    count_records,
    diagnosis,
    expected_launches,
    make_stream,
    read_topic,
    send_events,
    trainjob_names,
    wait_for,
    write_jsonl,
)

pytestmark = [pytest.mark.kafka, pytest.mark.kubernetes, pytest.mark.slow]


async def kill_worker_repeatedly(
    *,
    plan: StreamPlan,
    consume_kills: int,
    completion_kills: int,
    kafka_bootstrap: str,
    kube_api: KubeEndpoint,
    namespace: str,
    topics: dict[str, str],
    rules: Path,
    workers: Callable[..., list[WorkerProcess]],
    tmp_path: Path,
) -> Summary:
    rng = random.Random(plan.seed)
    events = make_stream(plan)
    expected = expected_launches(rules, write_jsonl(events, tmp_path / "events.jsonl"))
    config = WorkerConfig(
        bootstrap=kafka_bootstrap,
        topics=topics,
        group=f"fault-kill-{uuid.uuid4().hex[:8]}",
        rules=rules,
        kubeconfig=kube_api.kubeconfig,
        namespace=namespace,
    )
    (worker,) = workers(config)

    def created() -> int:
        return len(trainjob_names(kube_api.kubeconfig, namespace))

    started_with = [0]

    def stuck() -> Any:
        return diagnosis(
            bootstrap=kafka_bootstrap,
            topics=topics,
            kubeconfig=kube_api.kubeconfig,
            namespace=namespace,
            expected=expected,
            workers=[worker],
        )

    def restart() -> None:
        worker.kill()
        started_with[0] = created()
        worker.start()

    async def kill_once_it_worked(*, at_most: float) -> None:
        # Kill only a worker that has done something since it started (created a job), so
        # each kill lands mid-work, not during start-up; then at a random moment after that.
        await wait_for(
            lambda: created() > started_with[0] or created() == len(expected),
            what="the restarted worker to create a TrainJob",
            timeout=180,
            on_timeout=stuck,
        )
        await asyncio.sleep(rng.uniform(0, at_most))
        restart()

    chunk = max(1, plan.events // (consume_kills + 1))

    async def between_chunks(sent: int) -> None:
        if worker.kills < consume_kills and sent < len(events):
            await kill_once_it_worked(at_most=2.0)

    worker.start()
    await send_events(kafka_bootstrap, topics["in"], events, chunk=chunk, between=between_chunks)
    await wait_for(
        lambda: created() >= len(expected),
        what=f"{len(expected)} TrainJobs",
        timeout=300,
        on_timeout=stuck,
    )

    # Move the jobs to Complete in slices; kill the worker right after each slice, when some
    # completions are published and others not yet (between status change and publish).
    names = sorted(trainjob_names(kube_api.kubeconfig, namespace))
    slices = [names[i :: completion_kills + 1] for i in range(completion_kills + 1)]
    for n, part in enumerate(slices):
        await asyncio.to_thread(complete_trainjobs, kube_api.kubeconfig, namespace, part)
        if n < completion_kills:
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            restart()

    async def all_completed() -> bool:
        out = await read_topic(kafka_bootstrap, topics["out"])
        return set(completions_by_job(out)) >= set(names)

    await wait_for(
        all_completed,
        what="a completion event per TrainJob",
        timeout=300,
        interval=2.0,
        on_timeout=stuck,
    )
    await asyncio.sleep(3)  # a late duplicate id would show up now
    worker.stop()
    out = await read_topic(kafka_bootstrap, topics["out"])
    return Summary(
        suite="kill -9 worker",
        events_sent=len(events),
        expected=expected,
        trainjobs=trainjob_names(kube_api.kubeconfig, namespace),
        completions=completions_by_job(out),
        completion_copies=sum(1 for e in out if e.type.endswith("completed.v1")),
        dlq=await count_records(kafka_bootstrap, topics["dlq"]),
        faults=f"kills={worker.kills}",
    )


@pytest.mark.timeout(600)
async def test_killing_the_worker_five_times_loses_and_doubles_no_launch_or_completion(
    kafka_bootstrap: str,
    kube_api: KubeEndpoint,
    k8s_namespace: str,
    fault_topics: dict[str, str],
    fault_rules: Path,
    fault_workers: Callable[..., list[WorkerProcess]],
    tmp_path: Path,
) -> None:
    summary = await kill_worker_repeatedly(
        plan=StreamPlan(seed=1, events=2000, launch_share=0.3),
        consume_kills=4,
        completion_kills=2,
        kafka_bootstrap=kafka_bootstrap,
        kube_api=kube_api,
        namespace=k8s_namespace,
        topics=fault_topics,
        rules=fault_rules,
        workers=fault_workers,
        tmp_path=tmp_path,
    )
    print(summary.line())
    summary.assert_exact()
    assert summary.faults == "kills=6"


@pytest.mark.soak
@pytest.mark.timeout(3600)
async def test_soak_twenty_kills_over_ten_thousand_events(
    kafka_bootstrap: str,
    kube_api: KubeEndpoint,
    k8s_namespace: str,
    fault_topics: dict[str, str],
    fault_rules: Path,
    fault_workers: Callable[..., list[WorkerProcess]],
    tmp_path: Path,
) -> None:
    summary = await kill_worker_repeatedly(
        plan=StreamPlan(seed=2, events=10_000, launch_share=0.5),
        consume_kills=16,
        completion_kills=4,
        kafka_bootstrap=kafka_bootstrap,
        kube_api=kube_api,
        namespace=k8s_namespace,
        topics=fault_topics,
        rules=fault_rules,
        workers=fault_workers,
        tmp_path=tmp_path,
    )
    print(summary.line())
    summary.assert_exact()
    assert len(summary.expected) >= 200
    assert summary.faults == "kills=20"

"""Decision -> TrainJob created: `KubernetesBackend.launch` against a bare create loop.

Both sides create the same TrainJobs (the builder's output) on the same local API server,
one at a time on the same fixed schedule (a steady rate), taking turns request by request so
that other load on the machine and etcd growing under them affect both alike. Latency counts
from the scheduled start (or, when the other side overran into this slot, from when the slot
became free) to the create's return. tuneloop's side includes
the runtime lookup (cached catalog), the pure builder, the create on the backend's pooled
aiohttp session (`runtimes/kubernetes/async_api.py`) and the idempotency bookkeeping; the bare
side is the synchronous client's `create_namespaced_custom_object` alone, body built
beforehand.

Goal (issue 5): p99 <= 1.5x bare. Beside it, the process CPU time (`time.process_time`, every
thread) of each side's call, per create: the CPU a launch costs the worker (issue 17).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.clock import SystemClock
from orchestrator.jobs.model import TrainingRequest
from runtimes.kubernetes import manifests
from runtimes.kubernetes.backend import BackendSettings, KubernetesBackend
from runtimes.kubernetes.catalog import GROUP, VERSION, RuntimeInfo

RUNTIME = "torch-distributed"
GOAL = 1.5


def _request(index: int, tag: str) -> TrainingRequest:
    return TrainingRequest(
        name=f"ft-{tag}-{index:05d}",
        rule="retrain-on-drift",
        rule_version="1",
        key=f"model-{index % 7}",
        decision_id=f"retrain-on-drift/model-{index % 7}/{tag}-{index}",
        causing_event_ids=tuple(f"evt-{index}-{k}" for k in range(3)),
        runtime=RUNTIME,
        base_model="smollm2-135m",
        dataset=f"file:///data/model-{index % 7}.jsonl",
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _interleaved_round(
    api: Any, backend: KubernetesBackend, count: int, interval: float, tag: str
) -> tuple[list[float], list[float], float, float]:
    """Bare create and tuneloop launch take turns on one schedule, so that whatever else the
    machine does at a moment hits both sides alike; the latencies of each, and the CPU seconds
    each spent in its calls."""
    bodies = [
        manifests.build_trainjob(
            _request(i, f"b{tag}"),
            namespace=f"bench-bare-{tag}",
            runtime=RuntimeInfo(name=RUNTIME),
            settings=manifests.Settings(),
        )
        for i in range(count)
    ]
    requests = [_request(i, f"o{tag}") for i in range(count)]
    bare: list[float] = []
    ours: list[float] = []
    bare_cpu = our_cpu = 0.0
    start = time.perf_counter()
    free = start
    for index in range(count):
        scheduled = max(start + index * interval, free)
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        # The bare loop is synchronous on purpose: nothing else runs meanwhile.
        cpu = time.process_time()
        api.create_namespaced_custom_object(
            GROUP, VERSION, f"bench-bare-{tag}", manifests.PLURAL, bodies[index]
        )
        bare_cpu += time.process_time() - cpu
        free = time.perf_counter()
        bare.append(free - scheduled)
        scheduled = max(start + (index + 0.5) * interval, free)
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        cpu = time.process_time()
        await backend.launch(requests[index])
        our_cpu += time.process_time() - cpu
        free = time.perf_counter()
        ours.append(free - scheduled)
    await backend.aclose()
    return bare, ours, bare_cpu, our_cpu


def run(*, quick: bool) -> list[dict[str, object]]:
    import structlog
    from kubernetes import client

    from devservices import kubernetes as local_kubernetes

    count, rounds, rate = (40, 2, 10.0) if quick else (150, 3, 10.0)
    interval = 1.0 / rate
    bare: list[float] = []
    ours: list[float] = []
    bare_cpu = our_cpu = 0.0
    logging_config = structlog.get_config()
    # One log line per launch would measure the terminal; keep warnings only while timing.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-launch-") as workdir,
            local_kubernetes.connect(Path(workdir)) as endpoint,
            endpoint.api_client() as api_client,
        ):
            api = client.CustomObjectsApi(api_client)
            for round_number in range(rounds + 1):  # round 0 warms both sides up, not counted
                tag = f"r{round_number}"
                for side in ("bare", "ours"):
                    # Held: the controllers act on every TrainJob, and no trainer runs.
                    local_kubernetes.create_namespace(
                        api_client, f"bench-{side}-{tag}", hold_pods=True
                    )
                backend = KubernetesBackend(
                    api,
                    clock=SystemClock(),
                    settings=BackendSettings(namespace=f"bench-ours-{tag}"),
                )
                bare_round, our_round, bare_round_cpu, our_round_cpu = asyncio.run(
                    _interleaved_round(api, backend, count, interval, tag)
                )
                if round_number:
                    bare += bare_round
                    ours += our_round
                    bare_cpu += bare_round_cpu
                    our_cpu += our_round_cpu
                print(
                    f"bench: launch round {round_number}: p50 bare "
                    f"{statistics.median(bare_round) * 1e3:.2f} ms, tuneloop "
                    f"{statistics.median(our_round) * 1e3:.2f} ms",
                    file=sys.stderr,
                )
            source = endpoint.source
    finally:
        structlog.configure(**logging_config)
    notes = (
        f"{len(ours)} creates per side at {rate:g}/s each, interleaved, "
        f"{rounds} rounds after a warm-up, {source} API server"
    )
    rows: list[dict[str, object]] = []
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        value, baseline = _percentile(ours, q) * 1e3, _percentile(bare, q) * 1e3
        rows.append(
            {
                "benchmark": "launch",
                "measure": f"decision -> TrainJob created, {label}",
                "value": value,
                "unit": "ms",
                "baseline": baseline,
                "ratio": value / baseline,
                "goal": f"<= {GOAL}x bare create" if label == "p99" else "",
                "notes": notes,
            }
        )
    value, baseline = our_cpu / len(ours) * 1e3, bare_cpu / len(bare) * 1e3
    rows.append(
        {
            "benchmark": "launch",
            "measure": "process CPU per TrainJob create",
            "value": value,
            "unit": "ms",
            "baseline": baseline,
            "ratio": value / baseline,
            "goal": "",
            "notes": notes
            + "; tuneloop builds the TrainJob too, the bare side's bodies are built beforehand",
        }
    )
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)

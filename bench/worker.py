"""Worker throughput and CPU per event against a raw aiokafka pipeline, and where the CPU goes.

The goals of issue 17, measured on a real worker: `tuneloop run` in a process of its own
(`bench/worker_process.py`), so that whatever path the worker has when the bench runs is
what is measured. One broker (`kafka_for_tests`), one rule that counts every event and never
fires (a drift rule, count 3 in 6 h, and every model id gets two events), so each event goes
through decode, validation, dedup and the rules, and leaves one decision record (`accumulate`)
on the audit topic; nothing launches.

Two inputs, each on topics of its own with 8 partitions (the worker's internal partition
count): **keyed**, every record keyed by its model id, the rule's key (with the CloudEvents
`partitionkey` attribute, as the Kafka binding writes it), and **unkeyed**, no record key, so
the worker must bring each key's events together itself. For each:

1. the worker starts, handles a few warm-up events and stops, so that its internal topics
   exist and its groups are settled (no rebalance lands in the measured run);
2. N events are produced while no worker runs, then the worker starts again and works
   through the backlog. `bench/steady.py` cuts the run at 10 % and 90 % of its audit records
   (counted from end offsets, 50 times a second) and reads the worker's CPU time from /proc
   at the same moments: events per second and CPU per event, start-up excluded;
3. the baseline, `bench/raw_pipeline.py` in a process of its own, reads the same topic from
   its beginning in a fresh group, produces one record per event and commits per batch; cut
   and read the same way. The topic is first topped up to 100,000 events of the same kind:
   the worker's backlog alone would be over too soon to sample.

The profile: after the keyed run, with the worker still running, `py-spy` samples it
(`bench/profiling.py`) while it works through another backlog; the top of it goes under the
table in docs/performance.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import structlog

from bench import events, profiling, steady, topics, worker_process
from bench.report import Results, Section
from bench.worker_process import Topics

PARTITIONS = 8
WARMUP = 200
KEYED_GOAL = ">= 0.5x the raw pipeline"
UNKEYED_GOAL = ">= 0.25x the raw pipeline"
CPU_GOAL_US = 40
RAW_AT_LEAST = 100_000
"""Records the raw pipeline handles: a few seconds of it. It is some 30 times as fast as the
worker, so the worker's backlog alone would be over too soon to sample; the topic is topped
up with more events of the same kind (after the worker is done with it) to this many."""
RULES = """
runtimes: [torch-distributed]
rules:
  - name: bench-worker
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 3
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "file:///data/${ key }.jsonl"
"""


@dataclass(frozen=True, slots=True)
class Variant:
    """One input's measurement: the worker's steady span and the raw pipeline's."""

    keyed: bool
    worker: steady.Span
    raw: steady.Span
    count: int
    profile: profiling.Profile | None
    profile_events: int


def _records(prefix: str, count: int, *, keyed: bool) -> list[topics.Record]:
    """*count* drift events, two per model id (the second half repeats the first half's ids,
    so a key's two events are far apart), keyed by model id or not at all."""
    half = max(1, count // 2)
    models = [f"{prefix}-m{index % half:07d}" for index in range(count)]
    return events.drift_records(prefix, models, keyed=keyed)


async def _worker_run(
    bootstrap: str,
    workdir: Path,
    *,
    keyed: bool,
    count: int,
    profile_events: int,
) -> tuple[Topics, steady.Span, profiling.Profile | None]:
    tag = f"{'k' if keyed else 'u'}{uuid.uuid4().hex[:6]}"
    names = Topics(
        events=f"bw-in-{tag}", out=f"bw-out-{tag}", audit=f"bw-audit-{tag}", dlq=f"bw-dlq-{tag}"
    )
    await asyncio.to_thread(
        topics.create,
        bootstrap,
        {names.events: PARTITIONS, names.out: 1, names.audit: 1, names.dlq: 1},
    )
    rules = workdir / f"rules-{tag}.yaml"
    rules.write_text(RULES)
    arguments = ["--rules", str(rules), "--backend", "local"]
    arguments += ["--local-root", str(workdir / f"jobs-{tag}")]
    env = worker_process.environment(bootstrap=bootstrap, topics=names, group=f"bench-worker-{tag}")
    log = workdir / f"worker-{tag}.log"
    async with topics.Counter(bootstrap, names.audit) as audit:
        with worker_process.running(arguments, env=env, log=log):
            await topics.produce(
                bootstrap, names.events, _records(f"warm-{tag}", WARMUP, keyed=keyed)
            )
            warm = await topics.watch(audit, cpu=lambda: 0.0, until=WARMUP, timeout=180)
            if warm[-1].done < WARMUP:
                raise RuntimeError(
                    f"the worker wrote {warm[-1].done} of {WARMUP} warm-up audit records"
                )
        already = await audit.count()
        await topics.produce(bootstrap, names.events, _records(f"run-{tag}", count, keyed=keyed))
        with worker_process.running(arguments, env=env, log=log) as worker:
            samples = await topics.watch(
                audit,
                cpu=lambda: worker_process.cpu_seconds(worker.pid),
                until=count,
                already=already,
                timeout=120 + count / 100,
            )
            span = steady.span(samples, count)
            profile = None
            if profile_events and profiling.py_spy() is not None:
                raw_path = workdir / f"profile-{tag}.txt"
                with profiling.recording(worker.pid, raw_path):
                    await topics.produce(
                        bootstrap,
                        names.events,
                        _records(f"prof-{tag}", profile_events, keyed=keyed),
                    )
                    await topics.watch(
                        audit,
                        cpu=lambda: 0.0,
                        until=count + profile_events,
                        already=already,
                        timeout=120 + profile_events / 100,
                    )
                if raw_path.exists():
                    profile = profiling.summarize(raw_path.read_text())
    return names, span, profile


async def _raw_run(bootstrap: str, source: str, *, keyed: bool, at_least: int) -> steady.Span:
    """The raw pipeline over everything on *source*, from its beginning, once the topic holds
    *at_least* records: the worker's and more of the same kind (see `RAW_AT_LEAST`)."""
    async with topics.Counter(bootstrap, source) as backlog:
        total = await backlog.count()
    if total < at_least:
        filler = _records(f"fill-{uuid.uuid4().hex[:6]}", at_least - total, keyed=keyed)
        total += await topics.produce(bootstrap, source, filler)
    target = f"{source}-raw-out"
    await asyncio.to_thread(topics.create, bootstrap, {target: 1})
    group = f"bench-raw-{uuid.uuid4().hex[:6]}"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.raw_pipeline", bootstrap, source, target, group, str(total)],
        cwd=worker_process.ROOT,
        stdin=subprocess.DEVNULL,
    )
    try:
        async with topics.Counter(bootstrap, target) as out:
            samples = await topics.watch(
                out,
                cpu=lambda: worker_process.cpu_seconds(process.pid),
                until=total,
                timeout=120 + total / 1000,
                alive=lambda: process.poll() is None,
            )
        return steady.span(samples, total)
    finally:
        worker_process.stop(process, grace=10)


async def _variant(
    bootstrap: str, workdir: Path, *, keyed: bool, count: int, profile_events: int
) -> Variant:
    names, worker, profile = await _worker_run(
        bootstrap, workdir, keyed=keyed, count=count, profile_events=profile_events
    )
    raw = await _raw_run(bootstrap, names.events, keyed=keyed, at_least=RAW_AT_LEAST)
    return Variant(keyed, worker, raw, count, profile, profile_events)


def _rows(variants: list[Variant]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for v in variants:
        which = "input keyed by model id" if v.keyed else "unkeyed input (regrouped by key)"
        rows.append(
            {
                "benchmark": "worker",
                "measure": f"worker throughput, {which}, no launches (N={v.count:,})",
                "value": v.worker.rate,
                "unit": "events/s",
                "baseline": v.raw.rate,
                "ratio": v.worker.rate / v.raw.rate,
                "goal": KEYED_GOAL if v.keyed else UNKEYED_GOAL,
                "notes": "tuneloop run, one rule that counts every event (decode + validate + "
                "dedup + rules + one audit record each); baseline: a raw aiokafka pipeline "
                "(consume, produce one record per event, commit per batch) on the same topic; "
                "both from 10 % to 90 % of a backlog, 8 partitions",
            }
        )
    for v in variants:
        worker_us, raw_us = 1e6 * v.worker.cpu_per_event, 1e6 * v.raw.cpu_per_event
        which = "keyed input" if v.keyed else "unkeyed input"
        rows.append(
            {
                "benchmark": "worker",
                "measure": f"worker CPU per event, no launch, {which}",
                "value": worker_us,
                "unit": "µs",
                "baseline": raw_us,
                "ratio": worker_us / raw_us if raw_us else math.nan,
                "goal": f"<= {CPU_GOAL_US} µs" if v.keyed else "context: the regrouping's cost",
                "notes": "user + system CPU of the worker process (/proc) over the same span as "
                "its throughput; baseline: the raw pipeline process's CPU per event",
            }
        )
    return rows


def _profile_section(variant: Variant) -> Section | None:
    if variant.profile is None:
        return None
    body = (
        f"`py-spy record --nonblocking --function --rate 200` on the `tuneloop run` worker "
        f"process while it worked through a backlog of {variant.profile_events:,} events "
        f"({'keyed' if variant.keyed else 'unkeyed'} input, the rule of the worker rows, no "
        f"launches), right after its measured run (`bench/worker.py`, `bench/profiling.py`). "
        "py-spy leaves out threads it sees idle, so the shares are close to CPU time; *own* is "
        "the function's own code, *cumulative* includes what it called (from the event loop's "
        "callback down).\n\n"
    )
    return Section(
        title="Profile: the worker under load", body=body + profiling.markdown(variant.profile)
    )


def run(*, quick: bool) -> Results:
    """Measure on the test broker; N = 3,000 quick, 20,000 full, per input."""
    from devservices.kafka import kafka_for_tests

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    count = 3_000 if quick else 20_000
    variants: list[Variant] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-worker-") as folder,
        kafka_for_tests(Path(folder) / "kafka") as kafka,
    ):
        for keyed in (True, False):
            started = time.monotonic()
            variants.append(
                asyncio.run(
                    _variant(
                        kafka.bootstrap,
                        Path(folder),
                        keyed=keyed,
                        count=count,
                        profile_events=count // 2 if keyed else 0,
                    )
                )
            )
            print(
                f"bench: worker {'keyed' if keyed else 'unkeyed'} done in "
                f"{time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
    sections = [s for s in (_profile_section(v) for v in variants) if s is not None]
    return Results(rows=_rows(variants), sections=sections)


if __name__ == "__main__":
    results = run(quick="--quick" in sys.argv)
    for row in results.rows:
        print(row)
    for section in results.sections:
        print(f"## {section.title}\n\n{section.body}")

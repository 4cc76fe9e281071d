"""Liveness: a stalled event loop and a consumer stuck behind its lag fail `/healthz`.

The loop test serves the real probe from a real aiohttp server (`handlers/web/server.py`)
and blocks the loop the way synchronous work would, asking from another thread, as the
kubelet asks from outside the process. The progress test stands in for faust's consumer
(a foreign library) with the three things the watch reads from it, and moves time itself.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from handlers.faust_app import new_app
from handlers.web import health
from handlers.web.health import HealthWatch
from handlers.web.server import WebServer
from orchestrator.settings import KafkaSettings


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def answers_200_soon(url: str, *, within: float = 10.0) -> bool:
    """Whether `/healthz` says alive within *within* seconds. A machine busy with other work
    can wake a heartbeat late by itself, so a healthy loop is given a few tries, not one."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if (await asyncio.to_thread(get, url))[0] == 200:
            return True
        await asyncio.sleep(0.3)
    return False


async def test_a_probe_waiting_behind_a_blocked_loop_is_told_the_loop_stalled() -> None:
    app = new_app(KafkaSettings(group_id="health-unit"))
    watch = HealthWatch(app, loop_stall=1.0, progress_stall=300.0)
    server = WebServer(host="127.0.0.1", port=0, routes=[health.routes(watch)])
    await watch.start()
    await server.start()
    try:
        await asyncio.sleep(0.6)  # a heartbeat or two
        assert await answers_200_soon(f"{server.url}/healthz")

        with ThreadPoolExecutor(1) as kubelet:
            # Asked 0.2 s into 2.5 s of synchronous work holding the loop (a wedged handler).
            waiting = kubelet.submit(lambda: (time.sleep(0.2), get(f"{server.url}/healthz"))[1])
            time.sleep(2.5)
            status, body = await asyncio.wrap_future(waiting)
        assert status == 503
        assert "event loop stalled" in body["problems"][0]

        assert await answers_200_soon(f"{server.url}/healthz")  # the loop beats on time again
    finally:
        await server.stop()
        await watch.stop()


@dataclass
class StandInConsumer:
    """What the watch reads from faust's consumer: assignment, offsets, commits."""

    ends: dict[TP, int]
    _committed_offset: dict[TP, int] = field(default_factory=dict)
    starts: dict[TP, int] = field(default_factory=dict)

    def assignment(self) -> set[TP]:
        return set(self.ends)

    async def highwaters(self, *partitions: TP) -> dict[TP, int]:
        return {tp: self.ends[tp] for tp in partitions}

    async def earliest_offsets(self, *partitions: TP) -> dict[TP, int]:
        return {tp: self.starts.get(tp, 0) for tp in partitions}


async def test_a_consumer_that_commits_nothing_while_behind_fails_liveness_after_the_limit() -> (
    None
):
    tp = TP("tuneloop.events", 0)
    consumer = StandInConsumer(ends={tp: 10}, _committed_offset={tp: 4})
    now = [1000.0]
    watch = HealthWatch(
        SimpleNamespace(consumer=consumer),  # type: ignore[arg-type]
        loop_stall=3600.0,
        progress_stall=60.0,
        monotonic=lambda: now[0],
    )
    await watch.measure_lag()
    assert watch.total_lag == 6
    assert watch.liveness().ok

    now[0] += 59
    await watch.measure_lag()
    assert watch.liveness().ok  # behind, but not for long enough

    now[0] += 2
    await watch.measure_lag()
    (problem,) = watch.liveness().problems
    assert "committed nothing for 61s with 6 records of lag" in problem

    consumer._committed_offset[tp] = 7  # it moves again
    await watch.measure_lag()
    assert watch.liveness().ok


async def test_a_consumer_with_no_lag_is_alive_however_long_it_has_been_idle() -> None:
    tp = TP("tuneloop.events", 0)
    consumer = StandInConsumer(ends={tp: 5}, _committed_offset={tp: 5})
    now = [0.0]
    watch = HealthWatch(
        SimpleNamespace(consumer=consumer),  # type: ignore[arg-type]
        loop_stall=1e9,
        progress_stall=60.0,
        monotonic=lambda: now[0],
    )
    for _ in range(5):
        now[0] += 3600
        await watch.measure_lag()
    assert watch.total_lag == 0
    assert watch.liveness().ok


def test_a_worker_not_yet_assigned_partitions_nor_recovered_is_not_ready() -> None:
    app = new_app(KafkaSettings(group_id="readiness-unit"))
    watch = HealthWatch(app, loop_stall=10.0, progress_stall=300.0)
    problems = watch.readiness().problems
    assert "no partitions assigned yet" in problems
    assert "tables are being recovered from their changelogs" in problems


async def test_changelogs_are_not_lag_and_an_uncommitted_partition_counts_from_its_first_record():
    changelog = TP("tuneloop-tuneloop-rule-state-changelog", 0)
    trimmed = TP("tuneloop.events", 0)  # retention removed offsets 0..99
    fresh = TP("tuneloop.events", 1)
    consumer = StandInConsumer(
        ends={changelog: 500, trimmed: 100, fresh: 3}, starts={trimmed: 100, fresh: 0}
    )
    app = SimpleNamespace(
        consumer=consumer, tables=SimpleNamespace(changelog_topics={changelog.topic})
    )
    watch = HealthWatch(app, loop_stall=10.0, progress_stall=60.0)  # type: ignore[arg-type]
    await watch.measure_lag()
    lags = {(p.topic, p.partition): p.lag for p in watch.partitions}
    assert lags == {("tuneloop.events", 0): 0, ("tuneloop.events", 1): 3}

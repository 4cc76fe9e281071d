"""`/healthz` and `/readyz`: is this worker alive, and may it be sent work?

The composition root (`handlers/app.py`) creates one `HealthWatch` per worker, adds it to the
faust App (it runs two small tasks while the App runs) and gives `routes(watch)` to the web
server (`handlers/web/server.py`).

- **Alive** (`/healthz`, the liveness probe) unless the event loop has stalled (a heartbeat
  task measures how late each of its wake-ups is: a loop blocked by synchronous work wakes
  it late, and a probe queued behind the block is answered with the stall it waited through)
  or the consumer has made no progress while its partitions have lag (nothing committed for
  `health_progress_stall` seconds while the broker holds records it has not processed). A
  loop that is blocked for good cannot answer at all: the probe's own timeout fails it.
- **Ready** (`/readyz`, the readiness probe) once the consumer group has assigned this
  worker its partitions and faust has recovered the tables from their changelogs, and while
  no rebalance is under way.

Both answer `200` with `ok` or `503` with the reasons, as JSON.

Lag is measured here, from the broker's end offsets and the group's committed offsets of the
assigned partitions (faust's, and those of stage 1 of the intake, which reads the input
topics in a group of its own: `more_lag`), every few seconds; `/metrics` shows the same numbers
(`handlers/web/metrics.py`), so a scrape never waits on the broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import faust
import structlog
from aiohttp import web
from mode import Service

log = structlog.get_logger("tuneloop.health")

HEARTBEAT_SECONDS = 0.5
"""How often the heartbeat wakes; a stall shorter than this cannot be told from a busy loop."""
LAG_POLL_SECONDS = 5.0
"""How often the end offsets are asked for (one small request to the broker)."""


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One assigned input or internal partition: what the broker holds, what is done."""

    topic: str
    partition: int
    end_offset: int
    committed: int | None
    """The group's committed offset (the next record to process); before anything was
    committed, the log's first offset."""

    @property
    def lag(self) -> int:
        """Records the broker holds that this worker has not committed as processed."""
        return max(0, self.end_offset - (self.committed or 0))


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer of a probe: ok, or the reasons it is not."""

    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


class HealthWatch(Service):
    """Watches one worker's loop and consumer; answers liveness and readiness.

    Args:
        app: the worker's faust App (its consumer, tables and rebalance state are read).
        loop_stall: seconds without a heartbeat (or a heartbeat that late) that fail liveness.
        progress_stall: seconds without a commit while there is lag that fail liveness.
        monotonic: the clock for both (a test passes its own).
        more_lag: the lag of partitions faust's consumer does not read (stage 1's).
    """

    def __init__(
        self,
        app: faust.App,
        *,
        loop_stall: float,
        progress_stall: float,
        monotonic: Callable[[], float] = time.monotonic,
        more_lag: Callable[[], Awaitable[Sequence[PartitionLag]]] | None = None,
        **kwargs: Any,
    ) -> None:
        self.app = app
        self.more_lag = more_lag
        self.loop_stall = loop_stall
        self.progress_stall = progress_stall
        self.monotonic = monotonic
        started = monotonic()
        self.last_beat = started
        self.last_beat_late = 0.0
        self.partitions: tuple[PartitionLag, ...] = ()
        self._last_committed: Mapping[tuple[str, int], int | None] = {}
        self.last_progress = started
        super().__init__(**kwargs)

    # --- what the probes answer -------------------------------------------------------------

    def liveness(self) -> Verdict:
        """Alive unless the loop stalled or the consumer is stuck behind its lag."""
        now = self.monotonic()
        problems = []
        stalled = max(now - self.last_beat - HEARTBEAT_SECONDS, self.last_beat_late)
        if stalled > self.loop_stall:
            problems.append(f"event loop stalled for {stalled:.1f}s (limit {self.loop_stall}s)")
        lag = self.total_lag
        idle = now - self.last_progress
        if lag > 0 and idle > self.progress_stall:
            problems.append(
                f"consumer committed nothing for {idle:.0f}s with {lag} records of lag"
                f" (limit {self.progress_stall}s)"
            )
        return Verdict(tuple(problems))

    def readiness(self) -> Verdict:
        """Ready once partitions are assigned and the tables recovered, outside rebalances."""
        app: Any = self.app  # faust's attributes are loosely typed
        problems = []
        if not app.rebalancing_count:
            problems.append("no partitions assigned yet")
        if app.rebalancing:
            problems.append("the consumer group is rebalancing")
        recovery = app.tables.recovery
        if not recovery.completed.is_set() or app.in_recovery:
            problems.append("tables are being recovered from their changelogs")
        return Verdict(tuple(problems))

    @property
    def total_lag(self) -> int:
        return sum(partition.lag for partition in self.partitions)

    # --- what runs while the App runs -------------------------------------------------------

    @Service.task
    async def _beat(self) -> None:
        while not self.should_stop:
            before = self.monotonic()
            await asyncio.sleep(HEARTBEAT_SECONDS)
            now = self.monotonic()
            self.last_beat_late = max(0.0, now - before - HEARTBEAT_SECONDS)
            self.last_beat = now

    @Service.task
    async def _measure_lag(self) -> None:
        while not self.should_stop:
            try:
                await self.measure_lag()
            except Exception as exc:  # a broker hiccup must not end the measuring
                log.info("lag_unmeasured", error=repr(exc))
            await asyncio.sleep(LAG_POLL_SECONDS)

    async def measure_lag(self) -> None:
        """Ask the broker for the end offsets of the assigned partitions, once."""
        app: Any = self.app
        consumer = app.consumer
        try:
            assigned = consumer.assignment()
        except Exception:  # not started yet (faust raises ConsumerNotStarted)
            assigned = set()
        # Changelog partitions are assigned too, but read only to recover tables and never
        # committed: they are not work waiting to be done.
        tables = getattr(app, "tables", None)
        changelogs = set(tables.changelog_topics) if tables is not None else set()
        consumed = sorted(tp for tp in assigned if tp.topic not in changelogs)
        ends = await consumer.highwaters(*consumed) if consumed else {}
        # faust keeps the committed offsets it read at assignment and wrote since in this
        # mapping; its public monitor sees only the ones written by this process.
        committed = dict(getattr(consumer, "_committed_offset", {}))
        never = [tp for tp in consumed if committed.get(tp) is None]
        if never:
            # Nothing committed yet: the work is what the log holds from its first offset on
            # (retention may have removed older records, which are no one's work).
            committed.update(await consumer.earliest_offsets(*never))
        partitions = tuple(
            PartitionLag(
                topic=tp.topic,
                partition=tp.partition,
                end_offset=int(ends.get(tp, 0)),
                committed=committed.get(tp),
            )
            for tp in consumed
        )
        if self.more_lag is not None:
            partitions += tuple(await self.more_lag())
        positions = {(p.topic, p.partition): p.committed for p in partitions}
        if positions != self._last_committed or not any(p.lag for p in partitions):
            self.last_progress = self.monotonic()
        self._last_committed = positions
        self.partitions = partitions


def routes(watch: HealthWatch) -> web.RouteTableDef:
    """`/healthz` and `/readyz` of *watch*."""
    table = web.RouteTableDef()

    @table.get("/healthz")
    async def healthz(request: web.Request) -> web.Response:
        return _answer(watch.liveness())

    @table.get("/readyz")
    async def readyz(request: web.Request) -> web.Response:
        return _answer(watch.readiness())

    return table


def _answer(verdict: Verdict) -> web.Response:
    body = {"status": "ok" if verdict.ok else "failing", "problems": list(verdict.problems)}
    return web.json_response(body, status=200 if verdict.ok else 503)

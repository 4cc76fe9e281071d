"""The dashboard's aiohttp handlers, and `install_dashboard`, which the composition root calls.

Every route is a GET: nothing here can launch, cancel or change anything, and each page says
so. The worker's one web server mounts the routes under `/dashboard` (`Dashboard.routes`);
a test may add the same table to its own `aiohttp.web.Application`.

Pages:
    /dashboard/rules          each rule, its version, and each key's window, joins, cooldown,
                              budget left and job in flight (the worker's key-state table, read)
    /dashboard/decisions      decision records, newest first; ?rule= &key= &outcome= filter
    /dashboard/jobs           jobs: phase, progress, ETA, metrics, decision, completion event
    /dashboard/dead-letters   code, message, origin, and the original record to download
    /dashboard/stream         server-sent events naming what changed (for the live tables)
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

import faust
from aiohttp import web

from handlers.dashboard import pages
from handlers.dashboard.board import DEFAULT_HISTORY, Board, DeadLetterRow
from handlers.dashboard.tailing import tail_topics
from orchestrator.clock import Clock
from orchestrator.ledger import Outcome
from orchestrator.rules.engine import KeyState, RuleSet
from orchestrator.settings import KafkaSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class KeyStates(Protocol):
    """Read-only view of the worker's key-state table: the dashboard can list, never save."""

    def items(self) -> list[tuple[str, KeyState]]: ...


class Dashboard:
    """The pages of one worker: its rules and key states, and the board the feeds fill."""

    def __init__(
        self,
        *,
        board: Board,
        rules: Callable[[], RuleSet],
        key_states: KeyStates,
        clock: Clock,
    ) -> None:
        self.board = board
        self.wanted = asyncio.Event()
        """Set by the first request: the feed reads Kafka only once someone looks."""
        self._rules = rules
        self._key_states = key_states
        self._clock = clock

    def routes(self) -> web.RouteTableDef:
        """Every page, under `/dashboard`, all GET: what the worker's web server mounts."""
        table = web.RouteTableDef()
        prefix = pages.PREFIX
        for path, handler in (
            ("", self._home),
            ("/", self._home),
            ("/rules", self.rules),
            ("/decisions", self.decisions),
            ("/jobs", self.jobs),
            ("/jobs/{name}/completion.json", self.completion),
            ("/dead-letters", self.dead_letters),
            ("/dead-letters/{position}/record.json", self.dead_letter),
            ("/dead-letters/{position}/value", self.dead_letter_value),
            ("/stream", self.stream),
        ):
            table.get(prefix + path)(self._waking(handler))
        return table

    def _waking(self, handler: Handler) -> Handler:
        """*handler*, which first lets the feed start: someone is looking."""

        async def woken(request: web.Request) -> web.StreamResponse:
            self.wanted.set()
            return await handler(request)

        return woken

    async def _home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(pages.PREFIX + "/rules")

    async def rules(self, request: web.Request) -> web.Response:
        rules, states, now = self._rules(), self._key_states.items(), self._clock.now()
        if request.query.get("fragment") == "rows":
            return _html(pages.rules_rows(rules, states, now=now))
        return _html(pages.rules_page(rules, states, now=now))

    async def decisions(self, request: web.Request) -> web.Response:
        rule, key, outcome = (request.query.get(name, "") for name in ("rule", "key", "outcome"))
        rows = self.board.decisions(rule=rule, key=key, outcome=outcome)
        if request.query.get("fragment") == "rows":
            return _html(pages.decisions_rows(rows))
        return _html(
            pages.decisions_page(
                rows, rule=rule, key=key, outcome=outcome, outcomes=self._outcomes()
            )
        )

    async def jobs(self, request: web.Request) -> web.Response:
        rows = self.board.jobs()
        if request.query.get("fragment") == "rows":
            return _html(pages.jobs_rows(rows))
        return _html(pages.jobs_page(rows))

    async def completion(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        job = next((row for row in self.board.jobs() if row.name == name), None)
        if job is None or not job.completion_event:
            raise web.HTTPNotFound(text=f"no completion event of job {name!r} on this dashboard")
        return web.json_response(job.completion_event)

    async def dead_letters(self, request: web.Request) -> web.Response:
        rows = self.board.dead_letters()
        if request.query.get("fragment") == "rows":
            return _html(pages.dead_letters_rows(rows))
        return _html(pages.dead_letters_page(rows))

    async def dead_letter(self, request: web.Request) -> web.Response:
        """The dead letter as JSON: the reason, and key, value and headers in base64."""
        row = self._dead_letter(request)
        body = {
            "code": row.code,
            "message": row.message,
            "origin": row.origin,
            "dead_lettered_at": row.at,
            "key_base64": _b64(row.key),
            "value_base64": _b64(row.value),
            "headers": [{"name": name, "value_base64": _b64(value)} for name, value in row.headers],
        }
        return web.Response(
            text=json.dumps(body, indent=2),
            content_type="application/json",
            headers=_attachment(f"dead-letter-{row.position}.json"),
        )

    async def dead_letter_value(self, request: web.Request) -> web.Response:
        """The original record's value, byte for byte."""
        row = self._dead_letter(request)
        return web.Response(
            body=row.value or b"",
            content_type="application/octet-stream",
            headers=_attachment(f"dead-letter-{row.position}.bin"),
        )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: one event per change, named `decisions`, `jobs` or
        `dead-letters`, until the page goes away."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(b": connected\n\n")
        try:
            async for change in self.board.subscribe():
                await response.write(f"event: {change}\ndata: {change}\n\n".encode())
        except (ConnectionResetError, RuntimeError):
            pass  # the page closed; its subscription ends with this generator
        return response

    def _dead_letter(self, request: web.Request) -> DeadLetterRow:
        position = request.match_info["position"]
        row = self.board.dead_letter(position)
        if row is None:
            raise web.HTTPNotFound(text=f"no dead letter {position!r} on this dashboard")
        return row

    def _outcomes(self) -> Sequence[str]:
        """The outcomes the filter offers: the engine's, and any new one the records show."""
        seen = {row.outcome for row in self.board.decisions()}
        return sorted({outcome.value for outcome in Outcome} | seen)


def install_dashboard(
    app: faust.App,
    kafka: KafkaSettings,
    *,
    rules: Callable[[], RuleSet],
    key_states: KeyStates,
    clock: Clock,
    history: int = DEFAULT_HISTORY,
) -> Dashboard:
    """A dashboard of the worker on *app*, fed from *kafka*'s audit, output and DLQ topics by a
    task that runs with *app*. Called once by the composition root."""
    dashboard = Dashboard(
        board=Board(history=history), rules=rules, key_states=key_states, clock=clock
    )

    async def feed_dashboard() -> None:
        # A worker nobody looks at reads no audit records: the feed starts on the first page.
        try:
            await dashboard.wanted.wait()
            await tail_topics(kafka, dashboard.board, history=history)
        finally:  # the App is stopping (its tasks are cancelled): let live pages go
            dashboard.board.close()

    cast(Any, app).task(feed_dashboard)  # faust's decorators are untyped
    return dashboard


def _html(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/html", charset="utf-8")


def _b64(value: bytes | None) -> str | None:
    return base64.b64encode(value).decode("ascii") if value is not None else None


def _attachment(filename: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{filename}"'}

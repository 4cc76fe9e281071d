"""The dashboard's pages, served by aiohttp's test server from a board filled by hand.

The feeds (Kafka) are left out here: the browser tests (tests/browser/) run the dashboard of a
worker on the real broker. Expected values are written out, never read from the pages' code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from handlers.dashboard import Dashboard
from handlers.dashboard.board import Board, DeadLetterRow
from orchestrator.clock import FixedClock
from orchestrator.events import CloudEvent
from orchestrator.jobs.model import JobPhase, JobRef, Observation
from orchestrator.rules import loading
from orchestrator.rules.engine import KeyState
from orchestrator.rules.state import Entry, Joined, RuleState

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

RULES = """
runtimes: [torch-distributed]
rules:
  - name: rows-retrain
    on:
      type: io.tuneloop.data.arrived.v1
    key: "event.data.dataset_id"
    window: 6h
    count: 3
    sum: {of: "event.data.rows", at_least: 1000}
    cooldown: 1h
    max_launches_per_day: 3
    launch:
      runtime: torch-distributed
      base_model: tiny
      dataset: "file:///data/${ key }.jsonl"
"""

PAGES = (
    "/dashboard/rules",
    "/dashboard/decisions",
    "/dashboard/jobs",
    "/dashboard/dead-letters",
)


class TwoKeys:
    """The worker's key-state table, as the dashboard reads it."""

    def items(self) -> list[tuple[str, KeyState]]:
        busy = RuleState(
            entries=(
                Entry(event_id="e1", identity="s/e1", time=NOW, amount=400.0),
                Entry(event_id="e2", identity="s/e2", time=NOW, amount=250.0),
            ),
            joined={"io.tuneloop.drift.detected.v1": Joined(event={}, identity="s/j", time=NOW)},
            last_launch=NOW - timedelta(minutes=20),
            launches=(NOW - timedelta(hours=30), NOW - timedelta(minutes=20)),
            running="rows-retrain-ds-1-abc",
        )
        return [
            ("ds-1", KeyState(rules={"rows-retrain": busy})),
            ("ds-2", KeyState(rules={"rows-retrain": RuleState()})),
        ]


def decision(n: int, *, outcome: str, reason: str | None = None, key: str = "ds-1") -> dict:
    return {
        "decision_id": f"d-{n}",
        "outcome": outcome,
        "reason": reason,
        "rule": "rows-retrain",
        "rule_version": "v1",
        "key": key,
        "time": f"2026-12-03T11:0{n}:00Z",
        "event_ids": [f"ev-{n}"],
        "message": f"message {n}",
        "job_name": None,
    }


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[TestClient, Board]]:
    (tmp_path / "rules.yaml").write_text(RULES)
    rules = loading.load_rules([tmp_path / "rules.yaml"])
    board = Board(history=50)
    dashboard = Dashboard(
        board=board, rules=lambda: rules, key_states=TwoKeys(), clock=FixedClock(NOW)
    )
    application = web.Application()
    application.add_routes(dashboard.routes())
    async with TestClient(TestServer(application)) as client:
        yield client, board


async def text_of(client: TestClient, path: str) -> str:
    response = await client.get(path)
    assert response.status == 200, path
    return await response.text()


async def test_every_page_says_it_is_read_only_and_has_no_form_that_posts(served) -> None:
    client, _ = served
    for path in PAGES:
        page = await text_of(client, path)
        assert "Read-only" in page, path
        assert "post" not in page.lower(), path


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_no_route_of_the_dashboard_accepts_a_change(served, method: str) -> None:
    client, _ = served
    for path in (*PAGES, "/dashboard/stream"):
        response = await client.request(method, path)
        assert response.status == 405, (method, path)


async def test_the_rules_page_shows_each_keys_window_joins_cooldown_budget_and_job(served) -> None:
    client, _ = served
    page = await text_of(client, "/dashboard/rules")
    assert "rows-retrain" in page
    assert (
        "<td>ds-1</td><td>2</td><td>650</td><td>io.tuneloop.drift.detected.v1</td>"
        "<td>2026-12-03T12:40:00Z</td><td>2</td>"
    ) in page
    assert "rows-retrain-ds-1-abc" in page
    assert "<td>ds-2</td><td>0</td><td>0</td><td>—</td><td>—</td><td>3</td><td>—</td>" in page


async def test_decisions_are_newest_first_and_filter_by_outcome_key_and_rule(served) -> None:
    client, board = served
    board.add_decision(decision(1, outcome="accumulate"), event_id="d-1")
    board.add_decision(decision(2, outcome="suppress", reason="cooldown", key="ds-2"), event_id="x")
    board.add_decision(decision(3, outcome="launch"), event_id="d-3")

    everything = await text_of(client, "/dashboard/decisions")
    assert everything.index("ev-3") < everything.index("ev-2") < everything.index("ev-1")

    suppressed = await text_of(client, "/dashboard/decisions?outcome=suppress")
    assert "ev-2" in suppressed
    assert "cooldown" in suppressed
    assert "ev-1" not in suppressed
    assert "ev-3" not in suppressed

    by_key = await text_of(client, "/dashboard/decisions?key=ds-1&rule=rows-retrain")
    assert "ev-1" in by_key
    assert "ev-3" in by_key
    assert "ev-2" not in by_key
    assert "ev-1" not in await text_of(client, "/dashboard/decisions?rule=another")


async def test_an_outcome_the_page_has_never_heard_of_is_shown_and_offered_as_a_filter(
    served,
) -> None:
    client, board = served
    board.add_decision(decision(4, outcome="ignore", reason="where-false"), event_id="d-4")
    page = await text_of(client, "/dashboard/decisions?outcome=ignore")
    assert "where-false" in page
    assert "ev-4" in page
    assert '<option value="ignore" selected>' in page


async def test_what_a_producer_wrote_is_shown_as_text_never_run(served) -> None:
    client, board = served
    board.add_decision(
        {**decision(5, outcome="error"), "message": "<script>alert(1)</script>"}, event_id="d-5"
    )
    page = await text_of(client, "/dashboard/decisions")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


async def test_a_job_shows_its_progress_eta_metrics_and_links_to_its_decision_and_completion(
    served,
) -> None:
    client, board = served
    board.add_decision(
        {**decision(6, outcome="launch"), "job_name": "rows-retrain-ds-1-abc"}, event_id="d-6"
    )
    board.observe(
        Observation(
            job=JobRef(name="rows-retrain-ds-1-abc", backend="local"),
            phase=JobPhase.RUNNING,
            at=NOW,
            reason="Progress",
            progress={
                "step": 3,
                "total_steps": 12,
                "eta_seconds": 95,
                "loss": 2.5,
                "learning_rate": 0.0002,
            },
        )
    )
    running = await text_of(client, "/dashboard/jobs")
    assert "Running" in running
    assert "25%" in running
    assert "3/12" in running
    assert "1:35" in running
    assert "loss = 2.5" in running
    assert "learning_rate = 0.0002" in running
    assert "step =" not in running  # how far shows as the bar, not as a metric
    assert 'href="/dashboard/decisions#d-6"' in running
    assert "Sweeps" in running

    completed = CloudEvent(
        id="rows-retrain-ds-1-abc.completed",
        source="/tuneloop",
        type="io.tuneloop.finetune.completed.v1",
        subject="rows-retrain-ds-1-abc",
        time=NOW,
        datacontenttype="application/json",
        data={
            "job": "rows-retrain-ds-1-abc",
            "phase": "Succeeded",
            "metrics": {"eval_loss": 1.25, "base_model": "tiny"},
        },
    )
    board.add_job_event(completed)
    finished = await text_of(client, "/dashboard/jobs")
    assert "Succeeded" in finished
    assert "eval_loss = 1.25" in finished
    assert "base_model" not in finished  # words stay in the completion event, linked
    link = "/dashboard/jobs/rows-retrain-ds-1-abc/completion.json"
    assert link in finished
    announced = await (await client.get(link)).json()
    assert announced["id"] == "rows-retrain-ds-1-abc.completed"
    assert announced["data"]["metrics"] == {"eval_loss": 1.25, "base_model": "tiny"}


async def test_a_dead_letter_shows_its_code_and_origin_and_downloads_the_original_bytes(
    served,
) -> None:
    client, board = served
    original = b'{"specversion": "1.0", "id": 7'  # cut short: not JSON
    board.add_dead_letter(
        DeadLetterRow(
            code="invalid-json",
            message="the value is not JSON",
            origin="events/0@41",
            at="2026-12-03T11:59:00Z",
            position="0-7",
            key=b"k",
            value=original,
            headers=(("content-type", b"application/cloudevents+json"),),
        )
    )
    page = await text_of(client, "/dashboard/dead-letters")
    assert "invalid-json" in page
    assert "the value is not JSON" in page
    assert "events/0@41" in page

    value = await client.get("/dashboard/dead-letters/0-7/value")
    assert await value.read() == original
    assert "attachment" in value.headers["Content-Disposition"]
    record = json.loads(await (await client.get("/dashboard/dead-letters/0-7/record.json")).text())
    assert record["code"] == "invalid-json"
    assert record["value_base64"] == "eyJzcGVjdmVyc2lvbiI6ICIxLjAiLCAiaWQiOiA3"
    assert record["headers"] == [
        {"name": "content-type", "value_base64": "YXBwbGljYXRpb24vY2xvdWRldmVudHMranNvbg=="}
    ]
    assert (await client.get("/dashboard/dead-letters/9-9/value")).status == 404


async def test_the_event_stream_names_each_change_as_it_happens(served) -> None:
    client, board = served
    response = await client.get("/dashboard/stream")
    assert response.headers["Content-Type"] == "text/event-stream"
    assert await response.content.readline() == b": connected\n"
    await response.content.readline()
    await asyncio.sleep(0.05)  # the stream's subscription is made once the first line is out
    board.add_decision(decision(8, outcome="accumulate"), event_id="d-8")
    line = await asyncio.wait_for(response.content.readline(), timeout=5)
    assert line == b"event: decisions\n"
    response.close()


async def test_an_open_event_stream_ends_when_the_board_closes(served) -> None:
    client, board = served
    response = await client.get("/dashboard/stream")
    assert await response.content.readline() == b": connected\n"
    await asyncio.sleep(0.05)
    board.close()
    rest = await asyncio.wait_for(response.content.read(), timeout=5)
    assert rest == b"\n"  # the blank line after the comment, then the end of the stream


async def test_a_live_table_reloads_as_rows_only(served) -> None:
    client, board = served
    board.add_decision(decision(9, outcome="accumulate"), event_id="d-9")
    rows = await text_of(client, "/dashboard/decisions?fragment=rows")
    assert "ev-9" in rows
    assert "<html" not in rows

"""`tuneloop explain --event` on the audit topic a real worker wrote on the real broker: for
any event, every rule that named its type and what it did, including why it did not consider
the event (a source glob that did not match, a false `where`, a key that failed). The events
and rules below are built so that each rule meets each case once; the expected answers come
from that construction, not from the engine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from handlers.cli.main import app
from orchestrator.clock import SystemClock
from orchestrator.ledger import DECISION_EVENT_TYPE
from orchestrator.testing import InMemoryBackend
from tests.e2e.test_worker_loop import drift
from tests.fixtures.topics import read_topic, send_events
from tests.fixtures.waiting import wait_for
from tests.fixtures.worker import build_test_worker, running, worker_settings

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

LAUNCH = """
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""
RULES = (
    "runtimes: [torch-distributed]\nrules:\n"
    + """
  - name: monitors-only
    on: {type: io.tuneloop.drift.detected.v1, source: "/monitors/*"}
    key: "event.data.model_id"
    count: 5
    window: 1h
"""
    + LAUNCH
    + """
  - name: big-drift
    on: {type: io.tuneloop.drift.detected.v1, where: "event.data.value > 0.9"}
    key: "event.data.model_id"
    count: 5
    window: 1h
"""
    + LAUNCH
    + """
  - name: by-region
    on: {type: io.tuneloop.drift.detected.v1}
    key: "event.data.region"
    count: 5
    window: 1h
"""
    + LAUNCH
)
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"

# From elsewhere, a small drift, in a region: only `by-region` considers it.
_SMALL = drift(1, value=0.5)
STRANGER = replace(_SMALL, id="stranger", source="/elsewhere", data={**_SMALL.data, "region": "eu"})
# From a monitor, a big drift, no region: `by-region` cannot key it; the others count it.
NO_REGION = replace(drift(2, value=0.95), id="no-region", extensions={"traceparent": TRACEPARENT})
# Data without the `value` its type's schema requires: the intake dead-letters it with
# `data.schema_mismatch` (docs/dead-letters.md), and no rule ever sees it.
_NO_VALUE = drift(3)
SCHEMALESS = replace(
    _NO_VALUE,
    id="schemaless",
    data={k: v for k, v in _NO_VALUE.data.items() if k != "value"},
)

runner = CliRunner()


@pytest.fixture
def topics(new_topic: Any) -> dict[str, str]:
    return {name: new_topic(name) for name in ("in", "out", "audit", "dlq")}


def explain(topics: dict[str, str], bootstrap: str, *args: str) -> Any:
    return runner.invoke(
        app,
        [
            "explain",
            "--bootstrap",
            bootstrap,
            "--topic",
            topics["audit"],
            "--dead-letters",
            topics["dlq"],
            *args,
        ],
        catch_exceptions=False,
    )


async def test_explain_event_answers_for_every_rule_that_named_the_events_type(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    backend = InMemoryBackend(SystemClock())
    worker = build_test_worker(
        worker_settings(kafka_bootstrap, topics), rules=rules, backend=backend
    )
    decisions: list[Any] = []

    async def six_decisions() -> bool:
        nonlocal decisions
        audit = await read_topic(kafka_bootstrap, topics["audit"])
        decisions = [e for e in audit if e.type == DECISION_EVENT_TYPE]
        return len(decisions) >= 6

    async with running(worker):
        await send_events(kafka_bootstrap, topics["in"], [STRANGER, NO_REGION, SCHEMALESS])
        # Three rules, two events: six records (three each, one per rule).
        await wait_for(six_decisions, what="six decision records", timeout=90, interval=0.5)
    assert len(decisions) == 6, [e.data for e in decisions]

    stranger = explain(topics, kafka_bootstrap, "--event", "stranger")
    assert stranger.exit_code == 0, stranger.output
    lines = stranger.stdout.splitlines()
    assert lines[0] == "Event 'stranger':"
    said = sorted(line.strip() for line in lines if line.startswith("  rule "))
    assert said == [
        "rule 'big-drift': ignored it (where-false)",
        "rule 'by-region' for key 'eu': counted it",
        "rule 'monitors-only': ignored it (source-mismatch)",
    ]
    assert "source '/elsewhere' matches none of the rule's sources ('/monitors/*')" in (
        stranger.stdout
    )
    assert "`where` is false: `event.data.value > 0.9`" in stranger.stdout

    no_region = explain(topics, kafka_bootstrap, "--event", "no-region", "--json")
    assert no_region.exit_code == 0, no_region.output
    records = [json.loads(line) for line in no_region.stdout.splitlines()]
    assert sorted((r["rule"], r["key"], r["outcome"], r["reason"]) for r in records) == [
        ("big-drift", "m1", "accumulate", None),
        ("by-region", "", "error", "expression-error"),
        ("monitors-only", "m1", "accumulate", None),
    ]
    # The producer's trace id is on every decision about its event.
    assert {r["traceparent"] for r in records} == {TRACEPARENT}

    schemaless = explain(topics, kafka_bootstrap, "--event", "schemaless")
    assert schemaless.exit_code == 0, schemaless.output
    assert schemaless.stdout.startswith(
        "Event 'schemaless' was dead-lettered by the intake: data.schema_mismatch: "
    )
    assert f"(from {topics['in']}@0:2)" in schemaless.stdout  # the third record sent

    unknown = explain(topics, kafka_bootstrap, "--event", "never-sent")
    assert unknown.exit_code == 1
    assert "no decisions about event 'never-sent'" in unknown.stdout

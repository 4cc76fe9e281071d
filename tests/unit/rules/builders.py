"""Small builders for rule-engine tests: rule files from text, events at minute offsets."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.events import CloudEvent
from orchestrator.rules.model import RuleSet
from orchestrator.rules.parsing import Source, parse_files

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
DRIFT = "io.tuneloop.drift.detected.v1"
DATA = "io.tuneloop.data.arrived.v1"

LAUNCH = """
launch:
  runtime: torch-distributed
  base_model: HuggingFaceTB/SmolLM2-135M
  dataset: "s3://data/${ key }.jsonl"
"""


def rules_from(text: str, *, header: str = "") -> RuleSet:
    """Parse a rule file given as (indented) YAML text."""
    return parse_files([Source("rules.yaml", textwrap.dedent(header) + textwrap.dedent(text))])


def one_rule(body: str, *, header: str = "", launch: str = LAUNCH) -> RuleSet:
    """A rule file with one rule `r` on drift events keyed by `event.data.model_id`."""
    text = (
        "rules:\n  - name: r\n    on: {type: "
        + DRIFT
        + "}\n    key: event.data.model_id\n"
        + textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", "    ")
        + textwrap.indent(textwrap.dedent(launch).strip("\n") + "\n", "    ")
    )
    return parse_files([Source("rules.yaml", textwrap.dedent(header) + text)])


def drift(n: int | str, minute: float, *, model: str = "m1", **data: Any) -> CloudEvent:
    return CloudEvent(
        id=f"d{n}",
        source="/monitors/eval",
        type=DRIFT,
        time=T0 + timedelta(minutes=minute),
        data={"model_id": model, "value": 0.5, "threshold": 0.2, **data},
    )


def arrived(n: int | str, minute: float, *, model: str = "m1", **data: Any) -> CloudEvent:
    return CloudEvent(
        id=f"a{n}",
        source="/ingest",
        type=DATA,
        time=T0 + timedelta(minutes=minute),
        data={"model_id": model, "uri": f"s3://data/{model}/{n}.jsonl", "rows": 100, **data},
    )


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)

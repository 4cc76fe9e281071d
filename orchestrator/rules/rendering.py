"""Rendering: the job a launch starts, from the rule's `launch` templates.

`launching.py` calls `render` once the gates let a launch through. The templates see the
completing `event`, the `key`, the `window` (count, sum, first and last time, event ids) and
the `joined` events by type; every value is type-checked, and a templated runtime must be in
the rule set's allowlist.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from orchestrator import event_json
from orchestrator.jobs.model import (
    LoraSettings,
    Resources,
    TraceContext,
    TrainingRequest,
    TrainingSettings,
)
from orchestrator.rules.expressions import Activation, event_variables
from orchestrator.rules.records import Decider
from orchestrator.rules.state import RuleState
from orchestrator.rules.templating import Template, TemplateError, check_value

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The time of a completing event that has none (templates see a timestamp, not null)."""


def render(
    decider: Decider,
    rule_state: RuleState,
    *,
    event: Mapping[str, Any],
    ids: tuple[str, ...],
    name: str,
    record_id: str,
) -> TrainingRequest:
    """The launch template rendered for the window in *rule_state*, completed by *event*.

    Args:
        decider: the rule and key launching.
        rule_state: the rule's state before the launch consumes its window.
        event: the completing event, as structured JSON.
        ids: every event id that took part (the window's and, after a wait, earlier ones).
        name: the job's deterministic name.
        record_id: the id of the launch's decision record.

    Raises:
        TemplateError: an expression failed, a value has the wrong type, or a templated
            runtime is outside the allowlist.
    """
    rule, rules, key = decider.rule, decider.rules, decider.key
    completing = event_json.from_json(event)
    completing_time = completing.event_time(_EPOCH)
    entries = rule_state.entries
    window = {
        "count": len(entries),
        "sum": sum(e.amount for e in entries),
        "first_time": entries[0].time if entries else completing_time,
        "last_time": entries[-1].time if entries else completing_time,
        "event_ids": list(ids),
    }
    joined = {
        type_name: event_variables(
            event_json.from_json(item.event), time=item.time, data_fields=None
        )
        for type_name, item in rule_state.joined.items()
    }
    activation = Activation(
        {
            "event": event_variables(completing, time=completing_time, data_fields=None),
            "key": key,
            "window": window,
            "joined": joined,
        }
    )
    launch = rule.launch

    def text(field: str, template: Template) -> Any:
        return check_value("", field, template.render(activation))

    runtime = text("runtime", launch.runtime)
    if not launch.runtime.is_literal and runtime not in rules.runtimes:
        allowed = ", ".join(sorted(rules.runtimes))
        raise TemplateError(f"runtime {runtime!r} is not in the allowlist ({allowed})")
    sections = {
        section: {
            field: check_value(section, field, template.render(activation))
            for field, template in getattr(launch, section).items()
        }
        for section in ("lora", "training", "resources")
    }
    return TrainingRequest(
        name=name,
        rule=rule.name,
        rule_version=rule.version,
        key=key,
        decision_id=record_id,
        causing_event_ids=ids,
        runtime=runtime,
        base_model=text("base_model", launch.base_model),
        dataset=text("dataset", launch.dataset),
        lora=LoraSettings(**sections["lora"]),
        training=TrainingSettings(**sections["training"]),
        resources=Resources(**sections["resources"]),
        output_uri=text("output_uri", launch.output_uri) if launch.output_uri else None,
        deadline_seconds=int(launch.deadline.total_seconds()) if launch.deadline else None,
        model_id=key,
        trace=TraceContext.of(completing.extensions),
        promotion=launch.promote,
    )

"""Where a job came from, as its MLflow run is tagged with it, and how that reaches the trainer.

The backends know the `TrainingRequest`; the trainer knows only its config. When tracking is
configured, both backends give the trainer two variables (`trainer_environment`):

    TUNELOOP_MLFLOW_TRACKING_URI   the server the trainer logs its run to
    TUNELOOP_RUN_CONTEXT           this module's `RunContext` as JSON: rule, rule version, key,
                                   decision id, causing event ids, job name

The Kubernetes backend puts them in the TrainJob's `trainer.env` (runtimes/kubernetes/
manifests.py), the local-process backend in the trainer process's environment. Pure values and
JSON; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.jobs.model import TrainingRequest

TRACKING_URI_VARIABLE = "TUNELOOP_MLFLOW_TRACKING_URI"
RUN_CONTEXT_VARIABLE = "TUNELOOP_RUN_CONTEXT"


@dataclass(frozen=True, slots=True)
class RunContext:
    """The provenance of one job: what its MLflow run, registered model and version name."""

    job: str
    rule: str
    rule_version: str
    key: str
    decision_id: str
    causing_event_ids: tuple[str, ...]

    @classmethod
    def from_request(cls, request: TrainingRequest) -> RunContext:
        return cls(
            job=request.name,
            rule=request.rule,
            rule_version=request.rule_version,
            key=request.key,
            decision_id=request.decision_id,
            causing_event_ids=tuple(request.causing_event_ids),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "job": self.job,
                "rule": self.rule,
                "rule_version": self.rule_version,
                "key": self.key,
                "decision_id": self.decision_id,
                "causing_event_ids": list(self.causing_event_ids),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> RunContext:
        """The inverse of `to_json`.

        Raises:
            ValueError: not JSON, or a field is missing or of the wrong type.
        """
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{RUN_CONTEXT_VARIABLE} is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{RUN_CONTEXT_VARIABLE} must be a JSON object")
        texts = ("job", "rule", "rule_version", "key", "decision_id")
        if any(not isinstance(data.get(name), str) for name in texts):
            raise ValueError(f"{RUN_CONTEXT_VARIABLE} needs the strings {', '.join(texts)}")
        ids = data.get("causing_event_ids", [])
        if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
            raise ValueError(f"{RUN_CONTEXT_VARIABLE}: causing_event_ids must be strings")
        return cls(
            job=data["job"],
            rule=data["rule"],
            rule_version=data["rule_version"],
            key=data["key"],
            decision_id=data["decision_id"],
            causing_event_ids=tuple(ids),
        )


def trainer_environment(request: TrainingRequest, tracking_uri: str | None) -> dict[str, str]:
    """The variables that make the trainer of *request* track its run at *tracking_uri*;
    none when tracking is off (None)."""
    if not tracking_uri:
        return {}
    return {
        TRACKING_URI_VARIABLE: tracking_uri,
        RUN_CONTEXT_VARIABLE: RunContext.from_request(request).to_json(),
    }


def run_context_of(environ: Mapping[str, str]) -> RunContext | None:
    """The context the backend gave the trainer; None when there is none or it is unreadable
    (a run is then still tracked, under the job's name alone)."""
    text = environ.get(RUN_CONTEXT_VARIABLE, "").strip()
    if not text:
        return None
    try:
        return RunContext.from_json(text)
    except ValueError:
        return None

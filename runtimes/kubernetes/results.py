"""What a finished TrainJob produced, and where it came from: read back for the completion event.

Called by `KubernetesBackend` when it sees a job reach a final phase (`result_of`) and by the
completion publisher for a job it has no record of (`context_of_trainjob`).

How the trainer reports its result (the decision, documented in docs/kubernetes.md):

1. The adapter goes to the job's output URI, which the builder fixed at launch and wrote in
   the `tuneloop.io/output-uri` annotation. On object storage (`s3://`) the trainer publishes
   it to `<output_uri>/<job>/`, manifest last, and only the trainer's own report of that
   location (its final status report, or `adapter_uri` in `result.json`) is the completion's
   `adapter_uri`: a job whose publish was not reported names no adapter rather than a guess.
   A local output URI (`file://`, a volume the trainer writes to directly) is the
   `adapter_uri` when nothing better is reported.
2. The trainer (runtimes/trainer/training.py) writes `result.json` last, in its output
   directory: `{"status": "succeeded", "adapter_dir": "/abs/path/adapter", "metrics": {...}}`
   (with `adapter_uri`, the published folder, when it published; that wins over
   `adapter_dir`). Where the
   orchestrator can read the output URI (a `file://` URI or a plain path on a shared volume),
   that file wins.
3. Where the Trainer's `TrainJobStatus` feature is on, `status.trainerStatus.metrics`
   (name/value strings) fill in metrics the file does not have. The trainer pushes them while
   it runs and, once the adapter is written, a last report with every numeric metric of
   `result.json` (`runtimes/trainer/kubeflow_status.py`), so without a shared volume the
   completion event still gets the final metrics, the evaluation's among them (`eval_loss`,
   `perplexity`, `token_accuracy`, `champion_*`, which a promotion gate compares; a
   `champion_error` value is the one that stays text). Tests without the Trainer controller
   patch that status the way its status server would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote, urlparse

from orchestrator.jobs.model import JobContext, JobResult, TraceContext
from orchestrator.jobs.promotion import PromotionPolicy
from runtimes.kubernetes import manifests
from runtimes.trainer import kubeflow_status

RESULT_FILE = "result.json"


def _number(text: str) -> float | int | str:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _status_items(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    trainer_status = (obj.get("status") or {}).get("trainerStatus") or {}
    return [item for item in trainer_status.get("metrics") or [] if "name" in item]


def status_metrics(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`status.trainerStatus.metrics` as a dict, numbers parsed (the adapter's URI apart)."""
    return {
        str(item["name"]): _number(str(item.get("value", "")))
        for item in _status_items(obj)
        if not str(item["name"]).startswith(kubeflow_status.ADAPTER_URI)
    }


def reported_adapter_uri(obj: Mapping[str, Any]) -> str | None:
    """Where the trainer said, in its final status report, that it published the adapter."""
    return kubeflow_status.adapter_uri_of(_status_items(obj))


def local_path(uri: str) -> Path | None:
    """The local path behind *uri* if the orchestrator can read it directly."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None


def read_result_file(output_uri: str) -> JobResult | None:
    """The trainer's `result.json` under *output_uri*, None if absent or unreadable here.

    Blocking file I/O: the backend calls it through `asyncio.to_thread`.
    """
    directory = local_path(output_uri)
    if directory is None:
        return None
    try:
        content = json.loads((directory / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict):
        return None
    metrics = content.get("metrics")
    adapter_uri = content.get("adapter_uri")
    adapter_dir = content.get("adapter_dir")
    if not adapter_uri and isinstance(adapter_dir, str) and adapter_dir.startswith("/"):
        adapter_uri = f"file://{adapter_dir}"
    return JobResult(
        adapter_uri=str(adapter_uri) if adapter_uri else None,
        metrics=MappingProxyType(dict(metrics) if isinstance(metrics, dict) else {}),
    )


def result_of(obj: Mapping[str, Any], *, file_result: JobResult | None = None) -> JobResult:
    """The result of the finished TrainJob *obj*: file first, then status, then annotations.

    The adapter URI is the one the trainer reported (`result.json`, else its final status
    report); only a local output URI, which the trainer wrote into itself, stands in for a
    report. An object-store output URI nobody reported is no adapter (None), never a guess.
    """
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    metrics = status_metrics(obj)
    output_uri = annotations.get(manifests.OUTPUT_URI)
    adapter_uri = reported_adapter_uri(obj)
    if adapter_uri is None and output_uri and manifests.is_local_uri(output_uri):
        adapter_uri = output_uri
    if file_result is not None:
        metrics.update(file_result.metrics)
        adapter_uri = file_result.adapter_uri or adapter_uri
    return JobResult(adapter_uri=adapter_uri, metrics=MappingProxyType(metrics))


def output_uri_of(obj: Mapping[str, Any]) -> str | None:
    """The output URI the builder fixed for this TrainJob."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(manifests.OUTPUT_URI)
    return str(value) if value else None


def context_of_trainjob(obj: Mapping[str, Any]) -> JobContext | None:
    """The provenance the builder wrote on a TrainJob, None if it is not one of ours."""
    metadata = obj.get("metadata") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    if labels.get(manifests.MANAGED_BY_LABEL) != manifests.MANAGED_BY:
        return None
    try:
        causing = json.loads(annotations.get(manifests.CAUSING_EVENT_IDS, "[]"))
    except ValueError:
        causing = []
    created = metadata.get("creationTimestamp")
    return JobContext(
        job=str(metadata.get("name", "")),
        rule=annotations.get(manifests.RULE, ""),
        rule_version=annotations.get(manifests.RULE_VERSION, ""),
        key=annotations.get(manifests.KEY, ""),
        decision_id=annotations.get(manifests.DECISION_ID, ""),
        causing_event_ids=tuple(str(i) for i in causing) if isinstance(causing, list) else (),
        runtime=annotations.get(manifests.RUNTIME, ""),
        base_model=annotations.get(manifests.BASE_MODEL, ""),
        dataset=annotations.get(manifests.DATASET, ""),
        model_id=annotations.get(manifests.MODEL),
        output_uri=annotations.get(manifests.OUTPUT_URI),
        launched_at=parse_timestamp(created),
        trace=TraceContext.of(
            {
                "traceparent": annotations.get(manifests.TRACEPARENT),
                "tracestate": annotations.get(manifests.TRACESTATE),
            }
        ),
        promotion=_promotion_of(annotations),
        champion_uri=annotations.get(manifests.CHAMPION),
    )


def _promotion_of(annotations: Mapping[str, str]) -> PromotionPolicy | None:
    """The rule's promotion policy the builder wrote, None if none (or unreadable)."""
    text = annotations.get(manifests.PROMOTION)
    if not text:
        return None
    try:
        data = json.loads(text)
        return PromotionPolicy.from_json(data) if isinstance(data, dict) else None
    except ValueError:
        return None


def parse_timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as the API server writes it, None if absent or malformed."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None

"""A running TrainJob's progress, as the Trainer's status server recorded it.

Called by `KubernetesBackend` on every TrainJob it watches. With the `TrainJobStatus` feature
gate on, trainer pods POST their progress to the Trainer (`runtimes/trainer/kubeflow_status.py`)
and the Trainer writes it to `status.trainerStatus` (Trainer v2.3.0, `TrainerStatus`):
`progressPercentage` and `estimatedRemainingSeconds` are int32s, `metrics` a list of
`{name, value}` whose values are *strings*, `lastUpdatedTime` an RFC 3339 time.

The progress mapping uses the keys the local-process backend's progress lines use (`percent`,
`eta_seconds`, and each metric by name), so the dashboard and future sweeps read one shape
whatever the backend. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtimes.kubernetes import results


def progress_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's last report on the TrainJob *obj*; empty when it has made none.

    Metrics come as numbers (the API's strings parsed), `updated_at` is `lastUpdatedTime` as
    written: two reports differ exactly when their mappings do.
    """
    trainer_status = (obj.get("status") or {}).get("trainerStatus") or {}
    progress: dict[str, Any] = dict(results.status_metrics(obj))
    if trainer_status.get("progressPercentage") is not None:
        progress["percent"] = trainer_status["progressPercentage"]
    if trainer_status.get("estimatedRemainingSeconds") is not None:
        progress["eta_seconds"] = trainer_status["estimatedRemainingSeconds"]
    if progress and trainer_status.get("lastUpdatedTime"):
        progress["updated_at"] = trainer_status["lastUpdatedTime"]
    return progress

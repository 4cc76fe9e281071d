"""Why a TrainJob failed, in words a user can act on: the controller's reason plus what the
failing container said.

Called by `KubernetesBackend` when a TrainJob reaches `Failed`. The Trainer's condition says
only that the JobSet failed; what went wrong is the trainer's to say. A failing trainer writes
its one-line reason to the container's termination-message file, which the kubelet reports as
`terminated.message` (`runtimes/trainer/__main__.py`); a container that wrote nothing there
(a crash before the trainer ran, an init container) gets its log's tail (80 lines, 2 KiB),
as the shipped runtimes set `terminationMessagePolicy: FallbackToLogsOnError`. The worker
reads it from the pod's status, which needs only `list`/`watch` on pods, not the logs API or
a shared volume. The JobSet controller deletes a failed JobSet's Jobs (and so its pods) as it
fails, often before the TrainJob says `Failed`, so the backend watches the pods while jobs
run (`pod_watching.py`) and keeps what they said. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""Label the JobSet controller puts on every pod of a JobSet; the Trainer names the JobSet
after the TrainJob."""


def failed_container(pods: Iterable[Mapping[str, Any]]) -> tuple[str, int, str] | None:
    """(pod/container, exit code, terminated message) of the first container that exited
    non-zero with a message, earliest finish first; None when no container left one."""
    found: list[tuple[str, str, int, str]] = []
    for pod in pods:
        pod_name = (pod.get("metadata") or {}).get("name", "")
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            state = container.get("state") or {}
            terminated = state.get("terminated") or (container.get("lastState") or {}).get(
                "terminated"
            )
            if not terminated or not terminated.get("exitCode") or not terminated.get("message"):
                continue
            found.append(
                (
                    str(terminated.get("finishedAt") or ""),
                    f"{pod_name}/{container.get('name', '')}",
                    int(terminated["exitCode"]),
                    str(terminated["message"]),
                )
            )
    if not found:
        return None
    _, where, code, message = min(found)
    return where, code, message


def failure_message(
    condition_message: str | None, failed: tuple[str, int, str] | None
) -> str | None:
    """The condition's message, followed by the failing container's terminated message if one
    left it (*failed* as `failed_container` gives it)."""
    if failed is None:
        return condition_message
    where, code, said = failed
    told = f"{condition_message}\n" if condition_message else ""
    return f"{told}{where} exited with code {code} and said:\n{said.rstrip()}"

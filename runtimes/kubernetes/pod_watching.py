"""The last words of our failed pods, kept while the pods themselves may already be gone.

Started by `KubernetesBackend.observe`. A kubelet writes a failed trainer container's log
tail into its `terminated.message` (`failures.py`), but a failing JobSet's controller deletes
its Jobs, and with them the pods, at about the time the Trainer marks the TrainJob `Failed`:
listing the pods then often finds none. So a daemon thread watches the namespace's pods that
carry our managed-by label and keeps, per JobSet (= TrainJob) name, the first failed
container's message it saw; the backend takes it when the TrainJob fails.

A thread, not a task: the synchronous client's watch blocks, and a daemon thread never holds
up the worker's shutdown the way a busy `asyncio.to_thread` worker would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from kubernetes import watch
from kubernetes.client import CoreV1Api

from runtimes.kubernetes import failures

log = structlog.get_logger(__name__)

_new_watch: Callable[[], Any] = watch.Watch
"""The client's (untyped) watch helper, typed here."""

KEPT = 1000
"""At most this many JobSets' last words are kept (the oldest go first): a failure the
backend never asks about (a job it did not launch) must not grow the worker forever."""


class PodFailureWatch:
    """Watches *namespace*'s pods matching *selector*; see the module docstring.

    Args:
        pods: the `CoreV1Api` to watch with.
        namespace: where the TrainJobs (and so their pods) are.
        selector: the label selector of our pods.
        timeout: seconds one watch request stays open.
    """

    def __init__(self, pods: CoreV1Api, *, namespace: str, selector: str, timeout: int) -> None:
        self._pods = pods
        self._namespace = namespace
        self._selector = selector
        self._timeout = timeout
        self._said: dict[str, tuple[str, int, str]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching (once)."""
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._run, name="tuneloop-pod-failures", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop at the end of the current watch request (the thread is a daemon)."""
        self._stopping.set()
        self._thread = None

    def take(self, jobset: str) -> tuple[str, int, str] | None:
        """(pod/container, exit code, log tail) of *jobset*'s first failed container seen,
        forgotten once taken; None if none was seen."""
        with self._lock:
            return self._said.pop(jobset, None)

    def record(self, pod: Mapping[str, Any]) -> None:
        """Keep what *pod* says, if it is the first failure seen for its JobSet."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        jobset = labels.get(failures.JOBSET_NAME_LABEL)
        failed = failures.failed_container([pod]) if jobset else None
        if jobset is None or failed is None:
            return
        with self._lock:
            if jobset in self._said:
                return
            self._said[jobset] = failed
            while len(self._said) > KEPT:
                del self._said[next(iter(self._said))]

    def _list_pods(self, **query: Any) -> Any:
        # The watch reads the model type to build from its function's docstring; this one
        # names none, so each event's pod stays the dict it was decoded into (`raw_object`).
        # Building a V1Pod cost 0.17 ms of CPU per event, 4 to 6 events per launch, for a
        # model this class never reads.
        return self._pods.list_namespaced_pod(self._namespace, **query)

    def _run(self) -> None:
        stopping = self._stopping
        delay = 1.0
        while not stopping.is_set():
            try:
                for event in _new_watch().stream(
                    self._list_pods,
                    label_selector=self._selector,
                    timeout_seconds=self._timeout,
                ):
                    if stopping.is_set():
                        return
                    raw = event.get("raw_object")
                    if isinstance(raw, Mapping):
                        self.record(raw)
                delay = 1.0
            except Exception as exc:  # the watch restarts; a failure still gets reported
                # Doubling up to a minute: a worker not allowed to watch pods (an older
                # chart's Role) says so now and then, not every second.
                log.warning("pod_watch_failed", error=str(exc), retry_in=delay)
                stopping.wait(delay)
                delay = min(delay * 2, 60.0)

"""The training runtimes a cluster offers, and which one a job runs on.

`KubernetesBackend.launch` asks `RuntimeCatalog.select(request.runtime, needs_gpu=...)` before
building the TrainJob. The catalog lists `ClusterTrainingRuntime`s (and, if given a namespace,
namespaced `TrainingRuntime`s) through `CustomObjectsApi`, keeps them for `ttl` seconds, and
summarises each as a `RuntimeInfo` that the pure builder in `manifests.py` reads.

How `request.runtime` is read (a rule's `runtime:` field):

* `torch-distributed` - that ClusterTrainingRuntime (`TrainingRuntime/<name>` for a
  namespaced one);
* `selector:tuneloop.io/size=small,trainer.kubeflow.org/framework=torch` - runtimes carrying
  all those labels;
* `auto` or empty - the default policy: runtimes labelled `trainer.kubeflow.org/framework:
  torch` that are not deprecated.

Among several candidates: when the job needs GPUs, runtimes with GPUs (`nvidia.com/gpu` in the
trainer container, or label `tuneloop.io/accelerator: gpu`) only; when it does not, runtimes
without GPUs first. Then those labelled `tuneloop.io/default: "true"`, then by name, so the
choice is deterministic. No match: `JobRejectedError(reason="RuntimeNotFound")` naming what
exists - the decision fails visibly, it is never dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kubernetes.client import CustomObjectsApi

from orchestrator.clock import Clock
from orchestrator.errors import JobRejectedError
from runtimes.kubernetes.errors import translate

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
CLUSTER_KIND = "ClusterTrainingRuntime"
NAMESPACED_KIND = "TrainingRuntime"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
SUPPORT_LABEL = "trainer.kubeflow.org/support"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
DEFAULT_LABEL = "tuneloop.io/default"
ACCELERATOR_LABEL = "tuneloop.io/accelerator"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """What the builder needs to know about one (Cluster)TrainingRuntime."""

    name: str
    kind: str = CLUSTER_KIND
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    replicated_jobs: tuple[str, ...] = ("node",)
    """Names of the runtime's replicated jobs, in template order."""
    trainer_job: str = "node"
    """The replicated job that runs `spec.trainer` (ancestor step `trainer`)."""
    has_dataset_initializer: bool = False
    has_model_initializer: bool = False
    gpus_per_node: int = 0

    @property
    def has_gpus(self) -> bool:
        return self.gpus_per_node > 0 or self.labels.get(ACCELERATOR_LABEL) == "gpu"

    @property
    def is_deprecated(self) -> bool:
        return self.labels.get(SUPPORT_LABEL) == "deprecated"

    @property
    def reference(self) -> str:
        """How a rule names this runtime."""
        return self.name if self.kind == CLUSTER_KIND else f"{NAMESPACED_KIND}/{self.name}"


def runtime_info(obj: Mapping[str, Any], *, kind: str = CLUSTER_KIND) -> RuntimeInfo:
    """Summarise a runtime object as the API returns it (a dict)."""
    metadata = obj.get("metadata") or {}
    jobs = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "replicatedJobs"
    ) or []
    names: list[str] = []
    trainer_job = "node"
    gpus = 0
    containers_by_job: dict[str, set[str]] = {}
    for job in jobs:
        name = str(job.get("name", ""))
        names.append(name)
        template = job.get("template") or {}
        step = ((template.get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)
        pod_spec = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
        containers = pod_spec.get("containers") or []
        containers_by_job[name] = {str(c.get("name")) for c in containers}
        if step == "trainer":
            trainer_job = name
            for container in containers:
                if container.get("name") == "node":
                    limits = (container.get("resources") or {}).get("limits") or {}
                    gpus = _int(limits.get(GPU_RESOURCE))
    return RuntimeInfo(
        name=str(metadata.get("name", "")),
        kind=kind,
        labels=MappingProxyType(dict(metadata.get("labels") or {})),
        replicated_jobs=tuple(names) or ("node",),
        trainer_job=trainer_job,
        has_dataset_initializer="dataset-initializer"
        in containers_by_job.get("dataset-initializer", set()),
        has_model_initializer="model-initializer"
        in containers_by_job.get("model-initializer", set()),
        gpus_per_node=gpus,
    )


def _int(value: Any) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def select(runtimes: tuple[RuntimeInfo, ...], wanted: str, *, needs_gpu: bool) -> RuntimeInfo:
    """Pick the runtime for a job: pure, see the module docstring for the policy.

    Raises:
        JobRejectedError: nothing matches (reason `RuntimeNotFound`).
    """
    wanted = wanted.strip()
    if wanted and wanted != "auto" and not wanted.startswith("selector:"):
        kind, _, name = wanted.rpartition("/")
        kind = kind or CLUSTER_KIND
        for runtime in runtimes:
            if runtime.name == name and runtime.kind == kind:
                return runtime
        raise _not_found(f"{kind} {name!r} does not exist", runtimes)
    if wanted.startswith("selector:"):
        selector = _parse_selector(wanted.removeprefix("selector:"))
        candidates = [r for r in runtimes if all(r.labels.get(k) == v for k, v in selector.items())]
        what = f"no runtime has labels {wanted.removeprefix('selector:')}"
    else:
        candidates = [
            r for r in runtimes if r.labels.get(FRAMEWORK_LABEL) == "torch" and not r.is_deprecated
        ]
        what = f"no runtime has label {FRAMEWORK_LABEL}=torch"
    if needs_gpu:
        candidates = [r for r in candidates if r.has_gpus]
        what += " and GPUs"
    if not candidates:
        raise _not_found(what, runtimes)
    return min(
        candidates,
        key=lambda r: (r.has_gpus != needs_gpu, r.labels.get(DEFAULT_LABEL) != "true", r.name),
    )


def _parse_selector(text: str) -> dict[str, str]:
    selector: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise JobRejectedError(
                f"runtime selector {text!r}: expected key=value[,key=value...]",
                reason="InvalidRuntimeSelector",
            )
        selector[key.strip()] = value.strip()
    return selector


def _not_found(what: str, runtimes: tuple[RuntimeInfo, ...]) -> JobRejectedError:
    known = ", ".join(sorted(r.reference for r in runtimes)) or "none"
    return JobRejectedError(f"{what}; the cluster offers: {known}", reason="RuntimeNotFound")


class RuntimeCatalog:
    """The runtimes of one cluster, listed through the API and cached.

    Args:
        api: the `CustomObjectsApi` to list with.
        clock: decides when the cache is stale.
        namespace: also list namespaced `TrainingRuntime`s there; None lists only
            `ClusterTrainingRuntime`s.
        ttl: seconds a listing is trusted. A name not found in a listing older than
            `min_refresh` seconds is looked up again at once (a runtime created just now).
    """

    def __init__(
        self,
        api: CustomObjectsApi,
        *,
        clock: Clock,
        namespace: str | None = None,
        ttl: float = 60.0,
        min_refresh: float = 2.0,
    ) -> None:
        self._api = api
        self._clock = clock
        self._namespace = namespace
        self._ttl = ttl
        self._min_refresh = min_refresh
        self._runtimes: tuple[RuntimeInfo, ...] | None = None
        self._listed_at = 0.0
        self._lock = asyncio.Lock()

    async def runtimes(self, *, refresh: bool = False) -> tuple[RuntimeInfo, ...]:
        """Every runtime the cluster offers; from the cache unless stale or *refresh*."""
        async with self._lock:
            if refresh or self._runtimes is None or self._age() > self._ttl:
                self._runtimes = await asyncio.to_thread(self._list)
                self._listed_at = self._clock.now().timestamp()
            return self._runtimes

    async def select(self, wanted: str, *, needs_gpu: bool = False) -> RuntimeInfo:
        """The runtime a job asking for *wanted* runs on (see the module docstring).

        Raises:
            JobRejectedError: no runtime matches, even after a fresh listing.
            TransientBackendError: the API server could not be asked.
        """
        runtimes = await self.runtimes()
        try:
            return select(runtimes, wanted, needs_gpu=needs_gpu)
        except JobRejectedError:
            if self._age() < self._min_refresh:
                raise
        return select(await self.runtimes(refresh=True), wanted, needs_gpu=needs_gpu)

    def _age(self) -> float:
        return self._clock.now().timestamp() - self._listed_at

    def _list(self) -> tuple[RuntimeInfo, ...]:
        try:
            listing = self._api.list_cluster_custom_object(
                GROUP, VERSION, "clustertrainingruntimes"
            )
            found = [runtime_info(item) for item in _items(listing)]
            if self._namespace is not None:
                listing = self._api.list_namespaced_custom_object(
                    GROUP, VERSION, self._namespace, "trainingruntimes"
                )
                found += [runtime_info(item, kind=NAMESPACED_KIND) for item in _items(listing)]
        except Exception as exc:
            raise translate(exc, doing="list training runtimes") from exc
        return tuple(sorted(found, key=lambda r: (r.kind, r.name)))


def _items(listing: object) -> list[Mapping[str, Any]]:
    items = listing.get("items") if isinstance(listing, dict) else None
    return list(items) if isinstance(items, list) else []

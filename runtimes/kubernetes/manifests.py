"""TrainingRequest -> TrainJob: the pure builder of the Kubernetes manifests tuneloop creates.

Called by `KubernetesBackend.launch` (and by `bench/launch.py`, the golden-file tests and the
schema tests). No I/O, no clock, no randomness: the same request, runtime and settings always
give the same dict, which is what makes launches idempotent (the name is `request.name`).

What goes where (Trainer v2.3.0, see docs/kubernetes.md):

* `metadata.labels` - selectable, label-safe values: managed-by, rule, rule version, key,
  decision id. A value that is not a valid label value is cleaned and suffixed with a hash.
* `metadata.annotations` - the exact values, plus the causing event ids as a JSON list
  (the newest kept, trimmed to `Settings.causing_ids_budget` bytes, the count of the
  dropped ones recorded) and what the completion event needs (base model, dataset, runtime,
  output URI, and the producer's trace context as `tuneloop.io/traceparent` and
  `tuneloop.io/tracestate` when its event carried one); for a rule with `promote:`, the
  policy as JSON (`tuneloop.io/promotion`) and the champion the trainer compares with
  (`tuneloop.io/champion`, which is also its `--champion-uri`), so a worker with no record
  of the job still judges it as it was launched.
* `spec.runtimePatches[manager=tuneloop.io/orchestrator]` - the same labels and annotations
  on the JobSet and on the pods of every replicated job: TrainJob labels are not copied
  to pods by the Trainer.
* `spec.trainer.command` - torchrun (`Settings.command`): the torch plugin describes the
  nodes only through `PET_*` variables that torchrun reads, and rewrites the command only
  for torchtune's `tune run`. Started any other way, `numNodes: 2` trains two unrelated
  rank-0 copies into one directory.
* `spec.trainer.numProcPerNode` - one process per GPU (the request's, else the runtime's),
  else one per node: left unset, the plugin starts one process per requested CPU, and CPU
  processes that each use every core only slow each other down.
* `spec.trainer.args` / `env` - the training config as `TrainerConfig.to_args()` argv items,
  never a shell string; no `PET_*` variables (reserved by the torch plugin).
* `spec.initializer` - only when the runtime has the initializer and the URI has a scheme
  the shipped initializers understand (`hf://`, `s3://`); the trainer then reads the local
  copy under /workspace.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import ConfigError, JobRejectedError
from orchestrator.jobs.model import TrainingRequest
from runtimes import tracking
from runtimes.kubernetes.catalog import GROUP, VERSION, RuntimeInfo
from runtimes.trainer.config import ProgressMode, TrainerConfig

API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "trainjobs"
MANAGER = "tuneloop.io/orchestrator"
"""The `runtimePatches` manager key: domain-prefixed, as the Trainer webhook requires."""

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "tuneloop"
RULE = "tuneloop.io/rule"
RULE_VERSION = "tuneloop.io/rule-version"
KEY = "tuneloop.io/key"
DECISION_ID = "tuneloop.io/decision-id"
CAUSING_EVENT_IDS = "tuneloop.io/causing-event-ids"
CAUSING_EVENT_IDS_OMITTED = "tuneloop.io/causing-event-ids-omitted"
BASE_MODEL = "tuneloop.io/base-model"
MODEL = "tuneloop.io/model"
DATASET = "tuneloop.io/dataset"
RUNTIME = "tuneloop.io/runtime"
OUTPUT_URI = "tuneloop.io/output-uri"
TRACEPARENT = "tuneloop.io/traceparent"
TRACESTATE = "tuneloop.io/tracestate"
PROMOTION = "tuneloop.io/promotion"
CHAMPION = "tuneloop.io/champion"

MAX_NAME_LENGTH = 33
"""Longest job name that keeps every runtime's generated pod names valid (research §1.1)."""

INITIALIZER_SCHEMES = ("hf://", "s3://")
WORKSPACE_DATASET = "/workspace/dataset"
WORKSPACE_MODEL = "/workspace/model"
WORKSPACE_OUTPUT = "/workspace/output"

TRAINER_COMMAND = ("torchrun", "--module", "runtimes.trainer")
"""What the trainer container runs; deploy/runtimes/*.yaml and deploy/trainer.Dockerfile's
ENTRYPOINT say the same (tests/unit/kubernetes/test_dockerfile.py holds them together)."""

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_UNSAFE = re.compile(r"[^-A-Za-z0-9_.]+")


@dataclass(frozen=True, slots=True)
class Settings:
    """How TrainJobs are built; one per deployment (from the Helm values)."""

    image: str = "ghcr.io/tuneloop/lora-trainer:0.1.0"
    """Trainer image; pinned by tag so that a job is reproducible."""
    command: tuple[str, ...] = TRAINER_COMMAND
    """Trainer entry point inside the image: torchrun running the program the local backend
    runs too (see `TRAINER_COMMAND`)."""
    output_base_uri: str = "file:///var/lib/tuneloop/adapters"
    """Where adapters go when the request does not say: `<base>/<job name>`. The shipped
    runtime (deploy/runtimes/tuneloop-lora.yaml) mounts a volume there."""
    causing_ids_budget: int = 8192
    """Bytes of the causing-event-ids annotation; the newest ids are kept."""
    dataset_secret: str | None = None
    """Secret with credentials for the dataset initializer (e.g. `ACCESS_TOKEN`)."""
    model_secret: str | None = None
    """Secret with credentials for the model initializer."""
    storage_secret: str | None = None
    """Secret the trainer's S3 endpoint, region and key pair come from (`STORAGE_SECRET_KEYS`,
    as env `valueFrom.secretKeyRef`): the TrainJob names the Secret, never the values. None:
    the pod's own credential chain (IRSA, workload identity) and AWS S3."""
    mlflow_tracking_uri: str | None = None
    """The MLflow server each trainer logs its run to, given to the trainer as
    `TUNELOOP_MLFLOW_TRACKING_URI` with the job's `TUNELOOP_RUN_CONTEXT` (docs/tracking.md).
    None: runs are not tracked, and the TrainJob carries neither variable."""


STORAGE_SECRET_KEYS: tuple[tuple[str, bool], ...] = (
    ("AWS_ACCESS_KEY_ID", False),
    ("AWS_SECRET_ACCESS_KEY", False),
    ("AWS_SESSION_TOKEN", True),
    ("TUNELOOP_S3_ENDPOINT_URL", True),
    ("AWS_REGION", True),
)
"""The keys of the storage Secret the trainer reads (runtimes/storage/settings.py), each as
(name, optional): a Secret for object storage holds a key pair; the endpoint (AWS S3 when
absent), the region and a session token may be left out."""


def storage_env(secret: str | None) -> list[dict[str, Any]]:
    """The trainer's env entries that take the object store's settings from *secret*."""
    if secret is None:
        return []
    return [
        {
            "name": key,
            "valueFrom": {
                "secretKeyRef": {
                    "name": secret,
                    "key": key,
                    **({"optional": True} if optional else {}),
                }
            },
        }
        for key, optional in STORAGE_SECRET_KEYS
    ]


def is_local_uri(uri: str) -> bool:
    """A `file://` URI or a plain path: a volume the trainer writes to directly."""
    return uri.startswith(("file://", "/"))


def output_uri_for(request: TrainingRequest, settings: Settings) -> str:
    """Where the adapter of *request* goes."""
    if request.output_uri:
        return request.output_uri
    return f"{settings.output_base_uri.rstrip('/')}/{request.name}"


def label_value(text: str) -> str:
    """*text* if it is a valid label value, else a cleaned prefix plus a hash of it."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    cleaned = _LABEL_UNSAFE.sub("-", text).strip("-_.")[:52].rstrip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def causing_ids_annotation(ids: tuple[str, ...], budget: int) -> tuple[str, int]:
    """The JSON list of the newest *ids* that fits in *budget* bytes, and how many were left out.

    The newest are kept because the last id is the event that made the rule fire.
    """
    kept: list[str] = []
    size = 2  # the brackets
    for event_id in reversed(ids):
        item = len(json.dumps(event_id)) + (1 if kept else 0)
        if size + item > budget:
            break
        kept.append(event_id)
        size += item
    kept.reverse()
    return json.dumps(kept, separators=(",", ":")), len(ids) - len(kept)


def labels_for(request: TrainingRequest) -> dict[str, str]:
    """Labels that select tuneloop's jobs by rule, key or decision."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        RULE: label_value(request.rule),
        RULE_VERSION: label_value(request.rule_version),
        KEY: label_value(request.key),
        DECISION_ID: label_value(request.decision_id),
    }


def annotations_for(
    request: TrainingRequest, runtime: RuntimeInfo, settings: Settings
) -> dict[str, str]:
    """Exact provenance of the job: what fired, from which events, to train what."""
    ids, omitted = causing_ids_annotation(request.causing_event_ids, settings.causing_ids_budget)
    annotations = {
        RULE: request.rule,
        RULE_VERSION: request.rule_version,
        KEY: request.key,
        DECISION_ID: request.decision_id,
        CAUSING_EVENT_IDS: ids,
        BASE_MODEL: request.base_model,
        DATASET: request.dataset,
        RUNTIME: runtime.reference,
        OUTPUT_URI: output_uri_for(request, settings),
    }
    if request.model_id is not None:
        annotations[MODEL] = request.model_id
    if omitted:
        annotations[CAUSING_EVENT_IDS_OMITTED] = str(omitted)
    if request.trace is not None:
        # One trace id from the producer's event to the completion event (docs/events.md).
        annotations[TRACEPARENT] = request.trace.traceparent
        if request.trace.tracestate:
            annotations[TRACESTATE] = request.trace.tracestate
    if request.promotion is not None:
        annotations[PROMOTION] = json.dumps(
            request.promotion.to_json(), separators=(",", ":"), sort_keys=True
        )
        if request.champion_uri is not None:
            annotations[CHAMPION] = request.champion_uri
    return annotations


def output_dir_for(request: TrainingRequest, output_uri: str) -> str:
    """The directory the trainer writes to, inside its container.

    A `file://` output URI is a path on a volume the runtime mounts (the shipped runtime
    mounts the adapters volume at the same path in the orchestrator); for anything else
    (`s3://`) the trainer works under /workspace/output and then publishes there itself.
    """
    if output_uri.startswith("file://"):
        return output_uri.removeprefix("file://")
    if output_uri.startswith("/"):
        return output_uri
    return f"{WORKSPACE_OUTPUT}/{request.name}"


def trainer_invocation(
    request: TrainingRequest,
    *,
    dataset: str,
    base_model: str,
    output_uri: str,
    publish_to: str | None = None,
) -> tuple[list[str], list[dict[str, str]]]:
    """The trainer's argv and env for *request*: `TrainerConfig.to_args()`, the one way both
    backends build a trainer invocation (runtimes/trainer/config.py), as `--name value` items.
    With *publish_to* (an object store's base URI) the trainer publishes the adapter to
    `<publish_to>/<job>/` and reports that location back (runtimes/kubernetes/results.py).

    Raises:
        JobRejectedError: the trainer would refuse these settings (reason
            `InvalidTrainingConfig`), so the job is not created at all.
    """
    try:
        config = TrainerConfig.from_training_request(
            request,
            output_dir=output_dir_for(request, output_uri),
            base_model=base_model,
            dataset=dataset,
            progress=ProgressMode.JSON,  # container logs are read by machines
            **({"output_uri": publish_to} if publish_to else {}),
        )
    except ConfigError as exc:
        raise JobRejectedError(str(exc), reason="InvalidTrainingConfig") from exc
    env = [
        {"name": "TUNELOOP_DECISION_ID", "value": request.decision_id},
        {"name": "TUNELOOP_OUTPUT_URI", "value": output_uri},
    ]
    return list(config.to_args()), env


def _resources(request: TrainingRequest) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    resources = request.resources
    if resources.cpu is not None:
        requests["cpu"] = limits["cpu"] = resources.cpu
    if resources.memory is not None:
        requests["memory"] = limits["memory"] = resources.memory
    if resources.gpus_per_node:
        limits["nvidia.com/gpu"] = str(resources.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _initializer(uri: str, secret: str | None) -> dict[str, Any]:
    initializer: dict[str, Any] = {"storageUri": uri}
    if secret is not None:
        initializer["secretRef"] = {"name": secret}
    return initializer


def build_trainjob(
    request: TrainingRequest,
    *,
    namespace: str,
    runtime: RuntimeInfo,
    settings: Settings,
) -> dict[str, Any]:
    """The TrainJob that runs *request* on *runtime*.

    Raises:
        JobRejectedError: the request's name cannot be a TrainJob name (reason `InvalidName`).
    """
    if len(request.name) > MAX_NAME_LENGTH or not _NAME.match(request.name):
        raise JobRejectedError(
            f"job name {request.name!r} must be an RFC 1035 label of at most "
            f"{MAX_NAME_LENGTH} characters",
            reason="InvalidName",
        )
    labels = labels_for(request)
    annotations = annotations_for(request, runtime, settings)
    output_uri = output_uri_for(request, settings)

    initializer: dict[str, Any] = {}
    dataset, base_model = request.dataset, request.base_model
    if runtime.has_dataset_initializer and dataset.startswith(INITIALIZER_SCHEMES):
        initializer["dataset"] = _initializer(dataset, settings.dataset_secret)
        dataset = WORKSPACE_DATASET
    if runtime.has_model_initializer and base_model.startswith(INITIALIZER_SCHEMES):
        initializer["model"] = _initializer(base_model, settings.model_secret)
        base_model = WORKSPACE_MODEL
    # An object store is published to by the trainer itself, at `<base>/<job>/` (the
    # request's output_uri or the deployment's base); a local URI is the volume it writes to.
    publish_base = request.output_uri or settings.output_base_uri
    args, env = trainer_invocation(
        request,
        dataset=dataset,
        base_model=base_model,
        output_uri=output_uri,
        publish_to=None if is_local_uri(publish_base) else publish_base,
    )

    trainer: dict[str, Any] = {
        "image": settings.image,
        "command": list(settings.command),
        "args": args,
        "env": [
            *env,
            *storage_env(settings.storage_secret),
            *(
                {"name": name, "value": value}
                for name, value in tracking.trainer_environment(
                    request, settings.mlflow_tracking_uri
                ).items()
            ),
        ],
        "numNodes": request.resources.nodes,
        "numProcPerNode": request.resources.gpus_per_node or runtime.gpus_per_node or 1,
    }
    resources = _resources(request)
    if resources:
        trainer["resourcesPerNode"] = resources

    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": GROUP, "kind": runtime.kind, "name": runtime.name},
        "trainer": trainer,
        "runtimePatches": [_metadata_patch(runtime, labels, annotations)],
    }
    if initializer:
        spec["initializer"] = initializer
    if request.deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = request.deadline_seconds
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {
            "name": request.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def _metadata_patch(
    runtime: RuntimeInfo, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, Any]:
    """Our labels and annotations on the JobSet and on the pods of every replicated job."""

    def metadata() -> dict[str, Any]:
        return {"labels": dict(labels), "annotations": dict(annotations)}

    return {
        "manager": MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "metadata": metadata(),
                "spec": {
                    "replicatedJobs": [
                        {"name": job, "template": {"spec": {"template": {"metadata": metadata()}}}}
                        for job in runtime.replicated_jobs
                    ]
                },
            }
        },
    }

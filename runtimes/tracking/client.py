"""A small client of MLflow's REST API: the calls tuneloop makes, and nothing else.

Who calls it: the trainer's run (`runs.py`) and the champion store (`champions.py`).

Why not MLflow's own client: `mlflow-skinny`, the smallest package with `MlflowClient` and
registry support, brings ~20 packages (databricks-sdk, opentelemetry, protobuf, gitpython,
pydantic, fastapi, uvicorn, ...) into the trainer image and the worker, where they would
meet our own pins. What tuneloop needs is a dozen documented, stable endpoints of the
REST API (https://mlflow.org/docs/latest/api_reference/rest-api.html) and one of the
artifact proxy (`PUT /api/2.0/mlflow-artifacts/artifacts/<path>`), so this speaks them with
the standard library (urllib), as `runtimes/trainer/kubeflow_status.py` does for Kubeflow.
The tests read everything back with their own HTTP calls, not with this client.

Errors: a server that cannot be reached, times out or answers 5xx raises
`TrackingUnavailableError`; one that refuses (4xx) raises `TrackingRequestError` with MLflow's
`error_code`. Nothing is retried here: the callers decide (docs/tracking.md).
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes.tracking.errors import (
    TrackingError,
    TrackingRequestError,
    TrackingUnavailableError,
)
from runtimes.tracking.settings import TrackingSettings

API = "/api/2.0/mlflow"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"
ARTIFACTS_SCHEME = "mlflow-artifacts"

MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
"""MLflow's `log-batch` limits (`mlflow/utils/validation.py`)."""
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric point: its name, value, step and time (ms since the epoch)."""

    key: str
    value: float
    step: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What tuneloop needs of a run."""

    run_id: str
    experiment_id: str
    artifact_uri: str
    status: str


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """What tuneloop needs of a registered model's version."""

    name: str
    version: str
    source: str
    run_id: str
    tags: Mapping[str, str]
    aliases: tuple[str, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelVersion:
        return cls(
            name=str(data.get("name", "")),
            version=str(data.get("version", "")),
            source=str(data.get("source", "")),
            run_id=str(data.get("run_id", "")),
            tags=_tag_map(data.get("tags")),
            aliases=tuple(str(alias) for alias in data.get("aliases", ())),
        )


class MlflowClient:
    """The REST calls of one tracking server; safe to share, it holds no connection."""

    def __init__(self, settings: TrackingSettings) -> None:
        if settings.tracking_uri is None:
            raise ValueError("MlflowClient needs a tracking URI")
        self.tracking_uri = settings.tracking_uri.rstrip("/")
        self._timeout = settings.request_timeout
        self._headers: dict[str, str] = {}
        if settings.token:
            self._headers["Authorization"] = f"Bearer {settings.token}"
        elif settings.username and settings.password:
            pair = f"{settings.username}:{settings.password}".encode()
            self._headers["Authorization"] = f"Basic {base64.b64encode(pair).decode()}"

    # -- experiments ----------------------------------------------------------------------------

    def experiment_id(self, name: str) -> str:
        """The id of the experiment *name*, created when missing (a concurrent create by
        another trainer is fine: then it is read again)."""
        found = self._experiment_by_name(name)
        if found is not None:
            return found
        try:
            answer = self._call("POST", f"{API}/experiments/create", body={"name": name})
        except TrackingRequestError as exc:
            if not exc.already_exists:
                raise
            found = self._experiment_by_name(name)
            if found is None:
                raise
            return found
        return str(answer["experiment_id"])

    def _experiment_by_name(self, name: str) -> str | None:
        try:
            answer = self._call(
                "GET", f"{API}/experiments/get-by-name", query={"experiment_name": name}
            )
        except TrackingRequestError as exc:
            if exc.not_found:
                return None
            raise
        return str(answer["experiment"]["experiment_id"])

    # -- runs -------------------------------------------------------------------------------------

    def create_run(self, experiment_id: str, *, name: str, tags: Mapping[str, str]) -> RunInfo:
        answer = self._call(
            "POST",
            f"{API}/runs/create",
            body={
                "experiment_id": experiment_id,
                "run_name": name,
                "start_time": _now_ms(),
                "tags": _tag_list(tags),
            },
        )
        return _run_info(answer["run"])

    def find_run(self, experiment_id: str, *, tag: str, value: str) -> RunInfo | None:
        """The newest run of the experiment whose tag *tag* is *value*, if any."""
        answer = self._call(
            "POST",
            f"{API}/runs/search",
            body={
                "experiment_ids": [experiment_id],
                "filter": f"tags.`{tag}` = {_quoted(value)}",
                "order_by": ["attributes.start_time DESC"],
                "max_results": 1,
            },
        )
        runs = answer.get("runs") or []
        return _run_info(runs[0]) if runs else None

    def log_batch(
        self,
        run_id: str,
        *,
        metrics: Sequence[Metric] = (),
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Log metrics, params and tags, in as many requests as MLflow's limits need.
        Non-finite metric values are left out (JSON has no NaN)."""
        finite = [m for m in metrics if math.isfinite(m.value)]
        param_items = [(k[:MAX_KEY], v[:MAX_PARAM_VALUE]) for k, v in (params or {}).items()]
        tag_items = [(k[:MAX_KEY], v[:MAX_TAG_VALUE]) for k, v in (tags or {}).items()]
        while finite or param_items or tag_items:
            batch_metrics, finite = finite[:MAX_METRICS_PER_BATCH], finite[MAX_METRICS_PER_BATCH:]
            batch_params = param_items[:MAX_PARAMS_TAGS_PER_BATCH]
            param_items = param_items[MAX_PARAMS_TAGS_PER_BATCH:]
            batch_tags, tag_items = (
                tag_items[:MAX_PARAMS_TAGS_PER_BATCH],
                tag_items[MAX_PARAMS_TAGS_PER_BATCH:],
            )
            self._call(
                "POST",
                f"{API}/runs/log-batch",
                body={
                    "run_id": run_id,
                    "metrics": [
                        {
                            "key": m.key[:MAX_KEY],
                            "value": m.value,
                            "timestamp": m.timestamp_ms,
                            "step": m.step,
                        }
                        for m in batch_metrics
                    ],
                    "params": [{"key": k, "value": v} for k, v in batch_params],
                    "tags": [{"key": k, "value": v} for k, v in batch_tags],
                },
            )

    def end_run(self, run_id: str, status: str) -> None:
        """Set the run's final status: `FINISHED`, `FAILED` or `KILLED`."""
        self._call(
            "POST",
            f"{API}/runs/update",
            body={"run_id": run_id, "status": status, "end_time": _now_ms()},
        )

    def reopen_run(self, run_id: str) -> None:
        """Mark a run RUNNING again (a resumed job logs into the run it started)."""
        self._call("POST", f"{API}/runs/update", body={"run_id": run_id, "status": "RUNNING"})

    # -- artifacts --------------------------------------------------------------------------------

    def artifacts_url(self, artifact_uri: str) -> str | None:
        """The HTTP URL the server's artifact proxy serves *artifact_uri* at; None when the
        artifacts are not proxied (an `s3://` artifact root of a server without
        `--serve-artifacts`: a client would need the store's own credentials)."""
        parsed = urllib.parse.urlparse(artifact_uri)
        if parsed.scheme != ARTIFACTS_SCHEME:
            return None
        base = self.tracking_uri
        if parsed.netloc:
            scheme = urllib.parse.urlparse(self.tracking_uri).scheme or "http"
            base = f"{scheme}://{parsed.netloc}"
        return f"{base}{ARTIFACTS_API}/{parsed.path.lstrip('/')}"

    def upload_artifacts(
        self, artifact_uri: str, files: Iterable[tuple[Path, str]]
    ) -> tuple[str, ...]:
        """PUT each (local file, relative artifact path) under the run's *artifact_uri*;
        return the relative paths uploaded.

        Raises:
            TrackingRequestError: the artifacts are not proxied by this server
                (`error_code` `ARTIFACTS_NOT_PROXIED`), or the server refused a file.
            TrackingUnavailableError: the server went away during the upload.
        """
        url = self.artifacts_url(artifact_uri)
        if url is None:
            raise TrackingRequestError(
                f"the run's artifact location {artifact_uri} is not served by the tracking "
                "server (start it with --serve-artifacts), so the adapter was not uploaded",
                status=0,
                error_code="ARTIFACTS_NOT_PROXIED",
            )
        uploaded = []
        for local, relative in files:
            target = f"{url.rstrip('/')}/{urllib.parse.quote(relative)}"
            with local.open("rb") as body:
                self._send(
                    "PUT",
                    target,
                    body,
                    headers={
                        "Content-Type": "application/octet-stream",
                        "Content-Length": str(local.stat().st_size),
                    },
                )
            uploaded.append(relative)
        return tuple(uploaded)

    # -- the model registry -----------------------------------------------------------------------

    def ensure_registered_model(self, name: str, *, tags: Mapping[str, str]) -> None:
        """Create the registered model *name* with *tags*; one that exists is left as is."""
        try:
            self._call(
                "POST",
                f"{API}/registered-models/create",
                body={"name": name, "tags": _tag_list(tags)},
            )
        except TrackingRequestError as exc:
            if not exc.already_exists:
                raise

    def registered_model_aliases(self, name: str) -> dict[str, str] | None:
        """The aliases of *name* (alias -> version); None when there is no such model."""
        try:
            answer = self._call("GET", f"{API}/registered-models/get", query={"name": name})
        except TrackingRequestError as exc:
            if exc.not_found:
                return None
            raise
        aliases = answer["registered_model"].get("aliases") or []
        return {str(item["alias"]): str(item["version"]) for item in aliases}

    def create_model_version(
        self, name: str, *, source: str, run_id: str | None, tags: Mapping[str, str]
    ) -> ModelVersion:
        body: dict[str, Any] = {"name": name, "source": source, "tags": _tag_list(tags)}
        if run_id:
            body["run_id"] = run_id
        answer = self._call("POST", f"{API}/model-versions/create", body=body)
        return ModelVersion.from_json(answer["model_version"])

    def model_version(self, name: str, version: str) -> ModelVersion:
        answer = self._call(
            "GET", f"{API}/model-versions/get", query={"name": name, "version": version}
        )
        return ModelVersion.from_json(answer["model_version"])

    def find_model_versions(self, name: str, *, tag: str, value: str) -> tuple[ModelVersion, ...]:
        """The versions of *name* whose tag *tag* is *value*, oldest first."""
        answer = self._call(
            "GET",
            f"{API}/model-versions/search",
            query={
                "filter": f"name = {_quoted(name)} and tags.`{tag}` = {_quoted(value)}",
                "max_results": "100",
            },
        )
        found = [ModelVersion.from_json(item) for item in answer.get("model_versions") or []]
        return tuple(sorted(found, key=lambda version: int(version.version)))

    def set_model_version_tags(self, name: str, version: str, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self._call(
                "POST",
                f"{API}/model-versions/set-tag",
                body={"name": name, "version": version, "key": key, "value": value},
            )

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call(
            "POST",
            f"{API}/registered-models/alias",
            body={"name": name, "alias": alias, "version": version},
        )

    # -- the wire ---------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        endpoint: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        url = f"{self.tracking_uri}{endpoint}"
        if query:
            url = f"{url}?{urllib.parse.urlencode(query)}"
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        raw = self._send(method, url, data, headers=headers)
        if not raw:
            return {}
        try:
            answer = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TrackingUnavailableError(
                f"{method} {endpoint}: the tracking server answered something that is not JSON"
            ) from exc
        if not isinstance(answer, dict):
            raise TrackingUnavailableError(f"{method} {endpoint}: unexpected answer {answer!r}")
        return answer

    def _send(self, method: str, url: str, data: Any, *, headers: Mapping[str, str]) -> bytes:
        request = urllib.request.Request(  # noqa: S310 - the configured tracking server
            url, data=data, method=method, headers={**self._headers, **headers}
        )
        where = urllib.parse.urlparse(url).path
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:  # noqa: S310
                payload: bytes = response.read()
                return payload
        except urllib.error.HTTPError as exc:
            raise _refusal(method, where, exc) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise TrackingUnavailableError(
                f"{method} {where}: the tracking server {self.tracking_uri} cannot be "
                f"reached ({reason})"
            ) from exc


def _refusal(method: str, where: str, exc: urllib.error.HTTPError) -> TrackingError:
    try:
        detail = json.loads(exc.read() or b"{}")
    except (json.JSONDecodeError, OSError, http.client.HTTPException):
        detail = {}
    if not isinstance(detail, dict):
        detail = {}
    code = str(detail.get("error_code") or f"HTTP_{exc.code}")
    message = str(detail.get("message") or exc.reason)
    text = f"{method} {where}: {exc.code} {code}: {message}"
    if exc.code >= 500 or exc.code in (408, 429):
        return TrackingUnavailableError(text)
    return TrackingRequestError(text, status=exc.code, error_code=code)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"key": key[:MAX_KEY], "value": value[:MAX_TAG_VALUE]} for key, value in tags.items()]


def _tag_map(tags: Any) -> dict[str, str]:
    if isinstance(tags, Mapping):
        return {str(k): str(v) for k, v in tags.items()}
    return {str(item["key"]): str(item.get("value", "")) for item in tags or ()}


def _run_info(run: Mapping[str, Any]) -> RunInfo:
    info = run["info"]
    return RunInfo(
        run_id=str(info["run_id"]),
        experiment_id=str(info["experiment_id"]),
        artifact_uri=str(info.get("artifact_uri", "")),
        status=str(info.get("status", "")),
    )


def _quoted(value: str) -> str:
    """A string literal of MLflow's search grammar, which strips the quotes and knows no
    escapes: single quotes, or double ones around a value holding a single quote.

    Raises:
        TrackingRequestError: the value holds both kinds of quote (no literal can say it;
            tuneloop's job and model names never do).
    """
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise TrackingRequestError(
        f"{value!r} cannot be searched for: it holds both kinds of quote",
        status=0,
        error_code="UNSEARCHABLE_VALUE",
    )

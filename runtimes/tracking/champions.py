"""`MlflowChampionStore`: the champion of each rule and key is the version its alias names.

Wired by `handlers/app.py` in place of the worker's faust Table when tracking is configured;
it implements `orchestrator.ports.ChampionStore`:

    current(rule, key)   the `tuneloop.adapter_uri` tag of the version that the alias
                         `champion` of the registered model `tuneloop.<rule>.<key>` names;
                         None when there is no such model or alias
    promote(rule, key, adapter_uri, job, scores)
                         the alias moves to the job's version (the one the trainer
                         registered, found by its `tuneloop.job` tag), which also gets the
                         scores as `tuneloop.score.<metric>` tags and the adapter URI as the
                         worker announced it; nothing else ever moves the alias

If the trainer could not register the job's version (the server was away), `promote`
registers it: from the adapter's location when the registry accepts it (`s3://`), else by
uploading the adapter's directory into the job's run when this worker can read it (the
local-process backend), else as a version whose source is the run and whose
`tuneloop.adapter_uri` says where the adapter is: the alias moves in every case.

Every call is blocking HTTP, run in a thread. A server that cannot be reached, or that refuses,
raises `TransientBackendError`: the service retries with backoff and holds the key's inputs
meanwhile (orchestrator/service.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import structlog

from orchestrator.errors import TransientBackendError
from runtimes.tracking import naming
from runtimes.tracking.client import MlflowClient, ModelVersion
from runtimes.tracking.context import RunContext
from runtimes.tracking.errors import TrackingError, TrackingUnavailableError
from runtimes.tracking.runs import ADAPTER_ARTIFACTS, version_tags
from runtimes.tracking.settings import TrackingSettings

UNAVAILABLE_DELAY = 5.0
"""Seconds the service waits before asking a server that could not be reached again."""
REFUSED_DELAY = 30.0
"""Seconds before retrying a refused call: a permission or a full disk is fixed by people."""

log = structlog.get_logger(__name__)
_T = TypeVar("_T")


class MlflowChampionStore:
    """`ChampionStore` on MLflow's model registry; see the module docstring."""

    def __init__(self, settings: TrackingSettings) -> None:
        self._client = MlflowClient(settings)

    async def current(self, rule: str, key: str) -> str | None:
        return await self._in_thread(functools.partial(self._current, rule, key))

    async def promote(
        self,
        rule: str,
        key: str,
        adapter_uri: str,
        job_name: str,
        scores: Mapping[str, float],
    ) -> None:
        await self._in_thread(
            functools.partial(self._promote, rule, key, adapter_uri, job_name, scores)
        )

    # -- blocking ---------------------------------------------------------------------------------

    def _current(self, rule: str, key: str) -> str | None:
        name = naming.registered_model_name(rule, key)
        aliases = self._client.registered_model_aliases(name)
        if not aliases or naming.CHAMPION_ALIAS not in aliases:
            return None
        version = self._client.model_version(name, aliases[naming.CHAMPION_ALIAS])
        return version.tags.get(naming.TAG_ADAPTER_URI) or version.source

    def _promote(
        self,
        rule: str,
        key: str,
        adapter_uri: str,
        job: str,
        scores: Mapping[str, float],
    ) -> None:
        name = naming.registered_model_name(rule, key)
        self._client.ensure_registered_model(
            name, tags={naming.TAG_RULE: rule, naming.TAG_KEY: key}
        )
        found = self._client.find_model_versions(name, tag=naming.TAG_JOB, value=job)
        version = found[0] if found else self._register(name, rule, key, adapter_uri, job)
        aliases = self._client.registered_model_aliases(name) or {}
        if aliases.get(naming.CHAMPION_ALIAS) == version.version:
            return  # a replayed completion: the alias is already there
        # The adapter as the worker announced it (the trainer may have tagged the same adapter
        # by another spelling, a path for a `file://` URI): what `current` returns from now on.
        self._client.set_model_version_tags(
            name,
            version.version,
            {
                naming.TAG_ADAPTER_URI: adapter_uri,
                **{
                    f"{naming.TAG_SCORE_PREFIX}{metric}": repr(value)
                    for metric, value in scores.items()
                },
            },
        )
        self._client.set_alias(name, naming.CHAMPION_ALIAS, version.version)
        log.info(
            "champion_alias_moved",
            rule=rule,
            key=key,
            job=job,
            model=name,
            version=version.version,
            previous=aliases.get(naming.CHAMPION_ALIAS),
        )

    def _register(self, name: str, rule: str, key: str, adapter_uri: str, job: str) -> ModelVersion:
        """A version for a job the trainer could not register (see the module docstring)."""
        experiment_id = self._client.experiment_id(naming.experiment_name(rule))
        run = self._client.find_run(experiment_id, tag=naming.TAG_JOB, value=job)
        context = RunContext(
            job=job, rule=rule, rule_version="", key=key, decision_id="", causing_event_ids=()
        )
        tags = {k: v for k, v in version_tags(context, adapter_uri=adapter_uri).items() if v}
        if not _is_local(adapter_uri):
            return self._client.create_model_version(
                name, source=adapter_uri, run_id=run.run_id if run else None, tags=tags
            )
        # The registry refuses a local path as a source (it could name any file of the
        # server), so the version points into the job's run.
        if run is None:
            run = self._client.create_run(
                experiment_id,
                name=job,
                tags={naming.TAG_JOB: job, naming.TAG_RULE: rule, naming.TAG_KEY: key},
            )
            self._client.end_run(run.run_id, "FINISHED")
        local_dir = Path(adapter_uri.removeprefix("file://"))
        files = (
            [
                (path, f"{ADAPTER_ARTIFACTS}/{path.relative_to(local_dir).as_posix()}")
                for path in sorted(local_dir.rglob("*"))
                if path.is_file()
            ]
            if local_dir.is_dir()
            else []
        )
        if files:
            self._client.upload_artifacts(run.artifact_uri, files)
            source = f"{run.artifact_uri.rstrip('/')}/{ADAPTER_ARTIFACTS}"
            note = "uploaded by the worker at promotion"
        else:
            # Not readable here (a volume of the cluster): the alias must move all the same,
            # and `tuneloop.adapter_uri` says where the adapter is.
            source = f"runs:/{run.run_id}/{ADAPTER_ARTIFACTS}"
            note = f"not uploaded: {adapter_uri} is not readable by the worker"
            log.warning("champion_adapter_not_uploaded", job=job, adapter_uri=adapter_uri)
        return self._client.create_model_version(
            name,
            source=source,
            run_id=run.run_id,
            tags={**tags, naming.TAG_ARTIFACTS: note},
        )

    async def _in_thread(self, call: Callable[[], _T]) -> _T:
        try:
            return await asyncio.to_thread(call)
        except TrackingUnavailableError as exc:
            raise TransientBackendError(f"MLflow: {exc.message}", delay=UNAVAILABLE_DELAY) from exc
        except TrackingError as exc:
            raise TransientBackendError(f"MLflow: {exc.message}", delay=REFUSED_DELAY) from exc
        except OSError as exc:  # reading a local adapter to upload it
            raise TransientBackendError(f"MLflow: {exc}", delay=REFUSED_DELAY) from exc


def _is_local(uri: str) -> bool:
    """A path or a `file://` URI: what the registry refuses as a version's source."""
    return "://" not in uri or uri.startswith("file://")

"""One job's MLflow run, as the trainer (rank 0) logs it: and why that never fails training.

Who calls it: `reporting.MlflowReporter`, which turns the trainer's events into these calls.

    start()                          the run of the job's experiment (`tuneloop/<rule>`), found
                                     again by its `tuneloop.job` tag after a resume, else new;
                                     params and the provenance tags
    log_metrics(values, step=)       per-step metrics, buffered and sent about once a second
    complete(...)                    final metrics; the adapter's files uploaded as artifacts
                                     under `adapter/`; a version of the registered model of the
                                     rule and key; FINISHED
    fail(message)                    FAILED (or KILLED), with the error as a tag

The failure rule: every call is an attempt. A refusal (4xx) skips that step with a warning. A
server that cannot be reached (or times out, or fails with 5xx) makes the run stop calling it:
metrics are kept in memory (up to `MAX_PENDING_POINTS`) and `complete()` or `fail()` tries once
more, so a server that was away for a while still gets the whole run. Each warning goes to the
trainer's own event stream (`warning`, source `mlflow`) and, once the server answers again, to
the run's `tuneloop.tracking_warnings` tag. No exception leaves this class.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from runtimes.tracking import naming
from runtimes.tracking.client import Metric, MlflowClient, RunInfo
from runtimes.tracking.context import RunContext
from runtimes.tracking.errors import TrackingError, TrackingRequestError, TrackingUnavailableError

DEFAULT_EXPERIMENT = "tuneloop"
"""Where a run without a context goes (a trainer started by hand with a tracking URI)."""
ADAPTER_ARTIFACTS = "adapter"
"""The adapter's files are the run's artifacts under this path."""
MAX_PENDING_POINTS = 100_000
"""Metric points kept while the server is away (a few MB); the oldest go first beyond it."""
LOCAL_SCHEMES = ("", "file")

_T = TypeVar("_T")


@dataclass(slots=True)
class RunOutcome:
    """What became of the tracking of one run."""

    run_id: str | None = None
    experiment_id: str | None = None
    model_name: str | None = None
    model_version: str | None = None
    artifacts_uploaded: bool = False
    warnings: list[str] = field(default_factory=list)


class TrackedRun:
    """The MLflow run of one job; see the module docstring. Not thread-safe (rank 0's loop)."""

    def __init__(
        self,
        client: MlflowClient,
        *,
        job: str,
        context: RunContext | None,
        params: Mapping[str, str],
        tags: Mapping[str, str],
        warn: Callable[[str], None],
        flush_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._job = job
        self._context = context
        self._params = dict(params)
        self._tags = {naming.TAG_JOB: job, **context_tags(context), **tags}
        self._warn_out = warn
        self._flush_seconds = flush_seconds
        self._clock = clock
        self._run: RunInfo | None = None
        self._away = False
        self._ended = False
        self._pending: list[Metric] = []
        self._last_flush = float("-inf")
        self.outcome = RunOutcome()

    @property
    def run_id(self) -> str | None:
        return self._run.run_id if self._run is not None else None

    # -- the calls --------------------------------------------------------------------------------

    def start(
        self, *, params: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None
    ) -> None:
        """Find or create the job's run and log its params and tags, with *params* and *tags*
        added (once: a run already started keeps what it logged)."""
        if self._run is not None or self._ended:
            return
        self._params.update(params or {})
        self._tags.update(tags or {})
        if self._away:
            return
        self._run = self._attempt("starting the MLflow run", self._begin)
        if self._run is not None:
            self.outcome.run_id = self._run.run_id
            self.outcome.experiment_id = self._run.experiment_id

    def log_metrics(self, values: Mapping[str, float], *, step: int) -> None:
        """Keep one point per value at *step*; send what is kept about once a second."""
        if self._ended:
            return
        now_ms = int(time.time() * 1000)
        self._pending.extend(Metric(key, value, step, now_ms) for key, value in values.items())
        if len(self._pending) > MAX_PENDING_POINTS:
            dropped = len(self._pending) - MAX_PENDING_POINTS
            del self._pending[:dropped]
            self._warn(f"{dropped} metric point(s) dropped while the tracking server was away")
        if self._clock() - self._last_flush >= self._flush_seconds:
            self._flush()

    def complete(
        self,
        *,
        metrics: Mapping[str, float],
        step: int,
        adapter_dir: Path | None,
        outputs: Sequence[Path] = (),
        adapter_uri: str | None,
    ) -> RunOutcome:
        """Final metrics, the adapter as artifacts, a model version, FINISHED."""
        if self._ended:
            return self.outcome
        self._away = False  # the end is worth one more try
        self.start()
        self.log_metrics(metrics, step=step)
        self._flush()
        run = self._run
        if run is None or self._away:
            return self._end("FINISHED")
        source = self._attempt(
            "uploading the adapter", lambda: self._upload(run, adapter_dir, outputs)
        )
        tags = {naming.TAG_ADAPTER_URI: adapter_uri or str(adapter_dir or "")}
        tags[naming.TAG_ARTIFACTS] = (
            "uploaded"
            if self.outcome.artifacts_uploaded
            else ("not uploaded: see tuneloop.tracking_warnings")
        )
        self._attempt("tagging the run", lambda: self._client.log_batch(run.run_id, tags=tags))
        if source is None and adapter_uri and not _is_local(adapter_uri):
            source = adapter_uri
        if self._context is not None and not self._away:
            if source is None:
                self._warn(
                    "no model version: the adapter is neither uploaded nor at a location the "
                    f"registry accepts ({adapter_uri or adapter_dir})"
                )
            else:
                self._attempt(
                    "registering the model version",
                    lambda: self._register(run, source, adapter_uri or str(adapter_dir or "")),
                )
        return self._end("FINISHED")

    def fail(self, message: str, *, killed: bool = False) -> RunOutcome:
        """End the run FAILED (KILLED when cancelled) with *message* as a tag."""
        if self._ended:
            return self.outcome
        self._away = False
        self.start()
        self._flush()
        run = self._run
        if run is not None and not self._away:
            self._attempt(
                "tagging the failure",
                lambda: self._client.log_batch(run.run_id, tags={"tuneloop.error": message}),
            )
        return self._end("KILLED" if killed else "FAILED")

    def complete_if_open(self) -> RunOutcome:
        """FINISHED, for a run whose trainer ended well without saying `completed`."""
        if self._ended:
            return self.outcome
        self._away = False
        self.start()
        self._flush()
        return self._end("FINISHED")

    # -- the steps --------------------------------------------------------------------------------

    def _begin(self) -> RunInfo:
        context = self._context
        experiment = naming.experiment_name(context.rule) if context else DEFAULT_EXPERIMENT
        experiment_id = self._client.experiment_id(experiment)
        run = self._client.find_run(experiment_id, tag=naming.TAG_JOB, value=self._job)
        parent = self._sweep_run(experiment_id)
        if parent is not None:
            self._tags[naming.TAG_PARENT_RUN] = parent
        if run is None:
            run = self._client.create_run(experiment_id, name=self._job, tags=self._tags)
        elif run.status != "RUNNING":
            self._client.reopen_run(run.run_id)  # a resumed job goes on in its own run
        try:
            self._client.log_batch(run.run_id, params=self._params, tags=self._tags)
        except TrackingRequestError as exc:
            # A param is immutable: a resumed job whose settings changed keeps the first ones.
            self._warn(f"logging the params: {exc.message}")
        return run

    def _sweep_run(self, experiment_id: str) -> str | None:
        """The id of the parent run of the sweep this job is a trial of (the worker created it
        before launching the trial, tagged with the sweep's decision id); None for a job of no
        sweep, or when the search is refused (the run is then tracked on its own)."""
        if self._context is None:
            return None
        try:
            parent = self._client.find_run(
                experiment_id,
                tag=naming.TAG_SWEEP_DECISION_ID,
                value=self._context.decision_id,
            )
        except TrackingRequestError as exc:
            self._warn(f"finding the sweep's run: {exc.message}")
            return None
        return parent.run_id if parent is not None else None

    def _flush(self) -> None:
        self._last_flush = self._clock()
        run = self._run
        if run is None or self._away or not self._pending:
            return
        batch = self._pending
        self._attempt("logging metrics", lambda: self._client.log_batch(run.run_id, metrics=batch))
        if not self._away:
            self._pending = []  # sent, or refused for good: kept only while the server is away

    def _upload(self, run: RunInfo, adapter_dir: Path | None, outputs: Sequence[Path]) -> str:
        files: list[tuple[Path, str]] = []
        if adapter_dir is not None and adapter_dir.is_dir():
            files += [
                (path, f"{ADAPTER_ARTIFACTS}/{path.relative_to(adapter_dir).as_posix()}")
                for path in sorted(adapter_dir.rglob("*"))
                if path.is_file()
            ]
        files += [(path, path.name) for path in outputs if path.is_file()]
        if not files:
            raise TrackingRequestError(
                f"no adapter files at {adapter_dir}", status=0, error_code="NO_ADAPTER_FILES"
            )
        self._client.upload_artifacts(run.artifact_uri, files)
        self.outcome.artifacts_uploaded = True
        return f"{run.artifact_uri.rstrip('/')}/{ADAPTER_ARTIFACTS}"

    def _register(self, run: RunInfo, source: str, adapter_uri: str) -> None:
        context = self._context
        assert context is not None
        name = naming.registered_model_name(context.rule, context.key)
        self._client.ensure_registered_model(
            name, tags={naming.TAG_RULE: context.rule, naming.TAG_KEY: context.key}
        )
        existing = self._client.find_model_versions(name, tag=naming.TAG_JOB, value=self._job)
        if existing:
            version = existing[0]  # a resumed or repeated job registers once
        else:
            version = self._client.create_model_version(
                name,
                source=source,
                run_id=run.run_id,
                tags=version_tags(context, adapter_uri=adapter_uri),
            )
        self.outcome.model_name = name
        self.outcome.model_version = version.version

    def _end(self, status: str) -> RunOutcome:
        run = self._run
        if run is not None and not self._away:
            if self.outcome.warnings:
                text = "; ".join(self.outcome.warnings)[: naming.MAX_TAG_VALUE]
                self._attempt(
                    "tagging the warnings",
                    lambda: self._client.log_batch(run.run_id, tags={naming.TAG_WARNINGS: text}),
                )
            self._attempt("ending the run", lambda: self._client.end_run(run.run_id, status))
        self._ended = True
        return self.outcome

    # -- the failure rule -------------------------------------------------------------------------

    def _attempt(self, what: str, action: Callable[[], _T]) -> _T | None:
        try:
            return action()
        except TrackingUnavailableError as exc:
            self._away = True
            self._warn(f"{what}: {exc.message}; the run is not tracked until it ends")
        except TrackingError as exc:
            self._warn(f"{what}: {exc.message}")
        except Exception as exc:  # tracking never fails training, whatever fails
            self._warn(f"{what}: {type(exc).__name__}: {exc}")
        return None

    def _warn(self, message: str) -> None:
        self.outcome.warnings.append(message)
        with contextlib.suppress(Exception):  # a broken stdout must not fail training either
            self._warn_out(message)


def version_tags(context: RunContext, *, adapter_uri: str) -> dict[str, str]:
    """The tags of the model version of *context*'s job: where the adapter is, and why."""
    return {
        naming.TAG_JOB: context.job,
        naming.TAG_ADAPTER_URI: adapter_uri,
        naming.TAG_RULE: context.rule,
        naming.TAG_RULE_VERSION: context.rule_version,
        naming.TAG_KEY: context.key,
        naming.TAG_DECISION_ID: context.decision_id,
    }


def context_tags(context: RunContext | None) -> dict[str, str]:
    if context is None:
        return {}
    return {
        naming.TAG_RULE: context.rule,
        naming.TAG_RULE_VERSION: context.rule_version,
        naming.TAG_KEY: context.key,
        naming.TAG_DECISION_ID: context.decision_id,
        **naming.causing_ids_tags(context.causing_event_ids),
    }


def _is_local(uri: str) -> bool:
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    return scheme in LOCAL_SCHEMES

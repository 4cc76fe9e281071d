"""The trainer's events, also logged to MLflow: rank 0's `Reporter`, wrapped.

`runtimes/trainer/__main__.py` wraps rank 0's reporter with `tracked(...)` when
`TUNELOOP_MLFLOW_TRACKING_URI` is set, as it wraps it for Kubeflow's status server. The
trainer already says everything a run needs through its events, each as it happens:

    started     -> the run starts: the trainer's settings and the data's sizes as params
    progress    -> `train_loss` (and `epoch`, `tokens_per_second`) at that optimiser step; a
                   transformers callback (`ProgressEvents`) emits one per logging step
    eval        -> `eval_loss` at the step it was measured (before training, after it)
    completed   -> every numeric metric of `result.json` (eval_loss, perplexity,
                   champion_eval_loss, ...) at the last step; the adapter uploaded; a version
                   of the rule and key's registered model; FINISHED
    (an error)  -> FAILED, or KILLED on Ctrl-C / SIGTERM

Each event goes to the wrapped reporter first, unchanged; then to the run. Nothing here raises
into training (`runs.py` has the failure rule); a tracking problem becomes a `warning` event
(`{"event": "warning", "source": "mlflow", "message": ...}`) in the job's log.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from runtimes.tracking import naming
from runtimes.tracking.client import MlflowClient
from runtimes.tracking.context import run_context_of
from runtimes.tracking.runs import RunOutcome, TrackedRun
from runtimes.tracking.settings import TrackingSettings

STARTED_PARAMS = (
    "train_examples",
    "eval_examples",
    "total_steps",
    "trainable_parameters",
    "world_size",
)
"""Fields of the `started` event logged as params (the rest are tags or change on resume)."""
PROGRESS_METRICS = {
    "loss": "train_loss",
    "epoch": "epoch",
    "tokens_per_second": "tokens_per_second",
}
OUTPUT_FILES = ("result.json", "metrics.json", "data_card.json")
"""Uploaded beside `adapter/`: what the run produced, as the trainer wrote it."""


class Reporter(Protocol):
    """The trainer's `runtimes.trainer.progress.Reporter`, restated: tracking does not import
    the trainer."""

    def emit(self, event: str, /, **fields: Any) -> None: ...


class MlflowReporter:
    """*inner*, and every event also logged to *run*."""

    def __init__(self, inner: Reporter, run: TrackedRun) -> None:
        self._inner = inner
        self.run = run
        self._step = 0

    def emit(self, event: str, /, **fields: Any) -> None:
        self._inner.emit(event, **fields)
        try:
            self._track(event, fields)
        except Exception as exc:  # tracking never fails training, whatever fails
            self._inner.emit("warning", source="mlflow", message=f"{type(exc).__name__}: {exc}")

    def _track(self, event: str, fields: Mapping[str, Any]) -> None:
        if event == "started":
            self.run.start(
                params={name: str(fields[name]) for name in STARTED_PARAMS if name in fields},
                tags={"tuneloop.resumed_from": str(fields["resumed_from"])}
                if fields.get("resumed_from")
                else {},
            )
        elif event == "progress":
            self._step = int(fields.get("step") or self._step)
            values = _numbers(
                {PROGRESS_METRICS[k]: v for k, v in fields.items() if k in PROGRESS_METRICS}
            )
            if "train_loss" in values:
                self.run.log_metrics(values, step=self._step)
        elif event == "eval":
            self.run.log_metrics(_numbers({"eval_loss": fields.get("loss")}), step=self._step)
        elif event == "completed":
            self._complete(fields)

    def _complete(self, fields: Mapping[str, Any]) -> None:
        metrics = fields.get("metrics") or {}
        step = int(metrics.get("steps") or self._step)
        adapter_dir = Path(str(fields["adapter_dir"])) if fields.get("adapter_dir") else None
        result = Path(str(fields["result"])) if fields.get("result") else None
        outputs = [result.with_name(name) for name in OUTPUT_FILES] if result else []
        self.run.complete(
            metrics=_numbers(metrics),
            step=step,
            adapter_dir=adapter_dir,
            outputs=outputs,
            adapter_uri=fields.get("adapter_uri"),
        )

    def fail(self, error: BaseException) -> RunOutcome:
        killed = isinstance(error, KeyboardInterrupt | SystemExit)
        message = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
        return self.run.fail(str(message), killed=killed)


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of *values* (bools, text and None left out)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(float(value)):
            out[key] = float(value)
    return out


@contextlib.contextmanager
def tracked(
    reporter: Reporter,
    environ: Mapping[str, str],
    *,
    job: str | None,
    params: Mapping[str, Any],
    is_main: bool,
) -> Iterator[Reporter]:
    """*reporter*, also logging to MLflow when this is rank 0 and a tracking URI is set.

    Args:
        reporter: rank 0's reporter (progress lines, Kubeflow's status server).
        environ: where `TUNELOOP_MLFLOW_TRACKING_URI`, `TUNELOOP_RUN_CONTEXT` and MLflow's
            credentials are read.
        job: the job's name (the run's name and its `tuneloop.job` tag).
        params: the trainer's settings (`TrainerConfig.to_mapping()`), logged as params.
        is_main: only rank 0 tracks.

    The run ends FAILED when the block raises (and the exception goes on), KILLED on an
    interrupt, FINISHED when the block ends after `completed`.
    """
    try:
        settings = TrackingSettings.from_env(environ)
    except ValueError as exc:
        reporter.emit("warning", source="mlflow", message=f"tracking is off: {exc}")
        settings = TrackingSettings()
    if not is_main or not settings.enabled:
        yield reporter
        return
    context = run_context_of(environ)
    name = job or (context.job if context else "tuneloop-train")

    def warn(message: str) -> None:
        reporter.emit("warning", source="mlflow", message=message)
        print(f"tuneloop-train: MLflow: {message}", file=sys.stderr, flush=True)

    run = TrackedRun(
        MlflowClient(settings),
        job=name,
        context=context,
        params={key: _text(value) for key, value in params.items()},
        tags=_run_tags(params),
        warn=warn,
    )
    wrapped = MlflowReporter(reporter, run)
    try:
        yield wrapped
    except BaseException as exc:
        wrapped.fail(exc)
        raise
    run.complete_if_open()


def _run_tags(params: Mapping[str, Any]) -> dict[str, str]:
    tags = {}
    if params.get("base_model_name") or params.get("base_model"):
        tags[naming.TAG_BASE_MODEL] = str(params.get("base_model_name") or params["base_model"])
    if params.get("dataset"):
        tags[naming.TAG_DATASET] = str(params["dataset"])
    return tags


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

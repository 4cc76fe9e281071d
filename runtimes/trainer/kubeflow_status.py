"""Progress and metrics through Kubeflow's own channel: the Trainer's status server.

With the controller's `TrainJobStatus` feature gate on, Kubeflow Trainer (v2.3.0, plugin
`pkg/runtime/framework/plugins/trainjobstatus`) gives every trainer container three variables:

* `KUBEFLOW_TRAINER_SERVER_URL`: `https://<service>:<port>/apis/trainer.kubeflow.org/v1alpha1/
  namespaces/<ns>/trainjobs/<name>/status`, to POST to;
* `KUBEFLOW_TRAINER_SERVER_TOKEN`: the *path* of a projected ServiceAccount token (audience
  `trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`), sent as a bearer
  token; the kubelet rotates the file, so it is read for every report;
* `KUBEFLOW_TRAINER_SERVER_CA_CERT`: the *path* of the CA that signed the server's certificate.

The body is `trainer.UpdateTrainJobStatusRequest` (`pkg/apis/trainer/v1alpha1`):
`{"trainerStatus": {"progressPercentage": 0..100, "estimatedRemainingSeconds": >=0,
"metrics": [{"name": <=64 chars, "value": <=64 chars, a string}] (<=256),
"lastUpdatedTime": RFC 3339}}`. The server applies it to `status.trainerStatus` whole, so each
report carries every metric known so far; one value out of bounds fails the whole request.

`__main__.py` wraps rank 0's `Reporter` in `KubeflowStatusReporter` when the URL is set. It
turns the run's events into reports: `started` (0 %), `progress` (at most one report per
`interval` seconds), `eval`, and `completed` (100 %, with the final metrics of `result.json`,
sent after the adapter is written and, with an `output_uri`, published: that report alone
carries the adapter's URI, as `adapter_uri` metric(s), and the evaluation's scores of the
candidate and the champion (`eval_loss`, `perplexity`, `token_accuracy`, `champion_*`, or the
first 64 characters of `champion_error`, the one metric that is text; see
`runtimes/trainer/evaluation.py`)). A report that fails is logged on
stderr and never fails training; after a failure the next ones wait longer (up to
`MAX_BACKOFF` seconds), so a server that is down costs little. The worker reads
`status.trainerStatus` back (`runtimes/kubernetes/results.py`), so the completion event gets
the metrics and the adapter's URI without a shared volume. Standard library only: urllib and ssl.
"""

from __future__ import annotations

import json
import math
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from runtimes.trainer.progress import Reporter

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"  # noqa: S105 -- the name of a variable holding a path
CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"

INTERVAL = 5.0
"""Seconds between progress reports: the SDK's and transformers' own throttle (the server
also rate-limits each job's pods)."""
MAX_BACKOFF = 300.0
"""Longest wait after failed reports before the next try (the final report always tries)."""
TIMEOUT = 5.0
"""Seconds one report may take; training waits for it."""
MAX_TEXT = 64
"""Longest metric name or value the API accepts (`Metric`, kubebuilder MaxLength=64)."""
MAX_METRICS = 256
MAX_INT32 = 2**31 - 1
"""progressPercentage and estimatedRemainingSeconds are int32 in the API."""
ADAPTER_URI = "adapter_uri"
"""The metric naming where the adapter was published, in the final report only. A value is
at most 64 characters, so a longer URI goes in pieces `adapter_uri.1`, `adapter_uri.2`, ...
that `adapter_uri_of` (and runtimes/kubernetes/results.py) join again."""
EVAL_LOSS = "eval_loss"
CHAMPION_ERROR = "champion_error"
"""Why the champion could not be evaluated: the one text metric (runtimes/trainer/evaluation.py)."""


@dataclass(frozen=True, slots=True)
class StatusServer:
    """Where and how to report: what the trainjobstatus plugin put in the environment."""

    url: str
    token_file: Path
    ca_file: Path | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> StatusServer | None:
        """The server the plugin named, None outside such a TrainJob."""
        url = environ.get(URL_ENV)
        token = environ.get(TOKEN_ENV)
        if not url or not token:
            return None
        ca = environ.get(CA_CERT_ENV)
        return cls(url=url, token_file=Path(token), ca_file=Path(ca) if ca else None)

    def post(self, body: Mapping[str, Any]) -> None:
        """POST *body*; raises OSError (URLError, HTTPError, ssl errors) when it is not taken."""
        token = self.token_file.read_text(encoding="utf-8").strip()
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        request = urllib.request.Request(  # noqa: S310 -- the URL the controller gave, https
            self.url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as response:  # noqa: S310
            response.read()


def trainer_status(
    *,
    progress: int | None,
    remaining_seconds: float | None,
    metrics: Mapping[str, float | int],
    now: datetime,
    adapter_uri: str | None = None,
    texts: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An `UpdateTrainJobStatusRequest` body, every value within the API's bounds; with
    *adapter_uri*, the published location as `adapter_uri` metric(s) first; *texts* are
    metrics whose value is text, cut to the 64 characters a value may have."""
    status: dict[str, Any] = {"lastUpdatedTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if progress is not None:
        status["progressPercentage"] = max(0, min(100, int(progress)))
    if remaining_seconds is not None and math.isfinite(remaining_seconds):
        status["estimatedRemainingSeconds"] = max(0, min(MAX_INT32, round(remaining_seconds)))
    items = [
        {"name": name, "value": text}
        for name, value in metrics.items()
        # NaN and infinities would reach the completion event, whose JSON cannot hold them.
        if math.isfinite(value)
        for text in (_text(value),)
        if 0 < len(name) <= MAX_TEXT and len(text) <= MAX_TEXT
    ]
    items += [
        {"name": name, "value": text[:MAX_TEXT]}
        for name, text in (texts or {}).items()
        if 0 < len(name) <= MAX_TEXT and text
    ]
    if adapter_uri:
        items = [*adapter_uri_metrics(adapter_uri), *items]
    if items:
        status["metrics"] = items[:MAX_METRICS]
    return {"trainerStatus": status}


def adapter_uri_metrics(uri: str) -> list[dict[str, str]]:
    """*uri* as status metrics: one `adapter_uri`, or 64-character pieces when longer."""
    if len(uri) <= MAX_TEXT:
        return [{"name": ADAPTER_URI, "value": uri}]
    pieces = [uri[start : start + MAX_TEXT] for start in range(0, len(uri), MAX_TEXT)]
    return [
        {"name": f"{ADAPTER_URI}.{index}", "value": piece}
        for index, piece in enumerate(pieces, start=1)
    ]


def adapter_uri_of(metrics: Sequence[Mapping[str, Any]]) -> str | None:
    """The adapter URI in `trainerStatus.metrics`, pieces joined; None when not reported."""
    pieces: dict[int, str] = {}
    for item in metrics:
        name, value = str(item.get("name", "")), str(item.get("value", ""))
        if name == ADAPTER_URI:
            return value or None
        index = name.removeprefix(f"{ADAPTER_URI}.")
        if index != name and index.isdigit():
            pieces[int(index)] = value
    if not pieces or sorted(pieces) != list(range(1, len(pieces) + 1)):
        return None
    return "".join(pieces[index] for index in sorted(pieces))


def _text(value: float | int) -> str:
    # repr round-trips a float exactly and stays far below 64 characters.
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


class KubeflowStatusReporter:
    """A `Reporter` that passes every event on and reports progress to the status server."""

    def __init__(
        self,
        inner: Reporter,
        server: StatusServer,
        *,
        interval: float = INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        log: TextIO = sys.stderr,
    ) -> None:
        self._inner = inner
        self._server = server
        self._interval = interval
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._log = log
        self._metrics: dict[str, float | int] = {}
        self._texts: dict[str, str] = {}
        self._adapter_uri: str | None = None
        self._next_report = float("-inf")
        self._failures = 0

    def emit(self, event: str, /, **fields: Any) -> None:
        self._inner.emit(event, **fields)
        if event == "started":
            self._remember(total_steps=fields.get("total_steps"))
            self._report(progress=0, remaining=None, force=True)
        elif event == "eval":
            loss = _number(fields.get("loss"))
            if loss is not None:
                self._metrics["eval_loss"] = loss
                self._metrics[f"eval_loss_{fields.get('stage')}"] = loss
        elif event == "progress":
            self._on_progress(fields)
        elif event == "completed":
            self._on_completed(fields)

    def _remember(self, **values: Any) -> None:
        for name, value in values.items():
            number = _number(value)
            if number is not None:
                self._metrics[name] = number

    def _on_progress(self, fields: Mapping[str, Any]) -> None:
        self._remember(
            train_loss=fields.get("loss"),
            step=fields.get("step"),
            total_steps=fields.get("total_steps"),
            epoch=fields.get("epoch"),
            tokens_seen=fields.get("tokens_seen"),
            tokens_per_second=fields.get("tokens_per_second"),
        )
        step, total = _number(fields.get("step")), _number(fields.get("total_steps"))
        # 100 % only once the adapter is written (`completed`), as the controller's readers expect.
        progress = min(99, int(100 * step / total)) if step is not None and total else None
        self._report(progress=progress, remaining=fields.get("eta_seconds"), force=False)

    def _on_completed(self, fields: Mapping[str, Any]) -> None:
        final = fields.get("metrics")
        if isinstance(final, Mapping):
            self._remember(**final)
            # `eval_loss` is the evaluation's (the score a promotion gate compares) when the
            # run evaluated, else the Trainer's loss after training.
            self._remember(
                train_loss=final.get("train_loss_last"),
                eval_loss=final.get(EVAL_LOSS, final.get("eval_loss_after")),
            )
            error = final.get(CHAMPION_ERROR)
            if isinstance(error, str) and error:
                self._texts[CHAMPION_ERROR] = error
        # Only a published adapter has a URI (the trainer emits `completed` after the
        # publish succeeded); without output_uri the adapter stays in output_dir.
        uri = fields.get("adapter_uri")
        self._adapter_uri = uri if isinstance(uri, str) and uri else None
        self._report(progress=100, remaining=0.0, force=True)

    def _report(self, *, progress: int | None, remaining: Any, force: bool) -> None:
        now = self._monotonic()
        if not force and now < self._next_report:
            return
        body = trainer_status(
            progress=progress,
            remaining_seconds=_number(remaining),
            metrics=self._metrics,
            now=self._wall_clock(),
            adapter_uri=self._adapter_uri,
            texts=self._texts,
        )
        try:
            self._server.post(body)
        # Whatever goes wrong (URLError, HTTPError, ssl errors, a broken response, a bad URL),
        # a report must never fail training.
        except Exception as exc:
            self._failures += 1
            wait = min(MAX_BACKOFF, self._interval * 2**self._failures)
            self._next_report = now + wait
            self._log.write(
                f"tuneloop-train: progress not reported to Kubeflow ({_reason(exc)}); "
                f"training goes on, next try in {wait:.0f} s\n"
            )
            self._log.flush()
            return
        self._failures = 0
        self._next_report = now + self._interval


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return f"{type(exc.reason).__name__}: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def wrap(reporter: Reporter, environ: Mapping[str, str], *, is_main: bool) -> Reporter:
    """*reporter*, also reporting to the status server when this is rank 0 of such a TrainJob."""
    server = StatusServer.from_environ(environ)
    if server is None or not is_main:
        return reporter
    return KubeflowStatusReporter(reporter, server)

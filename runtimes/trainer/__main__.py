"""`python -m runtimes.trainer` / `tuneloop-train`: the LoRA program a TrainJob container or the
local-process backend runs.

    tuneloop-train --config train.yaml [--<setting> VALUE ...]
    TUNELOOP_TRAIN_<SETTING>=VALUE tuneloop-train ...

Settings and their precedence are documented in docs/trainer.md (`runtimes/trainer/config.py`
holds them). Exit codes: 0 success (`result.json` written, and published when `output_uri`
is set), 1 unexpected failure or a storage failure (an upload that failed: no manifest),
2 bad input (never retry as is), 3 out of memory (retry with smaller settings). On failure the
error is printed as one JSON line on stdout and written to `<output_dir>/failure.json`, and
in a pod its one-line reason goes to the container's termination message (`_tell_the_kubelet`).
Under torchrun (Kubeflow sets `PET_*`) every rank runs this; only rank 0 reports and writes.
Rank 0 also reports progress and metrics to Kubeflow's status server when the TrainJob has one
(`KUBEFLOW_TRAINER_SERVER_URL`, `runtimes/trainer/kubeflow_status.py`), and logs the run to
MLflow when `TUNELOOP_MLFLOW_TRACKING_URI` is set (`runtimes/tracking/`, docs/tracking.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import ConfigError
from runtimes.storage import StorageError
from runtimes.trainer import config as trainer_config
from runtimes.trainer.errors import InvalidTrainerConfigError, TrainerError

Failure = TrainerError | StorageError
"""Both carry `message`, `exit_code` and `to_mapping()`: a storage error (a dataset or model
that cannot be read, an adapter that could not be published) fails the run with its own code."""


def _usage() -> str:
    names = ", ".join(f"--{name.replace('_', '-')}" for name in trainer_config._PARSERS)
    return (
        "usage: tuneloop-train [--config FILE] [--<setting> VALUE ...]\n"
        f"settings: {names}\n"
        f"each setting can also come from {trainer_config.ENV_PREFIX}<SETTING>; "
        "see docs/trainer.md\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] in (["-h"], ["--help"]):
        sys.stdout.write(_usage())
        return 0
    is_main = os.environ.get("RANK", "0") == "0"
    output_dir: str | None = None
    try:
        config = trainer_config.load(arguments, os.environ)
        output_dir = config.output_dir
        from runtimes.tracking import reporting as tracking
        from runtimes.trainer import kubeflow_status, progress, training

        reporter = progress.make_reporter(
            config.progress, interval=config.progress_interval, is_main=is_main
        )
        # In a TrainJob with Kubeflow's TrainJobStatus feature, rank 0 also reports there.
        reporter = kubeflow_status.wrap(reporter, os.environ, is_main=is_main)
        # With TUNELOOP_MLFLOW_TRACKING_URI, rank 0 also logs the run to MLflow; a tracking
        # failure is a warning, never a failed run (runtimes/tracking/reporting.py).
        with tracking.tracked(
            reporter,
            os.environ,
            job=config.job_name,
            params=config.to_mapping(),
            is_main=is_main,
        ) as tracked_reporter:
            training.run(config, tracked_reporter)
    except ConfigError as exc:
        return _fail(InvalidTrainerConfigError(str(exc)), output_dir, is_main)
    except (TrainerError, StorageError) as exc:
        return _fail(exc, output_dir, is_main)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return _fail(TrainerError(f"{type(exc).__name__}: {exc}"), output_dir, is_main)
    return 0


TERMINATION_MESSAGE_PATH = Path("/dev/termination-log")
"""A container's `terminationMessagePath` unless its pod spec names another (the shipped
runtimes don't): the kubelet reports what the container wrote there as its terminated message,
before any log tail."""

TERMINATION_MESSAGE_BYTES = 4096
"""What the kubelet keeps of that file."""


def _tell_the_kubelet(reason: str) -> None:
    """In a pod, write *reason* where the kubelet takes the container's terminated message from.

    Without it the message is the log's last 2 KiB (`FallbackToLogsOnError`), and torchrun's
    traceback, printed after the trainer's own line, could push the reason out of it: the
    worker's failure event then said "ain: dataset not found". Outside a pod (no
    `KUBERNETES_SERVICE_HOST`, which the kubelet sets for every container) nothing is written.
    """
    if "KUBERNETES_SERVICE_HOST" not in os.environ or not TERMINATION_MESSAGE_PATH.exists():
        return
    with contextlib.suppress(OSError):  # the log's tail still carries it
        TERMINATION_MESSAGE_PATH.write_bytes(reason.encode()[:TERMINATION_MESSAGE_BYTES])


def _fail(error: Failure, output_dir: str | None, is_main: bool) -> int:
    if not is_main:
        return error.exit_code
    payload = error.to_mapping()
    sys.stdout.write(json.dumps({"event": "failed", **payload}) + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"tuneloop-train: {error.message}\n")
    _tell_the_kubelet(f"tuneloop-train: {error.message}\n")
    if output_dir:
        try:
            target = Path(output_dir)
            target.mkdir(parents=True, exist_ok=True)
            (target / "failure.json").write_text(json.dumps(payload, indent=2) + "\n")
        except OSError:
            pass  # the JSON line and the exit code still carry the error
    return error.exit_code


if __name__ == "__main__":
    raise SystemExit(main())

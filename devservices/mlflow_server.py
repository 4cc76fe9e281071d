"""A real MLflow tracking server on 127.0.0.1: `mlflow server` on sqlite, in a venv of its own.

Who calls it:
- `python -m devservices prepare` (`make services`) calls `prepare()` once, so that the venv is
  in the cache before the tests need it;
- `tests/fixtures/mlflow.py` calls `mlflow_for_tests()`, which uses the server that
  `TUNELOOP_MLFLOW_TRACKING_URI` names or starts a `LocalMlflowServer`;
- the tracking tests stop and start the `LocalMlflowServer` itself (a server that is down).

Why a venv of its own: the server is the full `mlflow` package, which pulls pandas, pyarrow,
scikit-learn, scipy, flask, fastapi, sqlalchemy and alembic at versions of its choosing; in
the project's venv they would fight our pins (pyarrow, pydantic). The project itself talks to
the server over MLflow's REST API (`runtimes/tracking/`) and needs none of it. The venv lives
in `<cache>/mlflow-<version>` and is built once (docs/tracking.md has the measured cost).

The server keeps runs and the model registry in `<work_dir>/mlflow.db` (sqlite: the registry
needs a database store) and serves artifacts itself (`--serve-artifacts`, stored under
`<work_dir>/artifacts`), so that a client uploads an adapter over HTTP with no object store
of its own. A stopped server starts again on the same port with the same runs.

Environment:
    TUNELOOP_CACHE                  the cache root (default ~/.cache/tuneloop)
    MLFLOW_VERSION                  the mlflow release the local server runs (default 3.17.2)
    TUNELOOP_MLFLOW_TRACKING_URI    use this server instead of starting one (left running)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from devservices.kafka import cache_root, free_ports
from devservices.processes import (
    LoopbackServer,
    answers_200,
    serve_until_interrupted,
)
from orchestrator.errors import ConfigError

DEFAULT_MLFLOW_VERSION = "3.17.2"
"""Checked 2026-12 on PyPI (`mlflow`, the full package with the server). Not 3.18.0, the
newest: it pins `mlflow-tracing==3.18.0`, which PyPI does not have (yet), so pip cannot
install it."""

TRACKING_URI_VARIABLE = "TUNELOOP_MLFLOW_TRACKING_URI"
READY_MARKER = "ready.json"
_HEARTBEAT_SECONDS = 30.0

QUIET_ENVIRONMENT: Mapping[str, str] = {
    # MLflow sends anonymous usage data by default since 3.2; the opt-outs its docs name.
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
}


SERVER_ENVIRONMENT: Mapping[str, str] = {
    **QUIET_ENVIRONMENT,
    # The server's job runner (huey consumers for GenAI evaluation jobs) is eight more Python
    # processes that tuneloop never gives work to; on two cores they slow the start.
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}


class MlflowUnavailableError(ConfigError):
    """No MLflow server can be had here (pip failed, no interpreter): tests skip, CI fails."""


class MlflowStartError(RuntimeError):
    """The server exited or did not answer /health in time; the message carries its log tail."""


def _say(message: str) -> None:
    print(f"[tuneloop mlflow] {message}", file=sys.stderr, flush=True)


def mlflow_version() -> str:
    return os.environ.get("MLFLOW_VERSION", "").strip() or DEFAULT_MLFLOW_VERSION


def mlflow_home(version: str, *, cache: Path | None = None) -> Path:
    """`<cache>/mlflow-<version>`: the venv, its marker and the install log."""
    return (cache or cache_root()) / f"mlflow-{version}"


def prepared_python(version: str, *, cache: Path | None = None) -> Path | None:
    """The venv's interpreter if `prepare_mlflow()` completed for *version*, else None."""
    home = mlflow_home(version, cache=cache)
    python = home / "venv" / "bin" / "python"
    return python if (home / READY_MARKER).is_file() and python.is_file() else None


def _run_with_heartbeat(command: Sequence[str], *, log: Path, timeout: float, what: str) -> None:
    """Run *command*, its output appended to *log*, a progress line every 30 s."""
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(
            ["nice", "-n", "10", *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **QUIET_ENVIRONMENT},
        )
        while True:
            try:
                code = process.wait(timeout=_HEARTBEAT_SECONDS)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > timeout:
                    process.kill()
                    process.wait()
                    raise MlflowUnavailableError(
                        f"{what} took more than {timeout:.0f} s; log {log}"
                    ) from None
                _say(f"still {what} ({elapsed:.0f} s)")
    if code != 0:
        raise MlflowUnavailableError(f"{what} failed (exit {code}); log {log}:\n{read_tail(log)}")


def read_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_bytes()[-chars:].decode(errors="replace")
    except OSError:
        return f"(no log at {path})"


def prepare_mlflow(version: str | None = None, *, timeout: float = 1800.0) -> Path:
    """Make sure the server's venv is installed; return its python. Idempotent, safe in
    parallel (a file lock), and a half-built venv is never taken for a built one (the marker
    is written last).

    Raises:
        MlflowUnavailableError: the venv or the pip install failed.
    """
    version = version or mlflow_version()
    home = mlflow_home(version)
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = prepared_python(version)
        if ready is not None:
            return ready
        venv = home / "venv"
        python = venv / "bin" / "python"
        log = home / "install.log"
        log.write_bytes(b"")
        shutil.rmtree(venv, ignore_errors=True)
        _say(f"installing mlflow {version} into {venv} (once; a few minutes, log {log})")
        started = time.monotonic()
        _run_with_heartbeat(
            [sys.executable, "-m", "venv", str(venv)], log=log, timeout=300, what="creating a venv"
        )
        _run_with_heartbeat(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                f"mlflow=={version}",
            ],
            log=log,
            timeout=timeout,
            what=f"installing mlflow {version}",
        )
        _run_with_heartbeat(
            [str(python), "-c", "import mlflow.server"],
            log=log,
            timeout=300,
            what="checking the install",
        )
        seconds = time.monotonic() - started
        (home / READY_MARKER).write_text(
            json.dumps({"mlflow": version, "install_seconds": round(seconds)}) + "\n"
        )
        _say(f"mlflow {version} installed in {seconds:.0f} s")
        return python


def prepare() -> None:
    """`python -m devservices prepare mlflow`: install the server's venv, start it once."""
    python = prepare_mlflow()
    work_dir = Path(tempfile.mkdtemp(prefix="tuneloop-mlflow-"))
    try:
        with LocalMlflowServer(python=python, work_dir=work_dir) as server:
            _say(f"mlflow answered on {server.tracking_uri} in {server.last_start_seconds:.1f} s")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def server_command(*, python: Path, work_dir: Path, port: int) -> list[str]:
    """The `mlflow server` command line: sqlite, artifacts served by the server, loopback."""
    return [
        str(python),
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{work_dir / 'mlflow.db'}",
        "--serve-artifacts",
        "--artifacts-destination",
        str(work_dir / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # One worker: a test server answers a handful of requests, and each worker is a
        # Python process of ~200 MB on a machine whose two cores the tests share.
        "--workers",
        "1",
    ]


class LocalMlflowServer(LoopbackServer):
    """One `mlflow server` on 127.0.0.1, its database and artifacts under *work_dir*.

    `stop()` then `start()` keeps the port, the runs and the registry: that is how the tests
    take the server away from a training run and give it back.
    """

    def __init__(
        self,
        *,
        python: Path,
        work_dir: Path,
        port: int | None = None,
        start_timeout: float = 180.0,
        stop_timeout: float = 15.0,
    ) -> None:
        super().__init__(
            "mlflow server",
            work_dir=work_dir,
            log_name="mlflow.log",
            port=port or free_ports(1)[0],
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
        )
        self.python = python

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        """Start the server and return once `/health` answers 200.

        Raises:
            MlflowStartError: it exited or did not answer within `start_timeout` (the first
                start creates the database, which takes a few seconds of migrations).
        """
        if self.running:
            return self
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return self._launch_and_await(
            server_command(python=self.python, work_dir=self.work_dir, port=self.port),
            env={**os.environ, **SERVER_ENVIRONMENT},
            ready=lambda: is_healthy(self.tracking_uri),
            awaited=f"answer {self.tracking_uri}/health",
            poll_seconds=0.5,
            error=MlflowStartError,
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalMlflowServer({self.tracking_uri}, {state}, {self.work_dir})"


def is_healthy(tracking_uri: str, *, timeout: float = 2.0) -> bool:
    """True when the server's `/health` answers 200 (it does once the database is ready)."""
    return answers_200(f"{tracking_uri}/health", timeout=timeout)


# --- choosing a server for a test run -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class MlflowEndpoint:
    """The tracking server a test run uses, and the server if it is ours."""

    tracking_uri: str
    server: LocalMlflowServer | None = None


@contextlib.contextmanager
def mlflow_for_tests(work_dir: Path) -> Iterator[MlflowEndpoint]:
    """A tracking server for a test session: `TUNELOOP_MLFLOW_TRACKING_URI` (left running on
    exit) or a local one, installed first if needed and stopped on exit.

    Raises:
        MlflowUnavailableError: the venv could not be installed.
        MlflowStartError: the local server started but failed.
    """
    external = os.environ.get(TRACKING_URI_VARIABLE, "").strip()
    if external:
        yield MlflowEndpoint(external.rstrip("/"))
        return
    server = LocalMlflowServer(python=prepare_mlflow(), work_dir=work_dir)
    with server:
        yield MlflowEndpoint(server.tracking_uri, server)


def main(argv: Sequence[str]) -> int:
    """`python -m devservices.mlflow_server prepare|run`: `run` serves until Ctrl-C."""
    if list(argv) == ["prepare"]:
        prepare()
        return 0
    if list(argv) != ["run"]:
        print("usage: python -m devservices.mlflow_server prepare|run", file=sys.stderr)
        return 2

    def announce(server: LocalMlflowServer) -> None:
        print(f"export {TRACKING_URI_VARIABLE}={server.tracking_uri}", flush=True)

    return serve_until_interrupted(
        lambda work_dir: LocalMlflowServer(python=prepare_mlflow(), work_dir=work_dir),
        work_dir_prefix="tuneloop-mlflow-",
        announce=announce,
        say=_say,
        what="mlflow server",
    )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

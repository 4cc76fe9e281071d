"""A `tuneloop run` worker in a process of its own, as the benchmarks drive it.

The worker benchmarks (`bench/worker.py`, `bench/endtoend.py`, `bench/footprint.py`) start
the real command, `python -m handlers.cli.main run`, with its settings in `TUNELOOP_*`
variables, so that they measure whatever path the worker has when the bench runs, and so
that the worker's CPU time (`cpu_seconds`, from /proc) is its own: the producer and the
watchers of the benchmark run in the benchmark's process. Ready means `/readyz` answers 200
(partitions assigned, tables recovered, no rebalance under way).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class WorkerStartError(RuntimeError):
    """The worker exited, or was not ready in time: the benchmark has nothing to measure."""


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics one worker reads and writes."""

    events: str
    out: str
    audit: str
    dlq: str


@dataclass(frozen=True, slots=True)
class WorkerProcess:
    """A running worker: its process id (for /proc and a profiler) and its log file."""

    pid: int
    log: Path
    started: float
    """`time.perf_counter()` just before the process was started."""
    ready_after: float
    """Seconds from start to the first 200 of `/readyz`."""


def environment(
    *, bootstrap: str, topics: Topics, group: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The `TUNELOOP_KAFKA_*` variables of a worker on *bootstrap* with *topics*."""
    return {
        "TUNELOOP_KAFKA_BOOTSTRAP": bootstrap,
        "TUNELOOP_KAFKA_TOPICS_IN": topics.events,
        "TUNELOOP_KAFKA_TOPIC_OUT": topics.out,
        "TUNELOOP_KAFKA_TOPIC_AUDIT": topics.audit,
        "TUNELOOP_KAFKA_TOPIC_DLQ": topics.dlq,
        "TUNELOOP_KAFKA_GROUP_ID": group,
        **(extra or {}),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that process *pid* (all its threads) has used so far."""
    # /proc/<pid>/stat: after the command in parentheses, utime and stime are fields 12-13
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def running(
    arguments: list[str],
    *,
    env: Mapping[str, str],
    log: Path,
    ready_timeout: float = 120.0,
    stop_grace: float = 20.0,
) -> Iterator[WorkerProcess]:
    """`tuneloop run ARGUMENTS` with *env* on top of this process's environment, until ready;
    stopped (SIGTERM, then SIGKILL after *stop_grace* seconds) on exit.

    Raises:
        WorkerStartError: it exited or was not ready within *ready_timeout* seconds.
    """
    port = _free_port()
    command = [sys.executable, "-m", "handlers.cli.main", "run", *arguments]
    command += ["--web-port", str(port), "--log-level", "warning"]
    variables = {**os.environ, **env}
    variables["PYTHONPATH"] = f"{ROOT}{os.pathsep}{variables.get('PYTHONPATH', '')}"
    started = time.perf_counter()
    with log.open("ab") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=variables,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = started + ready_timeout
        while not _ready(port):
            if process.poll() is not None:
                raise WorkerStartError(
                    f"the worker exited ({process.returncode}) before it was ready:\n{_tail(log)}"
                )
            if time.perf_counter() > deadline:
                raise WorkerStartError(
                    f"the worker was not ready in {ready_timeout:.0f} s:\n{_tail(log)}"
                )
            time.sleep(0.05)
        yield WorkerProcess(
            pid=process.pid,
            log=log,
            started=started,
            ready_after=time.perf_counter() - started,
        )
    finally:
        stop(process, grace=stop_grace)


def stop(process: subprocess.Popen[bytes], *, grace: float) -> None:
    """Stop *process* and its session: SIGTERM, then SIGKILL after *grace* seconds."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

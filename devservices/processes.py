"""The life of one local server process: start, wait until ready, stop, read its log.

Who calls it: the local services that run one server process each, `kafka.LocalKafka`,
`object_storage.LocalObjectStorage`, `mlflow_server.LocalMlflowServer` and
`serving.LocalVllmServer`. Each keeps what is its own (the command line, the readiness probe,
its error type, what a restart keeps) and hands the process itself to a `ServiceProcess`, so
that every one of them is started, awaited and stopped the same way; each is a
`LocalServer`, so that `with server:` starts and stops it, and `serve_until_interrupted()` is
its `python -m devservices.<service> run`. The three HTTP ones are `LoopbackServer`s, which
also share their port, work folder, log and stop.

- the process runs in a session of its own, so that a signal reaches its whole tree (vLLM's
  engine core and worker, a JVM's helpers) and Ctrl-C in a terminal reaches only us;
- its stdout and stderr are appended to one log file, kept across restarts;
- a run that ends without its finalizers still kills the group (`atexit`), so that no server
  outlives the test session holding its ports;
- a start that fails kills the group, so that it leaves nothing running;
- `stop()` sends SIGTERM, then SIGKILL to the group after a timeout, and reaps the group.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

LOG_TAIL_LINES = 40
"""How much of a log a start-up error carries: enough for a JVM's or Python's stack trace."""

_REAP_SECONDS = 10.0
"""How long a failed start waits for its SIGKILLed group before signalling it again."""


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last *lines* lines of *path*, read without loading the whole file."""
    try:
        with path.open("rb") as log:
            kept = deque(log, maxlen=lines)
    except OSError:
        return f"(no log at {path})"
    return b"".join(kept).decode(errors="replace")


class ServiceProcess:
    """One server process in its own session, its output appended to *log_path*.

    *what* names the server in error messages ("s3proxy", "the Kafka broker").
    """

    def __init__(self, what: str, *, log_path: Path) -> None:
        self.what = what
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None
        self._kill_at_exit: Callable[[], None] | None = None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id while it runs, else None."""
        popen = self._popen
        return popen.pid if popen is not None and popen.poll() is None else None

    def launch(self, command: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
        """Start *command*; return the log offset where this run's output begins."""
        with self.log_path.open("ab") as log:
            offset = log.tell()
            self._popen = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Bound to this Popen, not to self: a later launch registers its own.
        self._kill_at_exit = functools.partial(_kill_group, self._popen)
        atexit.register(self._kill_at_exit)
        return offset

    def wait_until_ready(
        self,
        ready: Callable[[], bool],
        *,
        awaited: str,
        started: float,
        timeout: float,
        poll_seconds: float,
        error: type[Exception],
    ) -> None:
        """Return once *ready()* is true, polling every *poll_seconds*.

        Args:
            ready: the service's readiness probe.
            awaited: what *ready* waits for, for the message ("answer on http://...").
            started: the `time.monotonic()` the start began at; the deadline counts from it.
            timeout: seconds from *started* to give up.
            poll_seconds: the pause between two probes.
            error: the service's own start error type.

        Raises:
            error: the process exited, or *ready* stayed false past the deadline; the
                message carries the log's tail. The group is killed first, as on any
                exception (Ctrl-C included), so that a failed start leaves nothing running.
        """
        try:
            self._poll_until_ready(
                ready,
                awaited=awaited,
                deadline=started + timeout,
                timeout=timeout,
                poll_seconds=poll_seconds,
                error=error,
            )
        except BaseException:
            self.stop(signal.SIGKILL, timeout=_REAP_SECONDS)
            raise

    def _poll_until_ready(
        self,
        ready: Callable[[], bool],
        *,
        awaited: str,
        deadline: float,
        timeout: float,
        poll_seconds: float,
        error: type[Exception],
    ) -> None:
        popen = self._popen
        assert popen is not None, "wait_until_ready() before launch()"
        while True:
            if popen.poll() is not None:
                raise error(
                    f"{self.what} exited with {popen.returncode} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise error(
                    f"{self.what} did not {awaited} within {timeout:.0f} s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(poll_seconds)

    def stop(self, signum: signal.Signals = signal.SIGTERM, *, timeout: float) -> bool:
        """Send *signum* to the group, SIGKILL after *timeout*, reap the group; a no-op when
        never launched.

        Returns:
            True when the process ended on *signum* (or had ended before), short of SIGKILL:
            the Kafka broker keeps what it writes at a clean exit only then.
        """
        popen = self._popen
        if popen is None:
            return False
        exited_on_its_own = signum != signal.SIGKILL
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signum)
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                exited_on_its_own = False
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        # Children (vLLM's engine core and worker) may outlive the leader by a moment.
        _kill_group(popen)
        if self._kill_at_exit is not None:
            atexit.unregister(self._kill_at_exit)
            self._kill_at_exit = None
        self._popen = None
        return exited_on_its_own

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines)


def _kill_group(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)


class LocalServer(abc.ABC):
    """A local service that `with` starts and stops, whatever the block raises."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start the service and return it once it serves."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the service; a no-op when it is not running."""

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """Whether its process is alive now."""

    @abc.abstractmethod
    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last *lines* lines of its log."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class LoopbackServer(LocalServer):
    """A `LocalServer` of one process group on a loopback port, whose log lies in its work
    folder: what the HTTP services (`object_storage`, `mlflow_server`, `serving`) share. Each
    keeps its command line, environment, readiness probe, error type and `__repr__`, and
    starts through `_launch_and_await`. `stop()` then `start()` keeps the port and the work
    folder, which is how tests take a server away and give it back."""

    def __init__(
        self,
        what: str,
        *,
        work_dir: Path,
        log_name: str,
        port: int,
        start_timeout: float,
        stop_timeout: float,
    ) -> None:
        self.work_dir = work_dir
        self.port = port
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.last_start_seconds = 0.0
        self._log_name = log_name
        self._server = ServiceProcess(what, log_path=self.log_path)

    @property
    def log_path(self) -> Path:
        return self.work_dir / self._log_name

    @property
    def running(self) -> bool:
        return self._server.running

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return self._server.log_tail(lines)

    def stop(self) -> None:
        """SIGTERM to the group, then SIGKILL after `stop_timeout`; a no-op when not running."""
        self._server.stop(signal.SIGTERM, timeout=self.stop_timeout)

    def _launch_and_await(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        ready: Callable[[], bool],
        awaited: str,
        poll_seconds: float,
        error: type[Exception],
    ) -> Self:
        """Launch *command* and return once *ready()* (`ServiceProcess.wait_until_ready`),
        keeping how long the start took in `last_start_seconds`."""
        started = time.monotonic()
        self._server.launch(command, env=env)
        self._server.wait_until_ready(
            ready,
            awaited=awaited,
            started=started,
            timeout=self.start_timeout,
            poll_seconds=poll_seconds,
            error=error,
        )
        self.last_start_seconds = time.monotonic() - started
        return self


def answers_200(url: str, *, timeout: float = 2.0) -> bool:
    """True when a GET of *url* answers 200 (a server's health endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - our own loopback URL
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


Server = TypeVar("Server", bound=LocalServer)


def serve_until_interrupted(
    make: Callable[[Path], Server],
    *,
    work_dir_prefix: str,
    announce: Callable[[Server], None],
    say: Callable[[str], None],
    what: str,
) -> int:
    """Run one server in a fresh temporary work directory until Ctrl-C or SIGTERM.

    Args:
        make: builds the server on the work directory (and may prepare it first).
        work_dir_prefix: the temporary directory's prefix; it is removed at the end.
        announce: called once the server serves (the `export ...` lines to copy).
        say: where the exit report goes.
        what: names the server in that report ("s3proxy").

    Returns:
        0 when interrupted, 1 when the server exited on its own.
    """
    work_dir = Path(tempfile.mkdtemp(prefix=work_dir_prefix))
    # SIGTERM unwinds like Ctrl-C, so the server is stopped by the `with` below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with make(work_dir) as server:
            announce(server)
            while server.running:
                time.sleep(1)
            say(f"{what} exited on its own; its log ends:\n{server.log_tail(LOG_TAIL_LINES)}")
            return 1
    except KeyboardInterrupt:
        return 0
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

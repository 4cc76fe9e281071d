"""`devservices.processes.ServiceProcess`: real shell processes, started, awaited and stopped."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from devservices.processes import (
    LocalServer,
    ServiceProcess,
    read_log_tail,
    serve_until_interrupted,
)


class SketchStartError(RuntimeError):
    """Stands for a service's own start error (BrokerStartError, ObjectStorageStartError)."""


def _never_ready() -> bool:
    return False


def _alive(pid: int) -> bool:
    """A killed orphan may stay a zombie where nothing reaps it (PID 1 in a container)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for_text(path: Path, text: str, *, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in (content := path.read_text()):
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_a_process_that_exits_while_starting_raises_the_services_error_with_its_log(
    tmp_path: Path,
) -> None:
    server = ServiceProcess("the sketch server", log_path=tmp_path / "server.log")
    server.launch(["sh", "-c", "echo 'port already taken'; exit 3"])

    with pytest.raises(SketchStartError) as raised:
        server.wait_until_ready(
            _never_ready,
            awaited="answer",
            started=time.monotonic(),
            timeout=30,
            poll_seconds=0.05,
            error=SketchStartError,
        )

    message = str(raised.value)
    assert message.startswith("the sketch server exited with 3 while starting")
    assert "port already taken" in message
    assert not server.running


def test_a_process_that_never_gets_ready_raises_once_the_timeout_has_passed_and_is_killed(
    tmp_path: Path,
) -> None:
    server = ServiceProcess("the sketch server", log_path=tmp_path / "server.log")
    server.launch(["sleep", "30"])
    pid = server.pid
    assert pid is not None

    with pytest.raises(SketchStartError, match=r"did not answer on port 1 within 0 s"):
        server.wait_until_ready(
            _never_ready,
            awaited="answer on port 1",
            started=time.monotonic(),
            timeout=0.2,
            poll_seconds=0.05,
            error=SketchStartError,
        )
    assert not server.running
    assert not _alive(pid)


def test_readiness_returns_as_soon_as_the_probe_says_so(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = ServiceProcess("the sketch server", log_path=log)
    offset = server.launch(["sh", "-c", "echo listening; exec sleep 30"])

    server.wait_until_ready(
        lambda: "listening" in log.read_text()[offset:],
        awaited="log 'listening'",
        started=time.monotonic(),
        timeout=10,
        poll_seconds=0.05,
        error=SketchStartError,
    )

    assert server.running
    assert server.pid is not None
    assert server.stop(timeout=5) is True
    assert server.pid is None


def test_a_second_run_appends_to_the_log_and_reports_where_its_output_begins(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    server = ServiceProcess("the sketch server", log_path=log)
    server.launch(["sh", "-c", "echo first run"])
    _wait_for_text(log, "first run")
    server.stop(timeout=5)

    offset = server.launch(["sh", "-c", "echo second run"])
    _wait_for_text(log, "second run")
    server.stop(timeout=5)

    assert offset == len("first run\n")
    assert log.read_text() == "first run\nsecond run\n"


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout_and_says_so(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    server = ServiceProcess("the sketch server", log_path=log)
    server.launch(["sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.1; done"])
    _wait_for_text(log, "trapped")

    clean = server.stop(signal.SIGTERM, timeout=0.5)

    assert clean is False
    assert not server.running


def test_stopping_reaches_the_children_in_the_process_group(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = ServiceProcess("the sketch server", log_path=log)
    # The child ignores SIGTERM, so only the SIGKILL to the group after the leader's exit
    # ends it.
    server.launch(["sh", "-c", "(trap '' TERM; exec sleep 30) & echo child=$!; wait"])
    child = int(_wait_for_text(log, "child=").split("child=")[1].split()[0])
    assert _alive(child)

    server.stop(timeout=5)

    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)  # the signal is delivered asynchronously
    assert not _alive(child)


def test_stopping_a_process_that_never_started_is_a_no_op(tmp_path: Path) -> None:
    server = ServiceProcess("the sketch server", log_path=tmp_path / "server.log")

    assert server.stop(timeout=1) is False
    assert not server.running
    assert server.pid is None


def test_a_log_tail_is_the_last_lines_and_names_a_missing_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("one\ntwo\nthree\n")

    assert read_log_tail(log, 2) == "two\nthree\n"
    assert read_log_tail(tmp_path / "absent.log") == f"(no log at {tmp_path / 'absent.log'})"


class SketchServer(LocalServer):
    """A server whose process is gone as soon as it has started."""

    def __init__(self, work_dir: Path | None = None) -> None:
        self.work_dir = work_dir
        self.calls: list[str] = []

    def start(self) -> SketchServer:
        self.calls.append("start")
        return self

    def stop(self) -> None:
        self.calls.append("stop")

    @property
    def running(self) -> bool:
        return False

    def log_tail(self, lines: int = 40) -> str:
        return f"OutOfMemoryError (last {lines} lines)"


def _fail_inside(server: SketchServer) -> None:
    with server as entered:
        assert entered is server
        raise KeyError("the test failed")


def test_a_local_server_is_stopped_when_its_with_block_raises() -> None:
    server = SketchServer()

    with pytest.raises(KeyError):
        _fail_inside(server)

    assert server.calls == ["start", "stop"]


def test_serving_by_hand_reports_a_server_that_exits_on_its_own_and_removes_its_work_dir(
    tmp_path: Path,
) -> None:
    built: list[SketchServer] = []
    announced: list[SketchServer] = []
    said: list[str] = []

    def make(work_dir: Path) -> SketchServer:
        built.append(SketchServer(work_dir))
        return built[-1]

    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = serve_until_interrupted(
            make,
            work_dir_prefix=f"{tmp_path}/sketch-",
            announce=announced.append,
            say=said.append,
            what="the sketch server",
        )
    finally:
        signal.signal(signal.SIGTERM, previous)

    assert code == 1
    assert announced == built
    assert built[0].calls == ["start", "stop"]
    assert said == [
        "the sketch server exited on its own; its log ends:\nOutOfMemoryError (last 40 lines)"
    ]
    work_dir = built[0].work_dir
    assert work_dir is not None
    assert work_dir.name.startswith("sketch-")
    assert not work_dir.exists()

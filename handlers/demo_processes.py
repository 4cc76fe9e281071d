"""The two tuneloop processes `tuneloop demo` starts: the worker and the hand-off.

Each is the real command (`tuneloop run --backend local`, `tuneloop handoff`) in a session of
its own, its output in a log under the run directory, configured through its environment as
a deployment would configure it. `handlers/demo.py` starts them; the steps that wait on Kafka
(`demo_stream.py`) call `check()` while they wait, so that a process that died is reported
with its log instead of a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from handlers.demo_run import MODEL_ID, DemoError, DemoRun, DemoTopics

LOG_TAIL_CHARS = 3000


@dataclass(frozen=True, slots=True)
class DemoProcess:
    """One running tuneloop command and its log."""

    what: str
    """How the narration names it ("the worker")."""
    popen: subprocess.Popen[bytes]
    log: Path

    def check(self) -> None:
        """Raises DemoError when the process has exited: it should run until the demo ends."""
        code = self.popen.poll()
        if code is not None:
            raise DemoError(
                f"{self.what} exited with {code}; its log {self.log} ends:\n{log_tail(self.log)}"
            )


def log_tail(path: Path) -> str:
    try:
        return path.read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace")
    except OSError:
        return f"(no log at {path})"


def kafka_environment(bootstrap: str, topics: DemoTopics) -> dict[str, str]:
    """The demo's broker and topics, as `TUNELOOP_KAFKA_*` variables."""
    return {
        "TUNELOOP_KAFKA_BOOTSTRAP": bootstrap,
        "TUNELOOP_KAFKA_TOPICS_IN": topics.events,
        "TUNELOOP_KAFKA_TOPIC_OUT": topics.finetune,
        "TUNELOOP_KAFKA_TOPIC_AUDIT": topics.audit,
        "TUNELOOP_KAFKA_TOPIC_DLQ": topics.dlq,
    }


@contextlib.contextmanager
def worker(
    run: DemoRun, *, bootstrap: str, storage: Mapping[str, str], tracking_uri: str
) -> Iterator[DemoProcess]:
    """`tuneloop run --backend local` on the demo's rules; stopped (and its trainers) on exit.

    Args:
        storage: the S3 endpoint and keys; the local backend's trainers inherit them, as a
            Secret gives them to a pod (docs/storage.md).
        tracking_uri: the MLflow server; the backend gives it to each trainer.
    """
    env = {
        **kafka_environment(bootstrap, run.topics),
        **storage,
        "TUNELOOP_KAFKA_GROUP_ID": "tuneloop-demo",
        "TUNELOOP_KAFKA_INTERNAL_PARTITIONS": "1",
        "TUNELOOP_MLFLOW_TRACKING_URI": tracking_uri,
    }
    command = ["run", "--rules", str(run.rules), "--backend", "local"]
    command += ["--local-root", str(run.jobs), "--log-level", "warning"]
    with _tuneloop("the worker", command, env=env, cwd=run.root, log=run.worker_log) as process:
        try:
            yield process
        finally:
            _stop(process.popen)
            for job in run.jobs.glob("*/"):
                _stop_job(job)


@contextlib.contextmanager
def handoff(
    run: DemoRun, *, bootstrap: str, vllm_url: str, adapter_paths: Mapping[str, str]
) -> Iterator[DemoProcess]:
    """`tuneloop handoff` with the demo's vLLM as the one target of its model; stopped on exit.

    Args:
        adapter_paths: `TUNELOOP_HANDOFF_PATHS`: where vLLM reads what the trainer published.
    """
    env = {
        **kafka_environment(bootstrap, run.topics),
        "TUNELOOP_HANDOFF_TARGETS": json.dumps({MODEL_ID: [vllm_url]}),
        "TUNELOOP_HANDOFF_PATHS": json.dumps(dict(adapter_paths)),
        "TUNELOOP_HANDOFF_TOPIC_LEDGER": run.topics.ledger,
        "TUNELOOP_HANDOFF_GROUP_ID": "tuneloop-demo-handoff",
    }
    command = ["handoff", "--log-level", "warning"]
    with _tuneloop("the hand-off", command, env=env, cwd=run.root, log=run.handoff_log) as process:
        try:
            yield process
        finally:
            _stop(process.popen)


@contextlib.contextmanager
def _tuneloop(
    what: str, arguments: list[str], *, env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[DemoProcess]:
    with log.open("wb") as out:
        popen = _spawned(
            lambda: subprocess.Popen(
                [sys.executable, "-m", "handlers.cli.main", *arguments],
                cwd=cwd,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    yield DemoProcess(what, popen, log)


def _spawned(start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """*start()* in a thread of its own, as the demo starts its services (`demo.Starting`):
    Ctrl-C and SIGTERM interrupt only the main thread, so never `Popen` between the fork and
    the moment it returns the process, which would then run on, known to no one. A process
    started while the main thread was interrupted is stopped before the interrupt goes on."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-spawn")
    future = pool.submit(start)
    try:
        return future.result()
    except BaseException:
        with contextlib.suppress(Exception):  # Popen's own failure: nothing runs
            _stop(future.result())
        raise
    finally:
        pool.shutdown(wait=False)


def _stop(process: subprocess.Popen[bytes], *, grace: float = 20.0) -> None:
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


def _stop_job(job_dir: Path) -> None:
    """A trainer still running when the demo ends (it was interrupted) is stopped too."""
    started = job_dir / "started.json"
    if not started.exists() or (job_dir / "exit.json").exists():
        return
    with contextlib.suppress(ValueError, OSError, KeyError):
        pid = int(json.loads(started.read_text())["supervisor_pid"])
        os.killpg(pid, signal.SIGTERM)

"""`python -m runtimes.localprocess.supervisor JOB_DIR -- COMMAND...`: runs one trainer and
records how it ended, even when the orchestrator that launched it is gone.

`LocalProcessBackend` starts this small process (no torch import; it costs milliseconds); it
forks, the first process exits at once, and the second runs on in its own session, so a
crash or restart of the orchestrator does not take the training down and the orchestrator
keeps no child handles. It writes into the job directory:

    started.json   {"supervisor_pid", "trainer_pid", "started_at"}  once the trainer runs
    stdout.log     the trainer's stdout (its JSON progress lines)
    stderr.log     the trainer's stderr
    exit.json      {"returncode", "cancelled", "finished_at"}  written last, atomically

SIGTERM (the backend's cancel) is forwarded to the trainer; the exit is then recorded as
cancelled. A new backend instance reads these files to report the job's final state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

CANCEL_MARKER = "cancel-requested"


def write_json_atomically(path: Path, payload: Mapping[str, object]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    partial.replace(path)


def supervise(job_dir: Path, command: list[str]) -> int:
    terminated = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True
        if child is not None and child.poll() is None:
            child.terminate()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if (job_dir / CANCEL_MARKER).exists():  # cancelled while it was being launched
        write_json_atomically(
            job_dir / "exit.json",
            {"returncode": None, "cancelled": True, "finished_at": time.time()},
        )
        return 0
    with (job_dir / "stdout.log").open("ab") as out, (job_dir / "stderr.log").open("ab") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, cwd=job_dir)
        write_json_atomically(
            job_dir / "started.json",
            {"supervisor_pid": os.getpid(), "trainer_pid": child.pid, "started_at": time.time()},
        )
        if terminated:  # a cancel that arrived while the child was being created
            child.terminate()
        returncode = child.wait()
    cancelled = terminated or (job_dir / CANCEL_MARKER).exists()
    write_json_atomically(
        job_dir / "exit.json",
        {"returncode": returncode, "cancelled": cancelled, "finished_at": time.time()},
    )
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(
            "usage: python -m runtimes.localprocess.supervisor JOB_DIR -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    job_dir, command = Path(argv[0]), argv[2:]
    # Detach: the launching backend reaps this process at once, and the supervisor that goes
    # on (in its own session, a child of init) survives the backend's crash or restart.
    if os.fork() != 0:
        return 0
    os.setsid()
    return supervise(job_dir, command)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

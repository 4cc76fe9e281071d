"""docs/getting-started.md works as written: every `bash` block, in order, in one shell.

`make demo` runs with the tiny model (`TUNELOOP_DEMO_MODEL=tiny`), the by-hand loop as the page
shows it, in a directory of the test's own instead of the page's `/tmp/tuneloop-start`. What
the page promises to print is checked: the demo's narration and the adapter and eval losses of
the hand-made job. What the page leaves running is stopped by process id: each process the
page's shell starts inherits a mark in its environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.training, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
PAGE_WORK = "/tmp/tuneloop-start"
"""The directory the page works in; the test gives each run its own instead."""
MARK = "TUNELOOP_GETTING_STARTED_RUN"
"""Set to a fresh id in the page's shell: every process it starts inherits it, the broker and
the trainer too, although they run in sessions of their own."""


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL)


def processes_marked(run_id: str) -> list[int]:
    """The ids of the processes whose environment carries this run's mark."""
    needle = f"{MARK}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            with contextlib.suppress(OSError):  # gone, or not ours to read
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def stop_processes_of(run_id: str, *, grace: float = 20.0) -> None:
    """SIGTERM what the page left running, then SIGKILL what is still there after *grace*.

    Looked up afresh before each signal, so a process id is only ever signalled while a
    process of this run holds it.
    """
    for pid in processes_marked(run_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while processes_marked(run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in processes_marked(run_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_the_page_has_the_one_command_and_the_by_hand_loop():
    blocks = bash_blocks(PAGE.read_text())
    assert blocks[0].strip() == "make demo"
    assert any("tuneloop run" in block for block in blocks)
    assert PAGE_WORK in "\n".join(blocks)


def test_every_command_on_the_getting_started_page_runs(tmp_path: Path):
    work = tmp_path / "start"
    page = "\n".join(bash_blocks(PAGE.read_text())).replace(PAGE_WORK, str(work))
    script = "set -euo pipefail\n" + page
    run_id = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["TUNELOOP_DEMO_MODEL"] = "tiny"
    env[MARK] = run_id
    log = tmp_path / "output.log"
    with log.open("wb") as out:
        shell = subprocess.Popen(
            ["bash", "-c", script],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = shell.wait(timeout=1100)
        finally:
            if shell.poll() is None:
                os.killpg(shell.pid, signal.SIGKILL)
                shell.wait()
            # whatever the page started in the background must not outlive the test
            stop_processes_of(run_id)
    output = log.read_text(errors="replace")
    assert code == 0, output[-6000:]
    assert "decision: launch" in output
    assert "suppress (cooldown)" in output
    assert "demo finished" in output
    adapter = re.escape(f"adapter: file://{work}/jobs/")
    assert re.search(adapter + r".+/adapter", output), output[-3000:]
    assert re.search(r"eval loss: [\d.]+ -> [\d.]+", output)
    assert "launch" in output.split("decision: launch", 1)[1]  # the by-hand audit shows it too

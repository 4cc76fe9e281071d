"""docs/getting-started.md works as written: every `bash` block, in order, in one shell.

`make demo` runs with the tiny model (`TUNELOOP_DEMO_MODEL=tiny`), the by-hand loop as the page
shows it, in a directory of the test's own instead of the page's `/tmp/tuneloop-start`. What
the page promises to print is checked: the demo's narration (its eight steps as the page's
transcript has them, the dataset on S3, the promotion, the MLflow run, and the reason serving
is skipped for the tiny model) and the adapter and eval losses of the hand-made job. The
serving steps themselves run against a real vLLM in test_demo_loop.py. What the page leaves
running is stopped by process id: each process the page's shell starts inherits a mark in its
environment.
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


def demo_transcript(markdown: str) -> str:
    """The page's transcript of `make demo`: the `text` block that starts as the demo does."""
    (transcript,) = [
        block
        for block in re.findall(r"```text\n(.*?)```", markdown, flags=re.DOTALL)
        if block.startswith("tuneloop demo — ")
    ]
    return str(transcript)


def step_headings(output: str) -> list[str]:
    """The demo's step lines, `[n/8] ...`, in order."""
    return re.findall(r"^\[\d/\d\] .*$", output, flags=re.MULTILINE)


def summary_labels(output: str) -> set[str]:
    """The labels of step 6's summary lines (`      adapter  : ...`), as printed."""
    step_6 = output.split("\n[6/8] ", 1)[1].split("\n[7/8] ", 1)[0]
    return set(re.findall(r"^ {6}(\w[\w ]{8}): ", step_6, flags=re.MULTILINE))


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
    assert len(step_headings(demo_transcript(PAGE.read_text()))) == 8


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
    # The demo prints the steps the page shows, in the same words and order, and the
    # summary of the completion with the same labels.
    transcript = demo_transcript(PAGE.read_text())
    assert step_headings(output) == step_headings(transcript)
    assert summary_labels(output) == summary_labels(transcript) != set()
    assert "uploaded 300 rows to s3://tuneloop-demo/datasets/unit-conversions.jsonl" in output
    assert re.search(r"adapter  : s3://tuneloop-demo/adapters/assistant-[\w-]+ ", output)
    assert "promoted : True (no champion yet" in output
    assert re.search(r"MLflow   : http://127\.0\.0\.1:\d+/#/experiments/\d+/runs/\w+", output)
    assert "(alias champion)" in output
    # vLLM cannot serve the tiny model: the page's fast path says so instead of serving.
    assert "skipped: vLLM cannot serve the tiny model: its head size is 16" in output
    adapter = re.escape(f"adapter: file://{work}/jobs/")
    assert re.search(adapter + r".+/adapter", output), output[-3000:]
    assert re.search(r"eval loss: [\d.]+ -> [\d.]+", output)
    assert "launch" in output.split("decision: launch", 1)[1]  # the by-hand audit shows it too

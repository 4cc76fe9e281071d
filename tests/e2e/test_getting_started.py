"""docs/getting-started.md works as written: every `bash` block, in order, in one shell.

`make demo` runs with the tiny model (`TUNELOOP_DEMO_MODEL=tiny`), the by-hand loop as the page
shows it. What the page promises to print is checked: the demo's narration and the adapter
and eval losses of the hand-made job.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.training, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
WORK = Path("/tmp/tuneloop-start")


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL)


def test_the_page_has_the_one_command_and_the_by_hand_loop():
    blocks = bash_blocks(PAGE.read_text())
    assert blocks[0].strip() == "make demo"
    assert any("tuneloop run" in block for block in blocks)


def test_every_command_on_the_getting_started_page_runs(tmp_path: Path):
    shutil.rmtree(WORK, ignore_errors=True)
    script = "set -euo pipefail\n" + "\n".join(bash_blocks(PAGE.read_text()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["TUNELOOP_DEMO_MODEL"] = "tiny"
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
            # whatever the page started in the background must not outlive the test
            subprocess.run(["pkill", "-f", str(WORK)], check=False)
    output = log.read_text(errors="replace")
    assert code == 0, output[-6000:]
    assert "decision: launch" in output
    assert "suppress (cooldown)" in output
    assert "demo finished" in output
    assert re.search(r"adapter: file:///tmp/tuneloop-start/jobs/.+/adapter", output), output[-3000:]
    assert re.search(r"eval loss: [\d.]+ -> [\d.]+", output)
    assert "launch" in output.split("decision: launch", 1)[1]  # the by-hand audit shows it too

"""docs/kubernetes.md's "A local cluster" works as written: its `bash` blocks, in order, in one
shell, in a directory of the test's own instead of the page's `/tmp/tuneloop-cluster`.

What the page leaves running (`tuneloop services up` and the cluster under it) is stopped by
process id, as in tests/e2e/test_getting_started.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from devservices.control_plane import installed_binaries
from tests.e2e.test_getting_started import MARK, bash_blocks, stop_processes_of

pytestmark = [pytest.mark.kubernetes, pytest.mark.runs_pods, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "kubernetes.md"
PAGE_WORK = "/tmp/tuneloop-cluster"


def section(markdown: str, title: str) -> str:
    start = markdown.index(f"## {title}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else None]


def test_the_local_cluster_walkthrough_runs_a_job_to_completion(tmp_path: Path) -> None:
    if installed_binaries() is None:
        pytest.skip("the local control plane is not built: run `make services`")
    if shutil.which("kubectl") is None:
        pytest.skip("the walkthrough uses kubectl, which is not installed")
    blocks = bash_blocks(section(PAGE.read_text(), "A local cluster"))
    script = "\n".join(block.replace(PAGE_WORK, str(tmp_path)) for block in blocks)
    run_id = uuid.uuid4().hex
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
    # The page's reader has the project's environment active: its `tuneloop` comes first.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env[MARK] = run_id
    # Output to a file, not a pipe: the cluster the page leaves running keeps a pipe open.
    output = tmp_path / "output.log"
    try:
        with output.open("wb") as out:
            shell = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            code = shell.wait(timeout=300)
    finally:
        stop_processes_of(run_id)
    printed = output.read_text()

    assert code == 0, printed
    assert re.search(r"tuneloop-local\s+Ready", printed), printed
    assert "tuneloop-lora" in printed
    assert "job.batch/hello condition met" in printed
    logs = list(tmp_path.glob("kubernetes/node/pods/*/logs/hello.log"))
    assert [log.read_text().split()[:2] for log in logs] == [["hello", "from"]]

"""The orchestrator Dockerfile (no Docker on this machine: the checks that need none)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = (REPO / "deploy" / "orchestrator.Dockerfile").read_text()


def test_everything_it_copies_from_the_repository_exists():
    sources = []
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    assert sources
    assert [s for s in sources if not (REPO / s).exists()] == []


def test_it_runs_as_the_non_root_user_the_chart_expects():
    (user,) = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE, flags=re.MULTILINE)
    values = yaml.safe_load((REPO / "deploy" / "helm" / "tuneloop" / "values.yaml").read_text())
    assert int(user[0]) == values["podSecurityContext"]["runAsUser"] != 0


def test_it_leaves_the_training_stack_out():
    assert "torch" in DOCKERFILE.split("grep -v -E", 1)[1].splitlines()[0]
    assert ".[train" not in DOCKERFILE

"""A failed trainer in a pod leaves its reason where the kubelet takes the container's
terminated message from, so no log tail can cut it; outside a pod it writes nothing there."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimes.trainer import __main__ as trainer_program


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    path.write_bytes(b"")  # the kubelet creates it empty
    monkeypatch.setattr(trainer_program, "TERMINATION_MESSAGE_PATH", path)
    return path


def test_a_trainer_failing_in_a_pod_writes_its_one_line_reason_for_the_kubelet(
    termination_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")

    assert trainer_program.main(["--no-such-setting", "x"]) == 2

    told = termination_log.read_text()
    assert told.startswith("tuneloop-train: ")
    assert "no_such_setting" in told
    assert told.count("\n") == 1


def test_a_trainer_failing_outside_a_pod_leaves_the_file_alone(
    termination_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    assert trainer_program.main(["--no-such-setting", "x"]) == 2

    assert termination_log.read_bytes() == b""


def test_a_reason_longer_than_the_kubelet_keeps_is_cut_to_what_it_keeps(
    termination_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")

    assert trainer_program.main([f"--{'x' * 5000}", "1"]) == 2

    assert len(termination_log.read_bytes()) == 4096  # core/v1: the kubelet keeps 4096 bytes

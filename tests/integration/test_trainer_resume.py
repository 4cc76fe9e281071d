"""A trainer killed mid-run and started again resumes from its last checkpoint and ends with
exactly the adapter an uninterrupted run produces (tiny model, CPU, bitwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtimes.trainer.training import FAULT_CRASH_AT_STEP

pytestmark = pytest.mark.training


def _train(model: Path, dataset: Path, output: Path, *, crash_at: int | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_TRAIN_")}
    if crash_at is not None:
        env[FAULT_CRASH_AT_STEP] = str(crash_at)
    command = [
        sys.executable,
        "-m",
        "runtimes.trainer",
        "--base-model",
        str(model),
        "--dataset",
        str(dataset),
        "--output-dir",
        str(output),
        "--max-steps",
        "12",
        "--save-steps",
        "4",
        "--batch-size",
        "4",
        "--learning-rate",
        "3e-3",
        "--progress",
        "json",
        "--progress-interval",
        "0",
    ]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, timeout=300
    )


def _tensors(adapter: Path) -> dict[str, bytes]:
    from safetensors.torch import load_file

    return {
        name: tensor.numpy().tobytes()
        for name, tensor in load_file(adapter / "adapter_model.safetensors").items()
    }


def test_killed_run_resumed_from_checkpoint_equals_the_uninterrupted_run(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path
):
    whole = _train(tiny_model_dir, reverse_dataset, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]

    killed = _train(tiny_model_dir, reverse_dataset, tmp_path / "split", crash_at=7)
    assert killed.returncode == 17
    checkpoints = sorted(p.name for p in (tmp_path / "split" / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint-4"]
    assert not (tmp_path / "split" / "result.json").exists()

    resumed = _train(tiny_model_dir, reverse_dataset, tmp_path / "split")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    lines = [json.loads(line) for line in resumed.stdout.splitlines() if line.startswith("{")]
    started = next(line for line in lines if line["event"] == "started")
    assert started["resumed_from"].endswith("checkpoint-4")
    assert [line["step"] for line in lines if line["event"] == "progress"] == list(range(5, 13))

    assert _tensors(tmp_path / "split" / "adapter") == _tensors(tmp_path / "whole" / "adapter")
    whole_result = json.loads((tmp_path / "whole" / "result.json").read_text())
    split_result = json.loads((tmp_path / "split" / "result.json").read_text())
    assert split_result["metrics"]["eval_loss_after"] == whole_result["metrics"]["eval_loss_after"]
    assert split_result["metrics"]["tokens_seen"] == whole_result["metrics"]["tokens_seen"]

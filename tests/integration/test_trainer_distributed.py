"""The trainer under torchrun, configured only by Kubeflow's PET_* variables: 2 CPU processes
with gloo, one result written by rank 0."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.training


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_process_gloo_run_trains_and_rank_zero_writes_one_result(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNELOOP_TRAIN_")}
    env.update(
        {
            # What the Kubeflow Trainer's torch plugin sets on each node (lora.md §4.4).
            "PET_NNODES": "1",
            "PET_NPROC_PER_NODE": "2",
            "PET_NODE_RANK": "0",
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(_free_port()),
            "OMP_NUM_THREADS": "1",
        }
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--module",
        "runtimes.trainer",
        "--base-model",
        str(tiny_model_dir),
        "--dataset",
        str(reverse_dataset),
        "--output-dir",
        str(tmp_path),
        "--max-steps",
        "6",
        "--batch-size",
        "4",
        "--save-steps",
        "0",
        "--learning-rate",
        "3e-3",
        "--progress",
        "json",
    ]
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]

    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert [line["event"] for line in lines].count("started") == 1, "only rank 0 reports"
    started = next(line for line in lines if line["event"] == "started")
    assert started["world_size"] == 2
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["training"]["world_size"] == 2
    assert result["metrics"]["steps"] == 6
    # Each step consumed a batch on each of the two ranks.
    single_rank_tokens = 6 * 4
    assert result["metrics"]["tokens_seen"] > single_rank_tokens
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

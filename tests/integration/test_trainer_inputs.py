"""What the trainer accepts as its inputs inside a TrainJob, on the tiny model: a dataset
directory as Kubeflow's dataset initializer writes it, and the models it may start from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtimes.models import tiny
from runtimes.trainer import training
from runtimes.trainer.config import ProgressMode, TrainerConfig
from runtimes.trainer.progress import SilentReporter

pytestmark = pytest.mark.training


def _config(model: str, dataset: Path, output: Path, **changes: Any) -> TrainerConfig:
    values: dict[str, Any] = {
        "base_model": model,
        "dataset": str(dataset),
        "output_dir": str(output),
        "max_steps": 2,
        "batch_size": 4,
        "save_steps": 0,
        "eval_fraction": 0.0,
        "cpu_threads": 1,
        "progress": ProgressMode.NONE,
    }
    values.update(changes)
    return TrainerConfig(**values)


def _write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_dataset_directory_like_the_initializers_trains_on_every_part(
    tiny_model_dir: Path, tmp_path: Path
):
    rows = tiny.reverse_task_rows(12)
    dataset = tmp_path / "workspace" / "dataset"  # what an hf:// snapshot looks like
    _write_rows(dataset / "data" / "train-00000-of-00002.jsonl", rows[:7])
    _write_rows(dataset / "data" / "train-00001-of-00002.jsonl", rows[7:])
    (dataset / "README.md").write_text("---\nlicense: mit\n---\n")

    result = training.run(_config(str(tiny_model_dir), dataset, tmp_path / "out"), SilentReporter())

    assert result["data"]["train_examples"] == 12
    assert [Path(f).name for f in result["data"]["files"]] == [
        "train-00000-of-00002.jsonl",
        "train-00001-of-00002.jsonl",
    ]
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()

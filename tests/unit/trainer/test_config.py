"""TrainerConfig: the contract between the backends and the trainer program."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.jobs.model import LoraSettings, TrainingRequest, TrainingSettings
from runtimes.trainer import config as trainer_config
from runtimes.trainer.config import DatasetFormat, Precision, ProgressMode, TrainerConfig


def _request(**changes: object) -> TrainingRequest:
    values: dict[str, object] = {
        "name": "tl-drift-m1-abc123",
        "rule": "drift",
        "rule_version": "1",
        "key": "m1",
        "decision_id": "d1",
        "causing_event_ids": ("e1", "e2"),
        "runtime": "lora-cpu",
        "base_model": "smollm2-135m",
        "dataset": "file:///data/m1.jsonl",
        "lora": LoraSettings(r=8, alpha=16, dropout=0.0, target_modules=("q_proj", "k_proj")),
        "training": TrainingSettings(max_steps=20, batch_size=4, packing=True, seed=7),
    }
    values.update(changes)
    return TrainingRequest(**values)  # type: ignore[arg-type]


def test_config_from_a_training_request_carries_every_setting():
    config = TrainerConfig.from_training_request(_request(), output_dir="/out")
    assert config.base_model == "smollm2-135m"
    assert config.base_model_name == "smollm2-135m"
    assert config.dataset == "file:///data/m1.jsonl"
    assert config.job_name == "tl-drift-m1-abc123"
    assert (config.lora_r, config.lora_alpha, config.lora_dropout) == (8, 16, 0.0)
    assert config.target_modules == ("q_proj", "k_proj")
    assert (config.max_steps, config.batch_size, config.packing, config.seed) == (20, 4, True, 7)


def test_backend_can_point_the_trainer_at_mounted_model_and_data():
    config = TrainerConfig.from_training_request(
        _request(),
        output_dir="/workspace/output",
        base_model="/workspace/model",
        dataset="/workspace/dataset/m1.jsonl",
    )
    assert config.base_model == "/workspace/model"
    assert config.base_model_name == "smollm2-135m"
    assert config.dataset == "/workspace/dataset/m1.jsonl"


def test_args_reproduce_the_config_exactly():
    original = TrainerConfig.from_training_request(
        _request(), output_dir="/out", precision=Precision.FP32
    )
    assert trainer_config.load(original.to_args(), {}) == original


def test_env_reproduces_the_config_exactly():
    original = TrainerConfig.from_training_request(_request(), output_dir="/out", merge=True)
    env = original.to_env()
    assert all(name.startswith("TUNELOOP_TRAIN_") for name in env)
    assert trainer_config.load([], env) == original


def test_args_are_a_tuple_of_strings_never_a_shell_line():
    args = TrainerConfig(base_model="m", dataset="d with space.jsonl", output_dir="o").to_args()
    assert isinstance(args, tuple)
    assert all(isinstance(arg, str) for arg in args)
    assert args[args.index("--dataset") + 1] == "d with space.jsonl"


def test_arguments_override_env_which_overrides_the_file(tmp_path: Path):
    file = tmp_path / "train.yaml"
    file.write_text(
        "base_model: m\ndataset: d.jsonl\noutput_dir: o\nlora_r: 4\nseed: 1\nbatch_size: 2\n"
    )
    config = trainer_config.load(
        ["--config", str(file), "--seed", "3"],
        {"TUNELOOP_TRAIN_SEED": "2", "TUNELOOP_TRAIN_BATCH_SIZE": "5"},
    )
    assert (config.lora_r, config.batch_size, config.seed) == (4, 5, 3)


def test_config_file_may_be_json_and_named_by_env(tmp_path: Path):
    file = tmp_path / "train.json"
    file.write_text(json.dumps({"base_model": "m", "dataset": "d", "output_dir": "o"}))
    config = trainer_config.load([], {"TUNELOOP_TRAIN_CONFIG": str(file)})
    assert config.dataset_format is DatasetFormat.AUTO
    assert config.progress is ProgressMode.AUTO


def test_unknown_setting_is_named_in_the_error():
    with pytest.raises(ConfigError, match="lora_rank"):
        trainer_config.load(
            ["--base-model", "m", "--dataset", "d", "--output-dir", "o", "--lora-rank", "8"], {}
        )


def test_missing_required_setting_is_named():
    with pytest.raises(ConfigError, match="dataset"):
        trainer_config.load(["--base-model", "m", "--output-dir", "o"], {})


@pytest.mark.parametrize(
    ("argument", "value", "complaint"),
    [
        ("--batch-size", "0", "batch_size must be positive"),
        ("--eval-fraction", "1.5", "eval_fraction"),
        ("--packing", "maybe", "packing"),
        ("--precision", "fp8", "precision"),
        ("--lora-r", "2.5", "lora_r"),
    ],
    ids=["zero-batch", "fraction-above-one", "non-boolean", "unknown-precision", "fractional-rank"],
)
def test_invalid_values_are_rejected_with_the_setting_named(argument, value, complaint):
    with pytest.raises(ConfigError, match=complaint):
        trainer_config.load(
            ["--base-model", "m", "--dataset", "d", "--output-dir", "o", argument, value], {}
        )


def test_building_a_config_does_not_import_torch_or_transformers():
    probe = (
        "import sys, runtimes.trainer.config, runtimes.localprocess.backend;"
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""Evaluation after training, on the tiny model: the candidate and the champion adapter scored
on the same held-out split, real steps with torch on CPU.

The oracles: transformers' own `Trainer.evaluate` (its loss over one batch holding every
held-out row is the same mean per trained token), the same adapter scored twice (once as the
run's candidate, once loaded as the next run's champion), and the construction of the runs
(a properly trained adapter against one barely moved from the base model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from runtimes.trainer import training
from runtimes.trainer.config import ProgressMode, TrainerConfig

pytestmark = pytest.mark.training

HELD_OUT = 12
"""What eval_fraction 0.1 holds out of the 120 rows of the reverse dataset."""


class RecordingReporter:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, /, **fields: Any) -> None:
        self.events.append((event, fields))

    def fields_of(self, name: str) -> list[dict[str, Any]]:
        return [fields for event, fields in self.events if event == name]


def _config(model: Path, dataset: Path, output: Path, **changes: Any) -> TrainerConfig:
    values: dict[str, Any] = {
        "base_model": str(model),
        "dataset": str(dataset),
        "output_dir": str(output),
        "max_steps": 30,
        "learning_rate": 3e-3,
        # Every held-out row in one evaluation batch: transformers' eval loss is then the
        # mean per trained token too, an independent measure of the same number.
        "batch_size": 16,
        "save_steps": 0,
        "cpu_threads": 1,
        "progress": ProgressMode.NONE,
    }
    values.update(changes)
    return TrainerConfig(**values)


@pytest.fixture(scope="module")
def champion(tiny_model_dir: Path, reverse_dataset: Path, tmp_path_factory):
    output = tmp_path_factory.mktemp("champion")
    reporter = RecordingReporter()
    result = training.run(_config(tiny_model_dir, reverse_dataset, output), reporter)
    return output, result, reporter


@pytest.fixture(scope="module")
def challenger(tiny_model_dir: Path, reverse_dataset: Path, champion, tmp_path_factory):
    """A candidate barely moved from the base model, given the trained adapter as champion."""
    output = tmp_path_factory.mktemp("challenger")
    reporter = RecordingReporter()
    champion_dir = Path(champion[1]["adapter_dir"])
    config = _config(
        tiny_model_dir,
        reverse_dataset,
        output,
        max_steps=1,
        learning_rate=1e-9,
        champion_uri=str(champion_dir),
    )
    return output, training.run(config, reporter), reporter


def test_the_candidates_eval_loss_is_the_mean_loss_per_held_out_token(champion):
    _, result, _ = champion
    metrics = result["metrics"]
    assert result["data"]["eval_rows"] == HELD_OUT
    # transformers scored the same rows in one batch: the same mean, another implementation.
    assert metrics["eval_loss"] == pytest.approx(metrics["eval_loss_after"], rel=1e-4)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    assert 0.0 <= metrics["token_accuracy"] <= 1.0
    assert "champion_eval_loss" not in metrics, "no champion was given"


def test_the_scores_reach_result_json_and_the_evaluated_event(champion):
    output, result, reporter = champion
    written = json.loads((output / "result.json").read_text())["metrics"]
    for name in ("eval_loss", "perplexity", "token_accuracy"):
        assert written[name] == result["metrics"][name]
    (evaluated,) = reporter.fields_of("evaluated")
    assert evaluated["examples"] == HELD_OUT
    assert evaluated["candidate"]["eval_loss"] == written["eval_loss"]
    assert evaluated["champion"] is None


def test_the_champion_scores_on_the_next_run_what_it_scored_on_its_own(champion, challenger):
    _, first, _ = champion
    _, second, reporter = challenger
    assert second["metrics"]["champion_eval_loss"] == pytest.approx(
        first["metrics"]["eval_loss"], rel=1e-5
    )
    assert second["metrics"]["champion_token_accuracy"] == pytest.approx(
        first["metrics"]["token_accuracy"]
    )
    assert second["metrics"]["champion_perplexity"] == pytest.approx(
        math.exp(second["metrics"]["champion_eval_loss"])
    )
    (evaluated,) = reporter.fields_of("evaluated")
    assert evaluated["champion_uri"] == first["adapter_dir"]
    assert evaluated["champion_error"] is None


def test_a_barely_trained_candidate_scores_worse_than_the_trained_champion(challenger):
    _, result, _ = challenger
    metrics = result["metrics"]
    # One step at a learning rate of 1e-9 leaves the base model; 30 real steps do not.
    assert metrics["eval_loss"] > metrics["champion_eval_loss"]
    assert metrics["eval_loss"] == pytest.approx(metrics["eval_loss_before"], rel=1e-3)


def test_the_saved_adapter_is_the_candidates_alone(challenger):
    output, result, _ = challenger
    adapter = Path(result["adapter_dir"])
    assert not (adapter / "champion").exists(), "the champion is never saved with it"
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as tensors:
        names = list(tensors.keys())
    assert names
    assert not [name for name in names if "champion" in name]
    # The untrained candidate's B matrices stay (almost) zero: the champion's were not saved.
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as tensors:
        largest = max(
            float(tensors.get_tensor(name).abs().max()) for name in names if "lora_B" in name
        )
    assert largest < 1e-6
    assert not (output / "inputs" / "champion").exists(), "a local champion is read in place"


def test_a_champion_that_cannot_be_loaded_is_reported_and_the_run_succeeds(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path
):
    not_an_adapter = tmp_path / "empty"
    not_an_adapter.mkdir()
    reporter = RecordingReporter()
    config = _config(
        tiny_model_dir,
        reverse_dataset,
        tmp_path / "out",
        max_steps=2,
        champion_uri=str(not_an_adapter),
    )
    result = training.run(config, reporter)

    metrics = result["metrics"]
    assert "eval_loss" in metrics
    assert "champion_eval_loss" not in metrics
    assert metrics["champion_error"].startswith(f"no adapter at {not_an_adapter}")
    assert (tmp_path / "out" / "result.json").is_file()


def test_a_dataset_too_small_to_hold_one_example_out_says_so(tiny_model_dir: Path, tmp_path: Path):
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(json.dumps({"prompt": "a b c ->", "completion": " c b a"}) + "\n")
    reporter = RecordingReporter()
    result = training.run(_config(tiny_model_dir, one_row, tmp_path / "out", max_steps=1), reporter)

    assert "eval_loss" not in result["metrics"]
    (evaluated,) = reporter.fields_of("evaluated")
    assert "the dataset is too small to hold one out" in evaluated["skipped"]


def test_scoring_a_champion_changes_nothing_the_run_saves_or_merges(
    tiny_model_dir: Path, reverse_dataset: Path, champion, tmp_path: Path
):
    champion_dir = champion[1]["adapter_dir"]
    alone, compared = tmp_path / "alone", tmp_path / "compared"
    for output, given in ((alone, None), (compared, champion_dir)):
        config = _config(
            tiny_model_dir,
            reverse_dataset,
            output,
            max_steps=3,
            merge=True,
            champion_uri=given,
        )
        training.run(config, RecordingReporter())

    # The same seed trains the same adapter bit for bit; the champion scored on the way
    # must leave no trace in what is saved.
    for relative in ("adapter/adapter_model.safetensors", "merged/model.safetensors"):
        with (
            safe_open(str(alone / relative), framework="pt") as expected,
            safe_open(str(compared / relative), framework="pt") as saved,
        ):
            assert sorted(saved.keys()) == sorted(expected.keys()), relative
            for name in expected.keys():  # noqa: SIM118 -- safe_open is not a mapping
                assert (saved.get_tensor(name) == expected.get_tensor(name)).all(), name

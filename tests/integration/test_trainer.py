"""The LoRA trainer on the tiny model: real steps with torch on CPU, a few seconds each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtimes.trainer import training
from runtimes.trainer.config import ProgressMode, TrainerConfig
from runtimes.trainer.errors import MalformedDatasetError, UnknownTargetModuleError
from runtimes.trainer.progress import SilentReporter

pytestmark = pytest.mark.training


class RecordingReporter:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, /, **fields: Any) -> None:
        self.events.append((event, fields))


def _config(model: Path, dataset: Path, output: Path, **changes: Any) -> TrainerConfig:
    values: dict[str, Any] = {
        "base_model": str(model),
        "dataset": str(dataset),
        "output_dir": str(output),
        "max_steps": 30,
        "learning_rate": 3e-3,
        "batch_size": 8,
        "save_steps": 0,
        # One thread: the CI cores are shared with the broker and API server (see docs/trainer.md).
        "cpu_threads": 1,
        "progress": ProgressMode.NONE,
        "base_model_name": "tiny-llama",
    }
    values.update(changes)
    return TrainerConfig(**values)


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, reverse_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    output = tmp_path_factory.mktemp("trained")
    reporter = RecordingReporter()
    result = training.run(_config(tiny_model_dir, reverse_dataset, output), reporter)
    return output, result, reporter


def test_training_lowers_train_and_eval_loss(trained):
    _, result, _ = trained
    metrics = result["metrics"]
    assert metrics["eval_loss_after"] < metrics["eval_loss_before"]
    assert metrics["train_loss_last"] < metrics["train_loss_first"]
    assert metrics["steps"] == 30


def test_result_json_describes_the_run(trained):
    output, returned, _ = trained
    written = json.loads((output / "result.json").read_text())
    assert written["status"] == "succeeded"
    assert written["base_model"] == "tiny-llama"
    assert written["data"]["fingerprint"].startswith("sha256:")
    assert written["data"]["train_examples"] + written["data"]["eval_examples"] == 120
    assert written["peft_config"]["target_modules"] == ["q_proj", "v_proj"]
    assert written["metrics"]["tokens_seen"] > 0
    assert written["metrics"]["tokens_per_second"] > 0
    assert written["metrics"]["wall_seconds"] > 0
    assert {"torch", "transformers", "peft"} <= set(written["versions"])
    assert returned["data"] == written["data"]
    adapter = Path(written["adapter_dir"])
    assert (adapter / "adapter_model.safetensors").is_file()
    assert (adapter / "tokenizer.json").is_file()


def test_progress_events_count_up_to_the_last_step(trained):
    _, _, reporter = trained
    names = [name for name, _ in reporter.events]
    assert names[0] == "started"
    assert names[-1] == "completed"
    steps = [fields["step"] for name, fields in reporter.events if name == "progress"]
    assert steps == list(range(1, 31))
    last = next(fields for name, fields in reversed(reporter.events) if name == "progress")
    assert last["final"] is True
    assert last["tokens_per_second"] > 0


def test_saved_adapter_reloads_with_identical_logits(trained, tiny_model_dir: Path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    output, _, _ = trained
    tokenizer = AutoTokenizer.from_pretrained(output / "adapter")
    ids = tokenizer("reverse: cat dog red =>", return_tensors="pt")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        base_logits = base.eval()(**ids).logits
    first = PeftModel.from_pretrained(base, output / "adapter").eval()
    second = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), output / "adapter"
    ).eval()
    with torch.no_grad():
        assert torch.equal(first(**ids).logits, second(**ids).logits)
        assert not torch.equal(first(**ids).logits, base_logits)


def test_chat_records_train_and_merge_into_a_loadable_model(
    tiny_model_dir: Path, chat_dataset: Path, tmp_path: Path
):
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(tiny_model_dir, chat_dataset, tmp_path, max_steps=4, merge=True, packing=True)
    result = training.run(config, SilentReporter())
    assert result["data"]["packing"] is True
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert isinstance(merged.model.layers[0].self_attn.q_proj, torch.nn.Linear)


def test_unknown_target_module_lists_the_modules_the_model_has(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path
):
    config = _config(tiny_model_dir, reverse_dataset, tmp_path, target_modules=("query",))
    with pytest.raises(UnknownTargetModuleError, match="query") as caught:
        training.run(config, SilentReporter())
    assert "q_proj" in caught.value.available


def test_malformed_line_fails_before_the_model_is_loaded(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": 3}\n')
    config = _config(tmp_path / "no-model", bad, tmp_path / "out")
    with pytest.raises(MalformedDatasetError) as caught:
        training.run(config, SilentReporter())
    assert caught.value.line == 2


def test_cli_prints_a_json_failure_and_exits_2_on_bad_data(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "fine"}\n{broken\n')
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtimes.trainer",
            "--base-model",
            "tiny",
            "--dataset",
            str(bad),
            "--output-dir",
            str(tmp_path / "out"),
            "--progress",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert completed.returncode == 2
    failure = json.loads(completed.stdout.strip().splitlines()[-1])
    assert failure["event"] == "failed"
    assert failure["kind"] == "MalformedDatasetError"
    assert failure["line"] == 3
    assert json.loads((tmp_path / "out" / "failure.json").read_text())["line"] == 3


def test_cli_rejects_an_unknown_setting_with_exit_2(tmp_path: Path):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtimes.trainer",
            "--base-model",
            "tiny",
            "--dataset",
            "d",
            "--output-dir",
            str(tmp_path),
            "--lora-rank",
            "8",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "lora_rank" in completed.stdout


def test_loss_on_trained_positions_only_equals_the_transformers_loss(
    tiny_model_dir: Path, reverse_dataset: Path
):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtimes.trainer import data
    from runtimes.trainer.batching import make_collator
    from runtimes.trainer.loss import trained_positions_loss

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = data.tokenize(data.read_examples(reverse_dataset)[:6], tokenizer, max_seq_length=64)
    batch = make_collator(tokenizer.pad_token_id)(
        [{"input_ids": list(r.input_ids), "labels": list(r.labels)} for r in rows]
    )
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    ).eval()
    with torch.no_grad():
        expected = model(**batch).loss
        ours = trained_positions_loss(model, batch)
        trained = int((batch["labels"][:, 1:] != -100).sum())
        summed = trained_positions_loss(model, batch, num_items_in_batch=2 * trained)
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(summed, expected / 2)


def test_generation_from_base_and_adapter_is_text_and_reproducible(trained, tiny_model_dir):
    from runtimes.trainer.generating import generate

    output, _, _ = trained
    prompt = "reverse: cat dog red =>"
    base = generate(str(tiny_model_dir), prompt, max_new_tokens=8)
    tuned = generate(str(tiny_model_dir), prompt, adapter=output / "adapter", max_new_tokens=8)
    assert tuned == generate(
        str(tiny_model_dir), prompt, adapter=output / "adapter", max_new_tokens=8
    )
    assert isinstance(base, str)
    assert isinstance(tuned, str)

"""Packing on the tiny Llama: examples side by side in one row must not see each other, and
training builds no KV cache.

The expected loss is computed here from each example run on its own (the model's logits and a
cross-entropy written in the test), not by the packing code under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtimes.models import tiny
from runtimes.trainer import data, training
from runtimes.trainer.config import DatasetFormat, ProgressMode, TrainerConfig
from runtimes.trainer.progress import SilentReporter

pytestmark = pytest.mark.training


def _examples(tmp_path: Path) -> list[data.Example]:
    path = tmp_path / "mixed.jsonl"
    rows = [f'{{"text": "the {w} sees the red fox ."}}' for w in ("cat", "dog", "owl")]
    path.write_text("\n".join(rows) + "\n")
    texts = data.read_examples(path, DatasetFormat.TEXT)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(row) + "\n" for row in tiny.reverse_task_rows(3)))
    return texts + data.read_examples(pairs)


def _separate_mean_loss(model: Any, rows: list[data.TokenizedExample]) -> Any:
    """Token-weighted mean cross-entropy of each example run alone, as if never packed."""
    import torch

    total, count = torch.tensor(0.0), 0
    for row in rows:
        ids = torch.tensor([row.input_ids])
        logits = model(input_ids=ids).logits[0, :-1]
        targets = torch.tensor(row.labels[1:])
        # Packing masks each example's first label (its predecessor is another example); a
        # single example never predicts its first token either, so both count the same tokens.
        trained = targets != -100
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        total = total - log_probs[trained].gather(1, targets[trained][:, None]).sum()
        count += int(trained.sum())
    return total / count


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir: Path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base.config.use_cache = False
    model = get_peft_model(
        base,
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_packed_row_has_the_loss_of_its_examples_run_one_by_one(model_and_tokenizer, tmp_path):
    import torch

    from runtimes.trainer.batching import make_collator
    from runtimes.trainer.loss import trained_positions_loss

    model, tokenizer = model_and_tokenizer
    rows = data.tokenize(_examples(tmp_path), tokenizer, max_seq_length=64)
    packed = data.pack(rows, block=512)
    assert len(packed) == 1, "all six examples side by side in one row"
    batch = make_collator(tokenizer.pad_token_id)(
        [
            {
                "input_ids": list(p.input_ids),
                "labels": list(p.labels),
                "position_ids": list(p.position_ids),
            }
            for p in packed
        ]
    )
    with torch.no_grad():
        expected = _separate_mean_loss(model, rows)
        transformers_loss = model(**batch).loss
        selective_loss = trained_positions_loss(model, batch)
        # The same row as one long sequence: the examples attend to each other.
        contaminated = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    torch.testing.assert_close(transformers_loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(selective_loss, expected, rtol=1e-5, atol=1e-5)
    assert abs(float(contaminated) - float(expected)) > 1e-3, "the check can tell them apart"


def test_a_batch_of_packed_rows_of_different_lengths_is_padded_harmlessly(
    model_and_tokenizer, tmp_path
):
    import torch

    from runtimes.trainer.batching import make_collator

    model, tokenizer = model_and_tokenizer
    rows = data.tokenize(_examples(tmp_path), tokenizer, max_seq_length=64)
    longest = max(len(r.input_ids) for r in rows)
    packed = data.pack(rows, block=2 * longest)
    assert len({len(p.input_ids) for p in packed}) > 1, "rows of different lengths"
    batch = make_collator(tokenizer.pad_token_id)(
        [
            {
                "input_ids": list(p.input_ids),
                "labels": list(p.labels),
                "position_ids": list(p.position_ids),
            }
            for p in packed
        ]
    )
    with torch.no_grad():
        torch.testing.assert_close(
            model(**batch).loss, _separate_mean_loss(model, rows), rtol=1e-5, atol=1e-5
        )


def test_training_builds_no_kv_cache_and_the_merged_model_keeps_its_own(
    tiny_model_dir: Path, reverse_dataset: Path, tmp_path: Path, monkeypatch
):
    from transformers import cache_utils

    built = []
    original = cache_utils.DynamicCache.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(cache_utils.DynamicCache, "__init__", counting)
    config = TrainerConfig(
        base_model=str(tiny_model_dir),
        dataset=str(reverse_dataset),
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        batch_size=4,
        save_steps=0,
        packing=True,
        max_seq_length=64,
        merge=True,
        cpu_threads=1,
        progress=ProgressMode.NONE,
    )
    result = training.run(config, SilentReporter())
    assert result["metrics"]["steps"] == 2
    assert built == [], "a KV cache was built during training or evaluation"
    merged = json.loads((tmp_path / "out" / "merged" / "config.json").read_text())
    assert merged["use_cache"] is True, "the merged model still generates with a cache"

"""Trainer throughput: tuneloop's trainer against plain HF `Trainer` + peft (issue 6).

Both sides fine-tune the same model with the same LoRA settings (r 16, alpha 32, q/v), on
the same data (the demo's unit-conversion set, or the tiny model's reverse task), for the
same number of optimiser steps at the same learning rate, each in its own fresh process,
taking turns (padded baseline, packed baseline, ours packed, ours unpacked) so that other
load on the machine hits all alike. The measure is trained-on input tokens (non-padding) per
second of `trainer.train()`; process start, imports and model loading are outside it on
every side.

The baselines are what one writes from the peft/transformers docs for the loss we optimise:
completion-only labels (the prompt's tokens, and the BOS the tokenizer adds, labelled -100;
the completion and an EOS trained), built here from the tokenizer, independently of
`runtimes/trainer/data.py`, and the stock HF loss. The padded baseline pads each batch with
`DataCollatorForSeq2Seq`; the packed baseline concatenates each batch into one row with
`DataCollatorWithFlattening` (padding-free: position ids restart per example, so attention
stays within it), with as many examples per batch as fill our packed batch's tokens (8 blocks
of `max_seq_length`). Ours is `python -m runtimes.trainer` as the backends run it: its `packed`
rows (whole examples side by side in rows of up to `max_seq_length`, positions restarting at
0 for each example, so attention stays within it as with flattening) are compared with the
packed baseline, its `unpacked` rows (8 examples, padded) with the padded one (8 examples), so
each ratio shows what our code adds or costs for the same kind of batch.

Goal: >= 1.0x on CPU (>= 1.5x on a GPU). Quick mode runs the tiny model only. The figures of
the last run are in docs/performance.md.

    python -m bench.trainer [--quick]        # prints the rows
    python -m bench.trainer baseline CONFIG  # (internal) one baseline run
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO_DATA = ROOT / "docs" / "examples" / "datasets" / "unit-conversions.jsonl"
GOAL = 1.0
ROWS_PER_BATCH = 8
"""Rows per optimiser step on both sides: examples (padded) or blocks of max_seq_length."""
IGNORED = -100
"""The label the causal-LM loss ignores (PyTorch's cross-entropy `ignore_index`)."""
CPU_THREADS = int(os.environ.get("TUNELOOP_BENCH_CPU_THREADS", "1"))
"""torch threads per process on CPU, the same on both sides. 1 by default: on cores shared
with other busy processes, OpenMP threads wait on each other and a step takes many times
longer, which would measure the machine's load rather than the code."""


def completion_only_features(
    rows: list[dict[str, str]], tokenizer: Any, *, max_seq_length: int
) -> list[dict[str, list[int]]]:
    """Input ids and labels with the loss on the completion and the EOS only.

    Written from the tokenizer alone, as a user of HF `Trainer` would: the prompt tokenized
    as the tokenizer does by default (with its BOS, if it adds one), the completion without
    special tokens, then the EOS; every prompt position labelled -100, which the loss
    ignores. Rows left with no trained token after truncation are dropped: their loss would
    be undefined.
    """
    features = []
    for row in rows:
        prompt = list(tokenizer(row["prompt"])["input_ids"])
        completion = list(tokenizer(row["completion"], add_special_tokens=False)["input_ids"])
        completion.append(tokenizer.eos_token_id)
        ids = (prompt + completion)[:max_seq_length]
        labels = ([IGNORED] * len(prompt) + completion)[:max_seq_length]
        if any(label != IGNORED for label in labels):
            features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
    return features


def flattened_batch_size(features: list[dict[str, list[int]]], *, max_seq_length: int) -> int:
    """Examples per flattened batch so that a step trains on as many tokens as one of ours.

    Our packed step is ROWS_PER_BATCH full blocks of *max_seq_length* tokens; a flattened
    batch of ROWS_PER_BATCH short examples would be a fraction of that, and a tiny model's
    per-step overhead would then decide the ratio rather than the packing.
    """
    mean_length = sum(len(f["input_ids"]) for f in features) / len(features)
    return max(1, round(ROWS_PER_BATCH * max_seq_length / mean_length))


def _baseline(config: dict[str, Any]) -> dict[str, Any]:
    """Plain HF Trainer + peft, as the docs show it: padded, or packed by flattening."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        DataCollatorWithFlattening,
        Trainer,
        TrainingArguments,
    )

    torch.manual_seed(0)
    if not torch.cuda.is_available():
        torch.set_num_threads(config["cpu_threads"])
    tokenizer = AutoTokenizer.from_pretrained(config["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = [json.loads(line) for line in Path(config["data"]).read_text().splitlines() if line]
    features = completion_only_features(rows, tokenizer, max_seq_length=config["max_seq_length"])
    packed = bool(config["packed"])
    batch = ROWS_PER_BATCH
    if packed:
        batch = flattened_batch_size(features, max_seq_length=config["max_seq_length"])
        # One row per batch and no attention mask: the model reads the example boundaries
        # from the position ids. With no padding, every token is a trained-on input token.
        collator: Any = DataCollatorWithFlattening()  # type: ignore[no-untyped-call]
        features = [{k: v for k, v in f.items() if k != "attention_mask"} for f in features]
    else:
        collator = DataCollatorForSeq2Seq(tokenizer, padding=True)
    model = get_peft_model(
        # No KV cache: training never reads it, and while the model builds one it ignores the
        # position ids that tell flattened examples apart, so they would attend to each other.
        AutoModelForCausalLM.from_pretrained(config["model"], dtype=torch.float32, use_cache=False),
        LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.05,
            target_modules=["q_proj", "v_proj"],
            task_type="CAUSAL_LM",
        ),
    )
    arguments = TrainingArguments(
        output_dir=config["output"],
        per_device_train_batch_size=batch,
        max_steps=config["steps"],
        learning_rate=config["learning_rate"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        include_num_input_tokens_seen="all" if packed else "non_padding",
        seed=0,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=features, data_collator=collator)
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    tokens = int(trainer.state.num_input_tokens_seen)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds}


def _run_ours(config: dict[str, Any], *, packing: bool) -> float:
    output = Path(config["output"]) / f"ours-{time.monotonic_ns()}"
    command = [
        sys.executable,
        "-m",
        "runtimes.trainer",
        "--base-model",
        config["model"],
        "--dataset",
        config["data"],
        "--output-dir",
        str(output),
        "--max-steps",
        str(config["steps"]),
        "--batch-size",
        str(ROWS_PER_BATCH),
        "--learning-rate",
        str(config["learning_rate"]),
        "--max-seq-length",
        str(config["max_seq_length"]),
        "--packing",
        "true" if packing else "false",
        "--eval-fraction",
        "0",
        "--save-steps",
        "0",
        "--progress",
        "none",
        "--cpu-threads",
        str(config["cpu_threads"]),
    ]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
    result = json.loads((output / "result.json").read_text())
    return float(result["metrics"]["tokens_per_second"])


def _run_baseline(config: dict[str, Any], *, packed: bool) -> float:
    arguments = json.dumps({**config, "packed": packed})
    command = [sys.executable, "-m", "bench.trainer", "baseline", arguments]
    completed = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    return float(json.loads(completed.stdout.strip().splitlines()[-1])["tokens_per_second"])


def _compare(name: str, config: dict[str, Any], *, rounds: int) -> list[dict[str, object]]:
    padded_baseline: list[float] = []
    packed_baseline: list[float] = []
    packed: list[float] = []
    unpacked: list[float] = []
    for _ in range(rounds):
        padded_baseline.append(_run_baseline(config, packed=False))
        packed_baseline.append(_run_baseline(config, packed=True))
        packed.append(_run_ours(config, packing=True))
        unpacked.append(_run_ours(config, packing=False))
    notes = (
        f"{config['steps']} steps x batch {ROWS_PER_BATCH}, "
        f"max_seq_length {config['max_seq_length']}, "
        f"{config['cpu_threads']} CPU thread(s), median of {rounds} alternating runs; "
        "baseline = HF Trainer + peft, completion-only labels, "
    )
    rows: list[dict[str, object]] = []
    for label, values, baseline, how in (
        (
            "packed",
            packed,
            packed_baseline,
            "flattened by DataCollatorWithFlattening to as many tokens per step",
        ),
        ("unpacked", unpacked, padded_baseline, "padded by DataCollatorForSeq2Seq"),
    ):
        value, base = statistics.median(values), statistics.median(baseline)
        rows.append(
            {
                "benchmark": f"trainer/{name}/{label}",
                "measure": "trained-on tokens/s of trainer.train()",
                "value": value,
                "unit": "tokens/s",
                "baseline": base,
                "ratio": value / base,
                "goal": f">= {GOAL}x",
                "notes": notes + how,
            }
        )
    return rows


def run(*, quick: bool) -> list[dict[str, object]]:
    from runtimes.models import catalog, tiny

    with tempfile.TemporaryDirectory(prefix="tuneloop-bench-trainer-") as scratch:
        data = Path(scratch) / "reverse.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in tiny.reverse_task_rows(400)))
        rows = _compare(
            "tiny",
            {
                "model": str(catalog.tiny_model_dir()),
                "data": str(data),
                "output": scratch,
                "steps": 40,
                "learning_rate": 3e-3,
                "max_seq_length": 64,
                "cpu_threads": CPU_THREADS,
            },
            rounds=3 if quick else 5,
        )
        if not quick:
            rows += _compare(
                "smollm2-135m",
                {
                    "model": str(catalog.smollm2_dir()),
                    "data": str(DEMO_DATA),
                    "output": scratch,
                    "steps": 6,
                    "learning_rate": 1e-3,
                    "max_seq_length": 128,
                    "cpu_threads": CPU_THREADS,
                },
                rounds=2,
            )
    return rows


def main(argv: list[str]) -> int:
    if argv[:1] == ["baseline"]:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        print(json.dumps(_baseline(json.loads(argv[1]))))
        return 0
    for row in run(quick="--quick" in argv):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Trainer throughput: tuneloop's trainer against plain HF `Trainer` + peft (issue 6).

Both sides fine-tune the same model with the same LoRA settings (r 16, alpha 32, q/v), on the
same data (the demo's unit-conversion set, or the tiny model's reverse task), with the same
batch size (8 rows), the same number of optimiser steps and the same learning rate, each in
its own fresh process, taking turns (baseline, ours, baseline, ours) so that other load on the
machine hits both alike. The measure is trained-on input tokens (non-padding) per second of
`trainer.train()`; process start, imports and model loading are outside it on both sides.

The baseline is what one writes from the peft/transformers docs: prompt+completion tokenized
as one text, labels = input ids, padded per batch by `DataCollatorForSeq2Seq`. Ours is
`python -m runtimes.trainer` as the backends run it: completion-only loss, and packing on
(full blocks, no padding) in the `packed` rows, off in the `unpacked` rows (there the ratio
shows our overhead, which should be none).

Goal: >= 1.0x on CPU (>= 1.5x on a GPU). Quick mode runs the tiny model only.

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
CPU_THREADS = int(os.environ.get("TUNELOOP_BENCH_CPU_THREADS", "1"))
"""torch threads per process on CPU, the same on both sides. 1 by default: on cores shared
with other busy processes, OpenMP threads wait on each other and a step takes ~14x longer
(docs/trainer.md), which would measure the machine's load rather than the code."""


def _baseline(config: dict[str, Any]) -> dict[str, Any]:
    """Plain HF Trainer + peft, as the docs show it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
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
    features = []
    for row in rows:
        text = row["prompt"] + row["completion"] + (tokenizer.eos_token or "")
        ids = tokenizer(text, truncation=True, max_length=config["max_seq_length"])["input_ids"]
        features.append({"input_ids": ids, "labels": list(ids), "attention_mask": [1] * len(ids)})
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(config["model"], dtype=torch.float32),
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
        per_device_train_batch_size=8,
        max_steps=config["steps"],
        learning_rate=config["learning_rate"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        include_num_input_tokens_seen="non_padding",
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=features,
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True),
    )
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
        "8",
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


def _run_baseline(config: dict[str, Any]) -> float:
    command = [sys.executable, "-m", "bench.trainer", "baseline", json.dumps(config)]
    completed = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    return float(json.loads(completed.stdout.strip().splitlines()[-1])["tokens_per_second"])


def _compare(name: str, config: dict[str, Any], *, rounds: int) -> list[dict[str, object]]:
    baseline: list[float] = []
    packed: list[float] = []
    unpacked: list[float] = []
    for _ in range(rounds):
        baseline.append(_run_baseline(config))
        packed.append(_run_ours(config, packing=True))
        unpacked.append(_run_ours(config, packing=False))
    base = statistics.median(baseline)
    notes = (
        f"{config['steps']} steps x batch 8, max_seq_length {config['max_seq_length']}, "
        f"{config['cpu_threads']} CPU thread(s), median of {rounds} alternating runs; "
        "baseline = HF Trainer + peft, padded batches"
    )
    rows: list[dict[str, object]] = []
    for label, values in (("packed", packed), ("unpacked", unpacked)):
        value = statistics.median(values)
        rows.append(
            {
                "benchmark": f"trainer/{name}/{label}",
                "measure": "trained-on tokens/s of trainer.train()",
                "value": value,
                "unit": "tokens/s",
                "baseline": base,
                "ratio": value / base,
                "goal": f">= {GOAL}x",
                "notes": notes,
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

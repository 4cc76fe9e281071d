"""One LoRA fine-tuning run: data -> model + adapter -> HF `Trainer` -> adapter, result.json.

`runtimes/trainer/__main__.py` calls `run(config, reporter)`; tests call it in-process. We use
transformers' `Trainer` rather than a loop of our own because it already gives what this
program promises: exact resume (optimiser, scheduler and RNG state in each checkpoint,
bitwise-equal adapters), DDP under torchrun with Kubeflow's `PET_*` variables, mixed
precision, and token counting. What it costs in speed is in the trainer rows of
docs/performance.md, which compare this program with plain `Trainer` + peft.
What we add around it: the three record shapes with masked loss, packing, per-architecture
target modules, eval loss before/after, the candidate and the champion adapter scored alike
on the held-out split (`evaluation.py`), progress events, typed errors, atomic outputs written
by rank 0 only.

Output layout under `output_dir`:
    adapter/          adapter_model.safetensors, adapter_config.json, tokenizer files
    merged/           the base model with the adapter merged in (only with `merge=true`)
    checkpoints/      checkpoint-<step>/ every `save_steps` (the last `save_total_limit`)
    inputs/model/     a base model copied from an `s3://` prefix (never published)
    inputs/champion/  the champion adapter copied from object storage (never published)
    metrics.json      the run's metrics
    data_card.json    what the adapter was trained on (parts, fingerprint, counts)
    result.json       written last: its presence means success

With `output_uri`, rank 0 then publishes all but checkpoints/ and inputs/ to
`<output_uri>/<job_name>/`, manifest last (`runtimes/trainer/publishing.py`); `result.json`
names that location as `adapter_uri`, and stays only if the publish succeeded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtimes import storage
from runtimes.trainer import base_models, data, evaluation, publishing
from runtimes.trainer.config import RESUME_AUTO, RESUME_NEVER, Precision, TrainerConfig
from runtimes.trainer.errors import (
    InvalidTrainerConfigError,
    ModelNotFoundError,
    TrainingOutOfMemoryError,
    UnknownTargetModuleError,
)
from runtimes.trainer.progress import Reporter

DEFAULT_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    # Attention query/value projections: the LoRA paper's choice and the cheapest that works
    # (all-linear costs more per step, for little gain on small data: measured once while
    # designing the trainer, not by `make bench`).
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "phi3": ("qkv_proj",),
    "phi": ("q_proj", "v_proj"),
    "opt": ("q_proj", "v_proj"),
    "gpt2": ("c_attn",),
    "gpt_neox": ("query_key_value",),
    "falcon": ("query_key_value",),
    "bloom": ("query_key_value",),
    "gptj": ("q_proj", "v_proj"),
}
ALL_LINEAR = "all-linear"
FAULT_CRASH_AT_STEP = "TUNELOOP_FAULT_CRASH_AT_STEP"
"""Test hook: the process dies (`os._exit(17)`) at this optimiser step, like a killed pod."""


def default_target_modules(model_type: str) -> tuple[str, ...]:
    return DEFAULT_TARGET_MODULES.get(model_type, ("q_proj", "v_proj"))


def check_target_modules(model: Any, requested: Sequence[str]) -> None:
    """Raise UnknownTargetModuleError when a name matches no linear module of *model*."""
    import torch

    linear_names = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and "lm_head" not in name
        }
    )
    unknown = [name for name in requested if name != ALL_LINEAR and name not in linear_names]
    if unknown:
        raise UnknownTargetModuleError(unknown, linear_names)


def latest_checkpoint(checkpoints: Path) -> Path | None:
    candidates = []
    for child in checkpoints.glob("checkpoint-*"):
        suffix = child.name.removeprefix("checkpoint-")
        if child.is_dir() and suffix.isdigit() and (child / "trainer_state.json").exists():
            candidates.append((int(suffix), child))
    return max(candidates)[1] if candidates else None


def _resume_point(config: TrainerConfig, checkpoints: Path) -> Path | None:
    if config.resume == RESUME_NEVER:
        return None
    if config.resume == RESUME_AUTO:
        return latest_checkpoint(checkpoints)
    path = Path(config.resume)
    if not (path / "trainer_state.json").exists():
        raise InvalidTrainerConfigError(f"resume={config.resume}: not a checkpoint directory")
    return path


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("torch", "transformers", "peft", "accelerate", "tokenizers"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "absent"
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run(config: TrainerConfig, reporter: Reporter) -> dict[str, Any]:
    """Fine-tune, save, and return the result (also written to `result.json` by rank 0).

    Raises:
        TrainerInputError: the dataset, model or a setting is wrong (never retry as is).
        TrainingOutOfMemoryError: the device ran out of memory (advice in the message).
    """
    wall_started = time.monotonic()
    settings = storage.StorageSettings.from_env()
    # Read and validate the data before the expensive imports: a bad line fails at once.
    dataset = data.read_dataset(config.dataset, config.dataset_format, settings=settings)
    datasets = [dataset]
    if config.eval_dataset:
        held_out = data.read_dataset(config.eval_dataset, config.dataset_format, settings=settings)
        datasets.append(held_out)
        train_records, eval_records = dataset.examples, held_out.examples
    else:
        train_records, eval_records = data.split(
            dataset.examples, fraction=config.eval_fraction, seed=config.seed
        )
    # Likewise the model: a name that cannot be loaded here fails before torch is imported.
    model_path = base_models.locate(
        config.base_model,
        os.environ,
        fetch_into=Path(config.output_dir) / "inputs" / "model",
        settings=settings,
    )
    try:
        return _run(
            config,
            reporter,
            model_path=model_path,
            train_records=train_records,
            eval_records=eval_records,
            datasets=datasets,
            wall_started=wall_started,
            settings=settings,
        )
    except RuntimeError as exc:
        if _is_out_of_memory(exc):
            device = "cuda" if "CUDA" in str(exc) else "cpu"
            raise TrainingOutOfMemoryError(
                device, batch_size=config.batch_size, max_seq_length=config.max_seq_length
            ) from exc
        raise


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return (
        type(exc).__name__ == "OutOfMemoryError"
        or "out of memory" in text
        or "can't allocate memory" in text
    )


def _run(  # noqa: PLR0915 -- one straight-line story of a run reads better split less
    config: TrainerConfig,
    reporter: Reporter,
    *,
    model_path: str,
    train_records: list[data.Example],
    eval_records: list[data.Example],
    datasets: list[data.Dataset],
    wall_started: float,
    settings: storage.StorageSettings,
) -> dict[str, Any]:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.set_seed(config.seed)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    is_main = rank == 0

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(config.base_model, str(exc).splitlines()[0]) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token

    train_set = data.tokenize(train_records, tokenizer, max_seq_length=config.max_seq_length)
    eval_set = data.tokenize(eval_records, tokenizer, max_seq_length=config.max_seq_length)
    if config.packing:
        _check_packing_is_separated()
        train_set = data.pack(train_set, block=config.max_seq_length)
        eval_set = data.pack(eval_set, block=config.max_seq_length)
    if not train_set:
        raise InvalidTrainerConfigError(
            "no training example has a trained token within max_seq_length"
        )

    use_cuda = torch.cuda.is_available()
    if config.cpu_threads is not None and not use_cuda:
        torch.set_num_threads(config.cpu_threads)
    bf16 = config.precision is Precision.BF16 or (
        config.precision is Precision.AUTO and use_cuda and torch.cuda.is_bf16_supported()
    )
    fp16 = config.precision is Precision.FP16 or (
        config.precision is Precision.AUTO and use_cuda and not bf16
    )
    if (bf16 or fp16) and not use_cuda:
        raise InvalidTrainerConfigError(
            f"precision={config.precision.value} needs a GPU; use fp32 or auto on CPU"
        )

    try:
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(config.base_model, str(exc).splitlines()[0]) from exc
    # A KV cache serves generation only; built on every training step it costs time for
    # nothing, and it stops transformers from separating packed examples (it reads their
    # position ids only without a cache). transformers 5's Trainer turns it off as well
    # (TrainingArguments.use_cache), 4.x, which we also allow, does not. Restored before a
    # merged model is saved, so that the merged model generates with a cache.
    use_cache = getattr(base.config, "use_cache", None)
    base.config.use_cache = False
    targets = config.target_modules or default_target_modules(base.config.model_type)
    check_target_modules(base, targets)
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=ALL_LINEAR if ALL_LINEAR in targets else list(targets),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total_parameters = sum(p.numel() for p in model.parameters())

    output_dir = Path(config.output_dir)
    checkpoints = output_dir / "checkpoints"
    output_dir.mkdir(parents=True, exist_ok=True)
    resume_from = _resume_point(config, checkpoints)

    trainer, progress = _make_trainer(
        config,
        model=model,
        tokenizer=tokenizer,
        train_set=train_set,
        eval_set=eval_set,
        checkpoints=checkpoints,
        use_cuda=use_cuda,
        bf16=bf16,
        fp16=fp16,
        reporter=reporter,
        selective_loss=_selective_loss_applies(base.config.model_type),
    )
    total_steps = _planned_steps(config, len(train_set), trainer)

    reporter.emit(
        "started",
        job=config.job_name,
        base_model=config.base_model_name or config.base_model,
        train_examples=len(train_set),
        eval_examples=len(eval_set),
        total_steps=total_steps,
        trainable_parameters=trainable,
        world_size=world_size,
        resumed_from=str(resume_from) if resume_from else None,
    )
    eval_before = trainer.evaluate()["eval_loss"] if eval_set else None
    if eval_before is not None:
        reporter.emit("eval", stage="before", loss=eval_before)

    train_started = time.monotonic()
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    train_seconds = time.monotonic() - train_started

    eval_after = trainer.evaluate()["eval_loss"] if eval_set else None
    if eval_after is not None:
        reporter.emit("eval", stage="after", loss=eval_after)

    losses = [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    tokens_seen = int(trainer.state.num_input_tokens_seen)
    session_tokens = tokens_seen - progress.tokens_at_start
    adapter_dir = output_dir / "adapter"
    merged_dir = output_dir / "merged"
    result: dict[str, Any] = {
        "status": "succeeded",
        "job_name": config.job_name,
        "base_model": config.base_model_name or config.base_model,
        "base_model_path": model_path,
        "model_type": base.config.model_type,
        "adapter_dir": str(adapter_dir.resolve()),
        "merged_dir": str(merged_dir.resolve()) if config.merge else None,
        "data": {
            "fingerprint": _fingerprint(datasets),
            "files": [part for dataset in datasets for part in dataset.parts],
            "train_examples": len(train_records),
            "eval_examples": len(eval_records),
            "train_rows": len(train_set),
            "eval_rows": len(eval_set),
            "packing": config.packing,
        },
        "metrics": {
            "train_loss_first": _mean(losses[:5]),
            "train_loss_last": _mean(losses[-5:]),
            "eval_loss_before": eval_before,
            "eval_loss_after": eval_after,
            "steps": trainer.state.global_step,
            "epochs": trainer.state.epoch,
            "tokens_seen": tokens_seen,
            "tokens_per_second": session_tokens / train_seconds if train_seconds else None,
            "train_seconds": train_seconds,
            "wall_seconds": time.monotonic() - wall_started,
            "trainable_parameters": trainable,
            "total_parameters": total_parameters,
            "resumed_from": str(resume_from) if resume_from else None,
        },
        "peft_config": {
            "r": config.lora_r,
            "lora_alpha": config.lora_alpha,
            "lora_dropout": config.lora_dropout,
            "target_modules": list(targets),
        },
        "training": {
            "learning_rate": config.learning_rate,
            "batch_size": config.batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "max_seq_length": config.max_seq_length,
            "seed": config.seed,
            "precision": "bf16" if bf16 else "fp16" if fp16 else "fp32",
            "loss": (
                "lm-head-on-trained-positions"
                if _selective_loss_applies(base.config.model_type)
                else "transformers"
            ),
            "world_size": world_size,
            "device": "cuda" if use_cuda else "cpu",
        },
        "versions": _versions(),
    }
    try:
        if is_main:
            # Before the adapter is saved (and merged, which changes the base weights): the
            # champion is scored as a second adapter on the same base model.
            result["metrics"].update(
                evaluation.evaluate(
                    trainer.accelerator.unwrap_model(model),
                    eval_set,
                    batch_size=config.batch_size,
                    pad_id=tokenizer.pad_token_id,
                    champion_uri=config.champion_uri,
                    settings=settings,
                    fetch_into=output_dir / "inputs" / "champion",
                    reporter=reporter,
                )
            )
            base.config.use_cache = use_cache
            _save_outputs(
                trainer, model, tokenizer, adapter_dir, merged_dir if config.merge else None
            )
            result["metrics"]["wall_seconds"] = time.monotonic() - wall_started
            _write_and_publish(config, result, reporter, output_dir=output_dir, settings=settings)
    finally:
        # Every rank waits for rank 0's outputs, also when writing or publishing them failed:
        # the other ranks then end, and rank 0's exit code fails the job.
        if world_size > 1:
            torch.distributed.barrier()
    return result


def _write_and_publish(
    config: TrainerConfig,
    result: dict[str, Any],
    reporter: Reporter,
    *,
    output_dir: Path,
    settings: storage.StorageSettings,
) -> None:
    """Rank 0's last steps: the outputs, the publish (with `output_uri`), then `completed`."""
    publishing.write_outputs(output_dir, result)
    if config.output_uri is not None:
        published = publishing.publish(
            output_dir,
            config.output_uri,
            job=str(config.job_name),
            settings=settings,
            reporter=reporter,
            result=result,
        )
        result["adapter_uri"] = published.uri
    reporter.emit(
        "completed",
        result=str(output_dir / "result.json"),
        **_summary(result),
        metrics=result["metrics"],
    )


def _fingerprint(datasets: Sequence[data.Dataset]) -> str:
    if len(datasets) == 1:
        return datasets[0].fingerprint
    # Training and held-out data together: what exactly this run saw.
    combined = "\n".join(dataset.fingerprint for dataset in datasets)
    return f"sha256:{hashlib.sha256(combined.encode()).hexdigest()}"


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    metrics = result["metrics"]
    published = {"adapter_uri": result["adapter_uri"]} if "adapter_uri" in result else {}
    return {
        **published,
        "adapter_dir": result["adapter_dir"],
        "eval_loss_before": metrics["eval_loss_before"],
        "eval_loss_after": metrics["eval_loss_after"],
        "tokens_per_second": metrics["tokens_per_second"],
    }


def _save_outputs(
    trainer: Any, model: Any, tokenizer: Any, adapter_dir: Path, merged_dir: Path | None
) -> None:
    # Write next to the target and rename, so a reader never sees half an adapter.
    staging = adapter_dir.with_name(".adapter.partial")
    shutil.rmtree(staging, ignore_errors=True)
    unwrapped = trainer.accelerator.unwrap_model(model)
    unwrapped.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(adapter_dir, ignore_errors=True)
    staging.rename(adapter_dir)
    if merged_dir is not None:
        staging = merged_dir.with_name(".merged.partial")
        shutil.rmtree(staging, ignore_errors=True)
        merged = unwrapped.merge_and_unload()
        merged.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(merged_dir, ignore_errors=True)
        staging.rename(merged_dir)


def _make_trainer(
    config: TrainerConfig,
    *,
    model: Any,
    tokenizer: Any,
    train_set: list[data.TokenizedExample],
    eval_set: list[data.TokenizedExample],
    checkpoints: Path,
    use_cuda: bool,
    bf16: bool,
    fp16: bool,
    reporter: Reporter,
    selective_loss: bool,
) -> tuple[Any, Any]:
    import transformers.integrations
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from runtimes.trainer.batching import make_collator, to_dataset
    from runtimes.trainer.callbacks import ProgressEvents

    arguments = TrainingArguments(
        output_dir=str(checkpoints),
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps if config.max_steps is not None else -1,
        lr_scheduler_type="linear",
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        gradient_checkpointing=config.gradient_checkpointing,
        logging_steps=config.logging_steps,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        save_total_limit=config.save_total_limit or None,
        eval_strategy="no",
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=not use_cuda,
        bf16=bf16,
        fp16=fp16,
        # Only name a backend under torchrun: accelerate then expects a process group.
        ddp_backend="gloo" if not use_cuda and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        ddp_find_unused_parameters=False,
        report_to=[],
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        include_num_input_tokens_seen="non_padding",
        label_names=["labels"],
    )
    progress = ProgressEvents(reporter, crash_at_step=_crash_step())
    trainer_class: Any = Trainer
    if selective_loss:
        from runtimes.trainer.loss import TrainedTokensLossTrainer

        trainer_class = TrainedTokensLossTrainer
    trainer = trainer_class(
        model=model,
        args=arguments,
        train_dataset=to_dataset(train_set),
        eval_dataset=to_dataset(eval_set) if eval_set else None,
        data_collator=make_collator(tokenizer.pad_token_id),
        callbacks=[progress],
    )
    # Their printing would interleave with our JSON lines on stdout.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    # transformers (>= 4.57) adds its own Kubeflow status callback whenever
    # KUBEFLOW_TRAINER_SERVER_URL is set, whatever report_to says. Ours reports instead
    # (runtimes/trainer/kubeflow_status.py): 100 % only once the adapter is written, with the
    # final eval loss; theirs would report 100 % before that and race ours.
    kubeflow_callback = getattr(transformers.integrations, "KubeflowCallback", None)
    if kubeflow_callback is not None:
        trainer.remove_callback(kubeflow_callback)
    return trainer, progress


def _check_packing_is_separated() -> None:
    """Refuse packing where transformers would let packed examples attend to each other."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError as exc:
        raise InvalidTrainerConfigError(
            "packing=true needs a transformers release that separates packed examples by "
            "their position ids (transformers.masking_utils.find_packed_sequence_indices); "
            "upgrade transformers or set packing=false"
        ) from exc


def _selective_loss_applies(model_type: str) -> bool:
    from runtimes.trainer.loss import SELECTIVE_LOSS_MODEL_TYPES

    single_process = int(os.environ.get("WORLD_SIZE", "1")) == 1
    return single_process and model_type in SELECTIVE_LOSS_MODEL_TYPES


def _planned_steps(config: TrainerConfig, rows: int, trainer: Any) -> int:
    if config.max_steps is not None:
        return config.max_steps
    per_step = config.batch_size * config.gradient_accumulation_steps * int(trainer.args.world_size)
    per_epoch = max(1, -(-rows // per_step))
    return max(1, round(per_epoch * config.epochs))


def _crash_step() -> int | None:
    raw = os.environ.get(FAULT_CRASH_AT_STEP)
    return int(raw) if raw else None

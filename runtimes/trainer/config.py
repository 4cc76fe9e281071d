"""The trainer's configuration as a value, and the one way to build a trainer invocation.

Both backends start the same program (`python -m runtimes.trainer`): the local-process backend
as a subprocess, the Kubernetes backend through a TrainJob's `trainer.args`/`env`. They both
call `TrainerConfig.from_training_request(...)` and then `to_args()` or `to_env()`, so an
invocation is always data (a tuple of arguments, a mapping of variables), never a shell string.
The trainer itself calls `load(argv, environ)`.

Precedence, lowest first: field defaults < the config file (`--config PATH` or
`TUNELOOP_TRAIN_CONFIG`, JSON or YAML) < `TUNELOOP_TRAIN_<FIELD>` variables < `--<field>`
arguments. The contract is written down in docs/trainer.md.

This module is deliberately free of torch and transformers (importing them costs seconds):
the orchestrator side builds configs without paying for them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError
from orchestrator.jobs.model import TrainingRequest

ENV_PREFIX = "TUNELOOP_TRAIN_"
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"


class DatasetFormat(enum.Enum):
    """Shape of each JSON Lines record in the dataset."""

    AUTO = "auto"
    """Decide from the first record's keys."""
    PROMPT_COMPLETION = "prompt_completion"
    """`{"prompt": ..., "completion": ...}`; loss on the completion only."""
    TEXT = "text"
    """`{"text": ...}`; loss on every token."""
    MESSAGES = "messages"
    """`{"messages": [{"role", "content"}, ...]}`; loss on assistant turns only."""


class Precision(enum.Enum):
    """Floating-point format of the forward/backward pass."""

    AUTO = "auto"
    """bf16 on a GPU that supports it, else fp16 on a GPU, fp32 on CPU."""
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class ProgressMode(enum.Enum):
    """How the trainer reports progress."""

    AUTO = "auto"
    """A bar when stderr is a terminal, JSON lines on stdout otherwise."""
    BAR = "bar"
    JSON = "json"
    NONE = "none"


RESUME_AUTO = "auto"
RESUME_NEVER = "never"


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """Everything one fine-tuning run needs; every field has a safe default but the first three."""

    base_model: str
    """Local model directory, an `s3://` prefix (copied into `output_dir/inputs/model` first),
    an offline catalogue name (`tiny`, `smollm2-135m`), or a hub id (only when a hub is
    reachable)."""
    dataset: str
    """JSON Lines or Parquet file of training records, or a directory or prefix of parts
    (a path, `file://` or `s3://`; read through `runtimes.storage`)."""
    output_dir: str
    """The job's local working directory: the adapter, checkpoints, `result.json` and any
    input copied from object storage (`inputs/`) are written here first."""
    output_uri: str | None = None
    """Where rank 0 publishes the outputs once training succeeded: `<output_uri>/<job_name>/`
    (`s3://bucket/adapters`, `file:///srv/adapters`), with a manifest written last
    (docs/storage.md). None: the outputs stay in `output_dir`."""
    eval_dataset: str | None = None
    """Held-out JSON Lines file or directory; when unset, `eval_fraction` of the dataset is
    held out."""
    eval_fraction: float = 0.1
    """Share of the dataset held out for evaluation (0 disables evaluation); at least one
    example is held out when the dataset has two or more. The split depends only on the
    dataset and `seed`, so two runs with both the same evaluate on the same examples."""
    champion_uri: str | None = None
    """The current champion adapter (a directory, or a published `<output_uri>/<job>/`
    folder, local or `s3://`): scored after training on the same held-out split as the new
    adapter, as `champion_eval_loss`, ... (`runtimes/trainer/evaluation.py`). The orchestrator
    sets it for a rule with `promote:` once a champion exists."""
    dataset_format: DatasetFormat = DatasetFormat.AUTO
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: tuple[str, ...] | None = None
    """Module names to adapt, or `all-linear`; None = the default for the architecture."""
    learning_rate: float = 2e-4
    epochs: float = 1.0
    max_steps: int | None = None
    """Optimiser steps; overrides `epochs` when set."""
    batch_size: int = 8
    """Examples (or packed blocks) per device per micro-step."""
    gradient_accumulation_steps: int = 1
    max_seq_length: int = 512
    packing: bool = False
    """Concatenate examples into full `max_seq_length` blocks (no padding)."""
    seed: int = 0
    precision: Precision = Precision.AUTO
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = False
    cpu_threads: int | None = None
    """torch threads on CPU; None = torch's default (one per core). 1 is much faster when the
    cores are shared with other busy processes (OpenMP threads then wait on each other)."""
    save_steps: int = 100
    """Checkpoint every N optimiser steps (0: no checkpoints)."""
    save_total_limit: int = 2
    """Checkpoints kept on disk; older ones are deleted."""
    resume: str = RESUME_AUTO
    """`auto` (latest checkpoint in output_dir, if any), `never`, or a checkpoint directory."""
    merge: bool = False
    """Also write the base model with the adapter merged in (`merged/`)."""
    logging_steps: int = 1
    progress: ProgressMode = ProgressMode.AUTO
    progress_interval: float = 1.0
    """Seconds between JSON progress lines (0: one per logging step)."""
    job_name: str | None = None
    """The orchestrator's job name, copied into `result.json`."""
    base_model_name: str | None = None
    """Identity of the base model for `result.json` (the path inside a container says little)."""

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ConfigError("invalid trainer config: " + "; ".join(problems))

    @classmethod
    def from_training_request(
        cls,
        request: TrainingRequest,
        *,
        output_dir: str | Path,
        base_model: str | None = None,
        dataset: str | None = None,
        **overrides: Any,
    ) -> TrainerConfig:
        """The config a backend runs for *request*.

        Args:
            request: the resolved launch decision.
            output_dir: where this backend wants the outputs (a per-job directory, a mount).
            base_model: where the model is as seen by the trainer (e.g. an initializer's
                `/workspace/model`); defaults to `request.base_model`.
            dataset: the dataset as seen by the trainer; defaults to `request.dataset`.
            **overrides: any other field, by name (e.g. `progress=ProgressMode.JSON`).
        """
        lora, training = request.lora, request.training
        values: dict[str, Any] = {
            "base_model": base_model or request.base_model,
            "dataset": dataset or request.dataset,
            "output_dir": str(output_dir),
            "eval_fraction": training.eval_fraction,
            "champion_uri": request.champion_uri,
            "lora_r": lora.r,
            "lora_alpha": lora.alpha,
            "lora_dropout": lora.dropout,
            "target_modules": lora.target_modules,
            "learning_rate": training.learning_rate,
            "epochs": training.epochs,
            "max_steps": training.max_steps,
            "batch_size": training.batch_size,
            "gradient_accumulation_steps": training.gradient_accumulation_steps,
            "max_seq_length": training.max_seq_length,
            "packing": training.packing,
            "seed": training.seed,
            "job_name": request.name,
            "base_model_name": request.base_model,
        }
        values.update(overrides)
        return cls(**values)

    def to_mapping(self) -> dict[str, Any]:
        """Plain JSON-ready values, keyed by field name (None fields left out)."""
        out: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is None:
                continue
            out[spec.name] = _render(value)
        return out

    def to_args(self) -> tuple[str, ...]:
        """Command-line arguments that reproduce this config exactly (`--name value` pairs)."""
        args: list[str] = []
        for name, value in self.to_mapping().items():
            args += [f"--{name.replace('_', '-')}", _as_text(value)]
        return tuple(args)

    def to_env(self) -> dict[str, str]:
        """Environment variables that reproduce this config exactly."""
        return {
            f"{ENV_PREFIX}{name.upper()}": _as_text(value)
            for name, value in self.to_mapping().items()
        }

    def to_json(self) -> str:
        return json.dumps(self.to_mapping(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, origin: str = "config") -> TrainerConfig:
        """Parse field values (from a file, env or args); unknown keys are errors."""
        known = {spec.name for spec in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{origin}: unknown trainer setting(s) {', '.join(unknown)}")
        missing = [name for name in ("base_model", "dataset", "output_dir") if name not in values]
        if missing:
            raise ConfigError(f"{origin}: missing required setting(s) {', '.join(missing)}")
        parsed: dict[str, Any] = {}
        for name, raw in values.items():
            try:
                parsed[name] = _PARSERS[name](raw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{origin}: {name}={raw!r} is not valid: {exc}") from exc
        return cls(**parsed)

    def replace(self, **changes: Any) -> TrainerConfig:
        return dataclasses.replace(self, **changes)


def load(argv: Sequence[str], environ: Mapping[str, str]) -> TrainerConfig:
    """Build the config from defaults, a config file, `TUNELOOP_TRAIN_*` and `--args`.

    Raises:
        ConfigError: a file is missing or unreadable, a key is unknown, a value is invalid.
    """
    from_args = _parse_argv(argv)
    config_path = from_args.pop("config", None) or environ.get(CONFIG_ENV)
    merged: dict[str, Any] = {}
    if config_path:
        merged.update(_read_config_file(Path(config_path)))
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key != CONFIG_ENV:
            merged[key[len(ENV_PREFIX) :].lower()] = value
    merged.update(from_args)
    return TrainerConfig.from_mapping(merged, origin=config_path or "arguments")


def _parse_argv(argv: Sequence[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    items = list(argv)
    index = 0
    while index < len(items):
        item = items[index]
        if not item.startswith("--") or item == "--":
            raise ConfigError(f"unexpected argument {item!r}; arguments are --name value pairs")
        name, sep, inline = item[2:].partition("=")
        if sep:
            value = inline
            index += 1
        else:
            if index + 1 >= len(items):
                raise ConfigError(f"argument {item} needs a value")
            value = items[index + 1]
            index += 2
        values[name.replace("-", "_")] = value
    return values


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read trainer config {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"trainer config {path} is not valid JSON/YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"trainer config {path} must be a mapping of settings")
    return data


def _render(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


def _boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _integer(raw: Any) -> int:
    if isinstance(raw, bool):
        raise TypeError("expected an integer")
    if isinstance(raw, float) and not raw.is_integer():
        raise ValueError("expected an integer")
    return int(raw)


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse_optional(raw: Any) -> Any:
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "null")):
            return None
        return parse(raw)

    return parse_optional


def _modules(raw: Any) -> tuple[str, ...]:
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    names = tuple(str(item).strip() for item in items if str(item).strip())
    if not names:
        raise ValueError("expected at least one module name")
    return names


def _path_text(raw: Any) -> str:
    text = str(raw)
    if not text:
        raise ValueError("must not be empty")
    return text


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "base_model": _path_text,
    "dataset": _path_text,
    "output_dir": _path_text,
    "output_uri": _optional(_path_text),
    "eval_dataset": _optional(_path_text),
    "eval_fraction": float,
    "champion_uri": _optional(_path_text),
    "dataset_format": DatasetFormat,
    "lora_r": _integer,
    "lora_alpha": _integer,
    "lora_dropout": float,
    "target_modules": _optional(_modules),
    "learning_rate": float,
    "epochs": float,
    "max_steps": _optional(_integer),
    "batch_size": _integer,
    "gradient_accumulation_steps": _integer,
    "max_seq_length": _integer,
    "packing": _boolean,
    "seed": _integer,
    "precision": Precision,
    "warmup_steps": _integer,
    "weight_decay": float,
    "max_grad_norm": float,
    "gradient_checkpointing": _boolean,
    "cpu_threads": _optional(_integer),
    "save_steps": _integer,
    "save_total_limit": _integer,
    "resume": _path_text,
    "merge": _boolean,
    "logging_steps": _integer,
    "progress": ProgressMode,
    "progress_interval": float,
    "job_name": _optional(str),
    "base_model_name": _optional(str),
}


def _problems(config: TrainerConfig) -> list[str]:
    problems = []
    if not 0.0 <= config.eval_fraction < 1.0:
        problems.append(f"eval_fraction must be in [0, 1), got {config.eval_fraction}")
    if not 0.0 <= config.lora_dropout < 1.0:
        problems.append(f"lora_dropout must be in [0, 1), got {config.lora_dropout}")
    positive = ("lora_r", "lora_alpha", "batch_size", "gradient_accumulation_steps")
    problems += [f"{name} must be positive" for name in positive if getattr(config, name) <= 0]
    if config.max_seq_length < 8:
        problems.append("max_seq_length must be at least 8")
    if config.max_steps is not None and config.max_steps <= 0:
        problems.append("max_steps must be positive when set")
    if config.max_steps is None and config.epochs <= 0:
        problems.append("epochs must be positive (or set max_steps)")
    if config.learning_rate <= 0:
        problems.append("learning_rate must be positive")
    for name in ("save_steps", "save_total_limit", "warmup_steps"):
        if getattr(config, name) < 0:
            problems.append(f"{name} must not be negative")
    if config.cpu_threads is not None and config.cpu_threads <= 0:
        problems.append("cpu_threads must be positive when set")
    if config.logging_steps <= 0:
        problems.append("logging_steps must be positive")
    if config.output_uri is not None and not config.job_name:
        problems.append("output_uri needs job_name: outputs go to <output_uri>/<job_name>/")
    return problems

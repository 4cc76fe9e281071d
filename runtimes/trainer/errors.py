"""The trainer's own errors, each with the exit code that tells the launcher what to do next.

    TrainerError                     exit 1: unexpected; the run may be retried as is
      TrainerInputError              exit 2: the job can never succeed as asked: don't retry
        DatasetNotFoundError
        MalformedDatasetError        names the file and the 1-based line number
        ModelNotFoundError
        UnknownTargetModuleError     lists the modules the model does have
        InvalidTrainerConfigError
      TrainingOutOfMemoryError       exit 3: retry only with smaller settings (advice included)

`runtimes/trainer/__main__.py` prints the error as one JSON line (`{"event": "failed", ...}`),
writes it to `<output_dir>/failure.json`, and exits with the code; the local-process backend
and the TrainJob status both carry it to the `finetune.failed` event.
"""

from __future__ import annotations

from collections.abc import Sequence


class TrainerError(Exception):
    """A fine-tuning run failed."""

    exit_code = 1
    kind = "TrainerError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_mapping(self) -> dict[str, object]:
        return {"kind": type(self).__name__, "message": self.message, "exit_code": self.exit_code}


class TrainerInputError(TrainerError):
    """The inputs (config, model, data) are wrong: the same run will fail again."""

    exit_code = 2


class DatasetNotFoundError(TrainerInputError):
    """No dataset at the location: no such file, or a directory without a JSON Lines part."""

    def __init__(self, path: str, detail: str = "no such file or directory") -> None:
        super().__init__(f"dataset not found: {path}: {detail}")
        self.path = path


class MalformedDatasetError(TrainerInputError):
    """One record of a dataset file cannot be used (or, line None, the file itself)."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if line is None else f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason

    def to_mapping(self) -> dict[str, object]:
        return {**super().to_mapping(), "path": self.path, "line": self.line}


class ModelNotFoundError(TrainerInputError):
    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"base model {name!r} cannot be loaded: {detail}")
        self.name = name


class UnknownTargetModuleError(TrainerInputError):
    def __init__(self, unknown: Sequence[str], available: Sequence[str]) -> None:
        super().__init__(
            f"target module(s) {', '.join(unknown)} not found in the model; "
            f"linear modules it has: {', '.join(available)} (or use all-linear)"
        )
        self.unknown = tuple(unknown)
        self.available = tuple(available)


class InvalidTrainerConfigError(TrainerInputError):
    pass


class TrainingOutOfMemoryError(TrainerError):
    """The device ran out of memory; the message says which settings to lower."""

    exit_code = 3

    def __init__(self, device: str, *, batch_size: int, max_seq_length: int) -> None:
        super().__init__(
            f"out of memory on {device} at batch_size={batch_size}, "
            f"max_seq_length={max_seq_length}. Try: halve batch_size and double "
            "gradient_accumulation_steps (same effective batch), lower max_seq_length, "
            "set gradient_checkpointing=true, or use precision=bf16 on a GPU that supports it."
        )
        self.device = device

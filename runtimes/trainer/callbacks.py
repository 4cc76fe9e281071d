"""The HF `Trainer` callback that turns training steps into our progress events.

Installed by `training.py`. Emits `progress` (step, loss, tokens seen, tokens/s, ETA) through
the run's `Reporter`; also hosts the fault-injection hook the crash/resume test uses.
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback

from runtimes.trainer.progress import Reporter


class ProgressEvents(TrainerCallback):
    def __init__(self, reporter: Reporter, *, crash_at_step: int | None = None) -> None:
        self._reporter = reporter
        self._crash_at_step = crash_at_step
        self._started = time.monotonic()
        self._first_step = 0
        self._loss: float | None = None
        self.tokens_at_start = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After a resume the state already holds the steps and tokens of the earlier run.
        self._started = time.monotonic()
        self._first_step = state.global_step
        self.tokens_at_start = int(state.num_input_tokens_seen)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])
            self._emit(state, final=state.global_step >= state.max_steps)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._crash_at_step is not None and state.global_step >= self._crash_at_step:
            os._exit(17)

    def _emit(self, state: Any, *, final: bool) -> None:
        elapsed = time.monotonic() - self._started
        steps_done = state.global_step - self._first_step
        tokens = int(state.num_input_tokens_seen) - self.tokens_at_start
        remaining = state.max_steps - state.global_step
        self._reporter.emit(
            "progress",
            step=state.global_step,
            total_steps=state.max_steps,
            epoch=round(float(state.epoch or 0.0), 4),
            loss=self._loss,
            tokens_seen=int(state.num_input_tokens_seen),
            tokens_per_second=tokens / elapsed if elapsed > 0 else None,
            elapsed_seconds=round(elapsed, 3),
            eta_seconds=round(elapsed / steps_done * remaining, 1) if steps_done else None,
            final=final,
        )

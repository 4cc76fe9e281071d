"""The causal-LM loss computed only where it counts: the LM head runs on trained positions only.

HF computes logits for every position (batch x length x vocabulary) and then ignores the
masked ones. With completion-only or assistant-only loss most positions are masked, and the
LM head is a large share of a small model's compute (SmolLM2-135M: a 576 x 49,152 matrix,
~20 % of its FLOPs). Selecting the trained positions first gives the same loss (to float
rounding) and faster steps, the more so the fewer positions are trained; the trainer rows of
docs/performance.md (`make bench`) show what it is worth against plain HF `Trainer`.
`training.py` uses this trainer class for single-process runs on the architectures listed
below; under DDP the forward must go through the DDP wrapper, so it falls back to the stock
loss there, as it does for evaluation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer

from runtimes.trainer.data import IGNORE_INDEX

SELECTIVE_LOSS_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Plain decoder + LM head, no logit scaling or soft-capping: selecting positions is exact."""


class TrainedTokensLossTrainer(Trainer):
    """`Trainer` whose training loss runs the LM head on trained positions only."""

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        if return_outputs or not model.training or isinstance(model, DistributedDataParallel):
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        return trained_positions_loss(model, inputs, num_items_in_batch=num_items_in_batch)


def trained_positions_loss(
    model: Any, inputs: dict[str, Any], *, num_items_in_batch: torch.Tensor | int | None = None
) -> torch.Tensor:
    """The shifted causal-LM cross-entropy of a PeftModel over positions with a label."""
    causal_lm = model.get_base_model()
    hidden = causal_lm.model(
        input_ids=inputs["input_ids"],
        attention_mask=inputs.get("attention_mask"),
        position_ids=inputs.get("position_ids"),  # packed rows: each example from 0
    ).last_hidden_state
    targets = inputs["labels"][:, 1:]
    trained = targets != IGNORE_INDEX
    logits = causal_lm.lm_head(hidden[:, :-1][trained]).float()
    if num_items_in_batch is None:
        return torch.nn.functional.cross_entropy(logits, targets[trained])
    # As HF's fixed_cross_entropy: sum over this micro-batch, divided by the trained tokens
    # of the whole accumulated batch.
    total = torch.nn.functional.cross_entropy(logits, targets[trained], reduction="sum")
    return total / num_items_in_batch

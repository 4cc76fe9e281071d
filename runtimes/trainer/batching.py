"""Tokenized examples as a torch dataset, and the collator that pads a batch.

Used by `training.py` when it builds the HF `Trainer`; imports torch, so only the training
process loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from runtimes.trainer.data import IGNORE_INDEX, TokenizedExample


class TokenizedDataset(torch.utils.data.Dataset[dict[str, list[int]]]):
    def __init__(self, rows: Sequence[TokenizedExample]) -> None:
        self._rows = list(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        row = self._rows[index]
        item = {"input_ids": list(row.input_ids), "labels": list(row.labels)}
        if row.position_ids:
            item["position_ids"] = list(row.position_ids)
        return item


def to_dataset(rows: Sequence[TokenizedExample]) -> TokenizedDataset:
    return TokenizedDataset(rows)


def make_collator(pad_id: int) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
    """Right-pad a batch to its longest row; padding is masked from the loss.

    Rows of single examples get an attention mask that hides the padding. Packed rows (with
    `position_ids`) get none: transformers builds the block-diagonal mask from the restarting
    positions only when no attention mask is given. Their padding sits after every real token
    as a sequence of its own (positions from 0), so no real token attends to it.
    """

    def collate(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(item["input_ids"]) for item in batch)
        packed = "position_ids" in batch[0]
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        positions = torch.zeros((len(batch), width), dtype=torch.long)
        for row, item in enumerate(batch):
            length = len(item["input_ids"])
            input_ids[row, :length] = torch.tensor(item["input_ids"], dtype=torch.long)
            labels[row, :length] = torch.tensor(item["labels"], dtype=torch.long)
            attention[row, :length] = 1
            if packed:
                positions[row, :length] = torch.tensor(item["position_ids"], dtype=torch.long)
                positions[row, length:] = torch.arange(width - length)
        if packed:
            return {"input_ids": input_ids, "labels": labels, "position_ids": positions}
        return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}

    return collate

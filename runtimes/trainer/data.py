"""Datasets for the trainer: JSON Lines records -> segments -> token ids with masked labels.

Called by `runtimes/trainer/training.py`. Reading and validating (`read_examples`) needs no
torch, so a malformed file fails in milliseconds, before the model is loaded. Three record
shapes (the TRL conventions):

* `{"prompt": ..., "completion": ...}`: loss on the completion (and the end-of-sequence) only;
* `{"text": ...}`: loss on every token;
* `{"messages": [{"role": ..., "content": ...}, ...]}`: rendered with the tokenizer's chat
  template; loss on the assistant turns only.

Records come through the storage layer (`runtimes.storage.dataset_rows`, docs/storage.md): a
JSON Lines or Parquet file, or a directory or prefix of parts, local (a path, `file://`, a
directory Kubeflow's dataset initializer filled at /workspace/dataset) or on object storage
(`s3://`). Parts are read in the order of their paths, so the same location always gives the
same examples.

Masked positions get label -100, which the causal-LM loss ignores.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runtimes import storage
from runtimes.storage import StorageSettings
from runtimes.trainer.config import DatasetFormat
from runtimes.trainer.errors import DatasetNotFoundError, MalformedDatasetError

IGNORE_INDEX = -100
_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of an example's text and whether the loss is computed on it."""

    text: str
    trained: bool


@dataclass(frozen=True, slots=True)
class Example:
    """One validated record, before tokenization."""

    line: int
    format: DatasetFormat
    segments: tuple[Segment, ...] = ()
    messages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenizedExample:
    """One training row: an example, or (packed) several whole examples one after another."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    position_ids: tuple[int, ...] = ()
    """Empty for one example (positions 0..n-1); for a packed row, each example's positions
    restart at 0, which is what keeps the examples of a row from attending to each other."""

    @property
    def trained_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


@dataclass(frozen=True, slots=True)
class Dataset:
    """The validated examples of a dataset, and what exactly they were read from."""

    examples: list[Example]
    parts: tuple[str, ...]
    """The URIs of the files read, in reading order."""
    fingerprint: str
    """`sha256:` over each part's name and its records (canonical JSON), in order: the same
    records give the same fingerprint wherever they are stored and in whichever format."""


def read_examples(
    location: str | Path,
    declared: DatasetFormat = DatasetFormat.AUTO,
    *,
    settings: StorageSettings | None = None,
) -> list[Example]:
    """The validated examples of the dataset at *location* (see `read_dataset`)."""
    return read_dataset(location, declared, settings=settings).examples


def read_dataset(
    location: str | Path,
    declared: DatasetFormat = DatasetFormat.AUTO,
    *,
    settings: StorageSettings | None = None,
) -> Dataset:
    """Read and validate every record of the dataset at *location*, in order.

    *location* is anything `runtimes.storage.open_dataset` reads: a JSON Lines or Parquet
    file or a directory or prefix of parts, as a path, `file://` or `s3://` URI. Finding the
    parts is the storage layer's concern; this checks what the records say. The first record
    fixes the shape (unless *declared*); every other record of every part must have it. A
    part may be empty, the whole dataset may not.

    Raises:
        DatasetNotFoundError: nothing at *location*, or no part under it.
        MalformedDatasetError: a line is not JSON, not an object, has the wrong keys or
            types, or does not match the format of the dataset; the error names the file and
            the line (or row).
        StorageError: the store failed or refused the credentials.
    """
    uri = str(location)
    try:
        parts, rows = storage.dataset_rows(uri, settings or StorageSettings.from_env())
        fmt = declared
        examples: list[Example] = []
        digest = hashlib.sha256()
        current = None
        for row in rows:
            shown = _shown(row.part)
            if row.part != current:
                current = row.part
                digest.update(b"\0part\0" + posixpath.basename(row.part).encode())
            digest.update(json.dumps(row.record, sort_keys=True, default=str).encode() + b"\n")
            if fmt is DatasetFormat.AUTO:
                fmt = _detect(row.record, shown, row.number)
            examples.append(_example(row.record, fmt, shown, row.number))
    except storage.NothingAtLocationError as exc:
        raise DatasetNotFoundError(_shown(exc.location), exc.message) from exc
    except storage.MalformedDatasetError as exc:
        raise MalformedDatasetError(_shown(exc.location), exc.line, exc.reason) from exc
    if not examples:
        where = _shown(parts[0]) if len(parts) == 1 else f"{len(parts)} parts, first {parts[0]}"
        raise MalformedDatasetError(where, 1, "the dataset has no records")
    return Dataset(examples=examples, parts=parts, fingerprint=f"sha256:{digest.hexdigest()}")


def _shown(uri: str) -> str:
    """A location as people wrote it: a local file as its path, anything else as its URI."""
    return uri.removeprefix("file://")


def _detect(record: dict[str, Any], path: str, line: int | None) -> DatasetFormat:
    if "messages" in record:
        return DatasetFormat.MESSAGES
    if "prompt" in record or "completion" in record:
        return DatasetFormat.PROMPT_COMPLETION
    if "text" in record:
        return DatasetFormat.TEXT
    raise MalformedDatasetError(
        path,
        line,
        f"unknown record shape {sorted(record)}; expected prompt/completion, text or messages",
    )


def _string_field(record: dict[str, Any], key: str, path: str, line: int | None) -> str:
    if key not in record:
        raise MalformedDatasetError(path, line, f"missing {key!r} (records of this file need it)")
    value = record[key]
    if not isinstance(value, str):
        raise MalformedDatasetError(
            path, line, f"{key!r} must be a string, got {type(value).__name__}"
        )
    return value


def _example(record: dict[str, Any], fmt: DatasetFormat, path: str, line: int) -> Example:
    if fmt is DatasetFormat.PROMPT_COMPLETION:
        prompt = _string_field(record, "prompt", path, line)
        completion = _string_field(record, "completion", path, line)
        if not completion:
            raise MalformedDatasetError(path, line, "'completion' is empty: nothing to learn")
        return Example(line, fmt, (Segment(prompt, False), Segment(completion, True)))
    if fmt is DatasetFormat.TEXT:
        text = _string_field(record, "text", path, line)
        if not text:
            raise MalformedDatasetError(path, line, "'text' is empty")
        return Example(line, fmt, (Segment(text, True),))
    raw = record.get("messages")
    if not isinstance(raw, list) or not raw:
        raise MalformedDatasetError(path, line, "'messages' must be a non-empty list")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise MalformedDatasetError(path, line, f"messages[{index}] must be an object")
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise MalformedDatasetError(
                path, line, f"messages[{index}].role must be one of {', '.join(_ROLES)}"
            )
        if not isinstance(content, str):
            raise MalformedDatasetError(path, line, f"messages[{index}].content must be a string")
        messages.append((str(role), content))
    if not any(role == "assistant" for role, _ in messages):
        raise MalformedDatasetError(path, line, "no assistant message: nothing to learn")
    return Example(line, fmt, messages=tuple(messages))


def split(
    examples: Sequence[Example], *, fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """(train, eval): a seeded, reproducible hold-out of *fraction* of the examples."""
    if fraction <= 0 or len(examples) < 2:
        return list(examples), []
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)  # noqa: S311 -- a reproducible split, not a secret
    held = max(1, round(len(examples) * fraction))
    held_out = set(order[:held])
    train = [ex for i, ex in enumerate(examples) if i not in held_out]
    evaluation = [ex for i, ex in enumerate(examples) if i in held_out]
    return train, evaluation


class Tokenizer(Protocol):
    """The part of a transformers tokenizer this module uses."""

    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None

    def __call__(self, text: str, *, add_special_tokens: bool) -> Any: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def chat_segments(example: Example, tokenizer: Tokenizer) -> tuple[Segment, ...]:
    """Render a conversation with the tokenizer's chat template, split so that only the
    assistant's replies (not their role headers) are trained on.

    Each turn's text is what rendering the first i+1 messages adds to rendering the first i;
    for an assistant turn, the generation prompt is the untrained header.
    """
    messages = [{"role": role, "content": content} for role, content in example.messages]
    if not tokenizer.chat_template:
        return tuple(
            Segment(f"{role}: {content}\n", role == "assistant")
            for role, content in example.messages
        )
    segments: list[Segment] = []
    rendered = ""
    for index, message in enumerate(messages):
        upto = str(tokenizer.apply_chat_template(messages[: index + 1], tokenize=False))
        if not upto.startswith(rendered):
            # The template rewrites earlier turns (rare): train on the whole turn.
            segments.append(Segment(upto, message["role"] == "assistant"))
            rendered = upto
            continue
        if message["role"] == "assistant":
            header = str(
                tokenizer.apply_chat_template(
                    messages[:index], tokenize=False, add_generation_prompt=True
                )
            )
            if index and header.startswith(rendered) and upto.startswith(header):
                segments.append(Segment(header[len(rendered) :], False))
                segments.append(Segment(upto[len(header) :], True))
            else:
                segments.append(Segment(upto[len(rendered) :], True))
        else:
            segments.append(Segment(upto[len(rendered) :], False))
        rendered = upto
    return tuple(segment for segment in segments if segment.text)


def tokenize(
    examples: Sequence[Example], tokenizer: Tokenizer, *, max_seq_length: int
) -> list[TokenizedExample]:
    """Token ids and labels; prompt/header tokens masked, truncated to *max_seq_length*.

    Examples left with no trained token after truncation are dropped (they would only add
    zero-loss padding).
    """
    adds_bos = _adds_bos(tokenizer)
    out: list[TokenizedExample] = []
    for example in examples:
        ids: list[int] = []
        labels: list[int] = []
        if example.format is DatasetFormat.MESSAGES:
            segments = chat_segments(example, tokenizer)
        else:
            segments = example.segments
            if adds_bos and tokenizer.bos_token_id is not None:
                ids.append(tokenizer.bos_token_id)
                labels.append(IGNORE_INDEX)
        for segment in segments:
            piece = list(tokenizer(segment.text, add_special_tokens=False)["input_ids"])
            ids += piece
            labels += piece if segment.trained else [IGNORE_INDEX] * len(piece)
        if example.format is not DatasetFormat.MESSAGES and tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
            labels.append(tokenizer.eos_token_id)
        tokenized = TokenizedExample(tuple(ids[:max_seq_length]), tuple(labels[:max_seq_length]))
        if tokenized.trained_tokens:
            out.append(tokenized)
    return out


def _adds_bos(tokenizer: Tokenizer) -> bool:
    if tokenizer.bos_token_id is None:
        return False
    ids = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def pack(examples: Sequence[TokenizedExample], *, block: int) -> list[TokenizedExample]:
    """Whole examples, in order, side by side in rows of at most *block* tokens.

    Each example keeps its own positions (restarting at 0) and the label of its first token is
    masked, as transformers' `DataCollatorWithFlattening` does: the model then attends within
    each example only (transformers turns restarting position ids into a block-diagonal mask
    when no attention mask is given, `masking_utils.find_packed_sequence_indices`) and never
    predicts one example's first token from the one before. An example never straddles two
    rows: a completion cut from its prompt would be learned without it. Rows are not padded
    here; a batch is padded to its longest row (`batching.make_collator`).
    """
    rows: list[TokenizedExample] = []
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for example in examples:
        length = len(example.input_ids)
        if ids and len(ids) + length > block:
            rows.append(TokenizedExample(tuple(ids), tuple(labels), tuple(positions)))
            ids, labels, positions = [], [], []
        ids += example.input_ids[:block]
        labels += (IGNORE_INDEX, *example.labels[1:block])
        positions += range(min(length, block))
    if ids:
        rows.append(TokenizedExample(tuple(ids), tuple(labels), tuple(positions)))
    return [row for row in rows if row.trained_tokens]

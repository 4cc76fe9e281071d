"""Datasets for the trainer: JSON Lines records -> segments -> token ids with masked labels.

Called by `runtimes/trainer/training.py`. Reading and validating (`read_examples`) needs no
torch, so a malformed file fails in milliseconds, before the model is loaded. Three record
shapes (the TRL conventions):

* `{"prompt": ..., "completion": ...}`: loss on the completion (and the end-of-sequence) only;
* `{"text": ...}`: loss on every token;
* `{"messages": [{"role": ..., "content": ...}, ...]}`: rendered with the tokenizer's chat
  template; loss on the assistant turns only.

A dataset is one JSON Lines file or a directory of them (`dataset_files`): Kubeflow's dataset
initializer copies an `hf://` or `s3://` source into the directory /workspace/dataset, with
the source's own layout (`data/train-00000.jsonl`, ...). Every `*.jsonl` part under it is read,
in the order of the parts' paths, so the same directory always gives the same examples.

Masked positions get label -100, which the causal-LM loss ignores.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runtimes.trainer.config import DatasetFormat
from runtimes.trainer.errors import DatasetNotFoundError, MalformedDatasetError

IGNORE_INDEX = -100
PART_SUFFIX = ".jsonl"
"""The parts of a dataset directory that are read; anything else there is ignored."""
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


def local_path(location: str) -> Path:
    """A dataset location as a local path (`file://` URIs accepted)."""
    return Path(location.removeprefix("file://"))


def fingerprint(paths: Iterable[Path]) -> str:
    """sha256 over the bytes of the data files, in order: what exactly was trained on."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def dataset_files(location: str) -> list[Path]:
    """The JSON Lines files of a dataset: the file itself, or the parts of a directory.

    A directory's parts are its `*.jsonl` files at any depth, hidden entries left out (the hub
    client keeps its metadata in `.cache/`), sorted by their path relative to the directory.

    Raises:
        DatasetNotFoundError: nothing at *location*, or a directory without a `*.jsonl` part
            (the message lists what the directory does hold).
    """
    path = local_path(location)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DatasetNotFoundError(str(path))
    visible = sorted(
        (child for child in path.rglob("*") if child.is_file() and not _hidden(child, path)),
        key=lambda child: child.relative_to(path).as_posix(),
    )
    parts = [child for child in visible if child.name.endswith(PART_SUFFIX)]
    if not parts:
        held = ", ".join(child.relative_to(path).as_posix() for child in visible[:5]) or "nothing"
        more = f" and {len(visible) - 5} more" if len(visible) > 5 else ""
        raise DatasetNotFoundError(
            str(path), f"a directory with no *{PART_SUFFIX} part (it holds {held}{more})"
        )
    return parts


def _hidden(child: Path, root: Path) -> bool:
    return any(name.startswith(".") for name in child.relative_to(root).parts)


def read_examples(path: Path, declared: DatasetFormat = DatasetFormat.AUTO) -> list[Example]:
    """Read and validate every record of one JSON Lines file (see `read_dataset`)."""
    return read_dataset([path], declared)


def read_dataset(
    paths: Sequence[Path], declared: DatasetFormat = DatasetFormat.AUTO
) -> list[Example]:
    """Read and validate every record of the JSON Lines files *paths*, in order.

    The first record fixes the shape (unless *declared*); every other record of every part
    must have it. A part may be empty, the whole dataset may not.

    Raises:
        DatasetNotFoundError: a file does not exist.
        MalformedDatasetError: a line is not JSON, not an object, has the wrong keys or
            types, or does not match the format of the dataset; the error names the file and
            the line.
    """
    fmt = declared
    examples: list[Example] = []
    for path in paths:
        fmt = _read_part(path, fmt, examples)
    if not examples:
        where = str(paths[0]) if len(paths) == 1 else f"{len(paths)} parts, first {paths[0]}"
        raise MalformedDatasetError(where, 1, "the dataset has no records")
    return examples


def _read_part(path: Path, fmt: DatasetFormat, examples: list[Example]) -> DatasetFormat:
    """Append the records of *path* to *examples*; return the format now fixed."""
    if not path.is_file():
        raise DatasetNotFoundError(str(path))
    with path.open(encoding="utf-8") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MalformedDatasetError(
                    str(path), number, f"not valid JSON: {exc.msg}"
                ) from exc
            if not isinstance(record, dict):
                raise MalformedDatasetError(str(path), number, "a record must be a JSON object")
            if fmt is DatasetFormat.AUTO:
                fmt = _detect(record, str(path), number)
            examples.append(_example(record, fmt, str(path), number))
    return fmt


def _detect(record: dict[str, Any], path: str, line: int) -> DatasetFormat:
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


def _string_field(record: dict[str, Any], key: str, path: str, line: int) -> str:
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

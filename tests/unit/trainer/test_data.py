"""Dataset reading, validation, masking and packing (no torch: a character tokenizer stands in)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtimes.trainer import data
from runtimes.trainer.config import DatasetFormat
from runtimes.trainer.errors import DatasetNotFoundError, MalformedDatasetError

BOS, EOS = 1, 2


class CharTokenizer:
    """One token per character (ord + 10); a chat template like ChatML's."""

    bos_token_id: int | None = BOS
    eos_token_id: int | None = EOS
    chat_template: str | None = "chatml"

    def __call__(self, text: str, *, add_special_tokens: bool) -> dict[str, list[int]]:
        ids = [ord(ch) + 10 for ch in text]
        return {"input_ids": ([BOS] if add_special_tokens else []) + ids}

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in conversation)
        return text + ("<assistant>" if kwargs.get("add_generation_prompt") else "")


def _file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _decode(ids: tuple[int, ...]) -> str:
    return "".join(chr(i - 10) for i in ids if i >= 10)


def test_missing_dataset_is_named(tmp_path: Path):
    with pytest.raises(DatasetNotFoundError, match=r"nope\.jsonl"):
        data.read_examples(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("lines", "line", "reason"),
    [
        (['{"prompt": "a", "completion": "b"}', "{not json"], 2, "not valid JSON"),
        (['{"prompt": "a", "completion": "b"}', "", "[1, 2]"], 3, "JSON object"),
        (['{"prompt": "a", "completion": "b"}', '{"prompt": "a"}'], 2, "missing 'completion'"),
        (['{"text": "a"}', '{"text": 5}'], 2, "'text' must be a string"),
        (['{"messages": [{"role": "user", "content": "hi"}]}'], 1, "no assistant"),
        (['{"messages": [{"role": "robot", "content": "x"}]}'], 1, "role must be one of"),
        (['{"question": "a"}'], 1, "unknown record shape"),
    ],
    ids=[
        "bad-json",
        "not-object",
        "missing-key",
        "wrong-type",
        "no-assistant",
        "bad-role",
        "unknown-shape",
    ],
)
def test_malformed_line_is_reported_with_its_line_number(tmp_path: Path, lines, line, reason):
    path = _file(tmp_path, *lines)
    with pytest.raises(MalformedDatasetError, match=reason) as caught:
        data.read_examples(path)
    assert caught.value.line == line
    assert f"{path}:{line}:" in str(caught.value)


def test_format_is_detected_from_the_first_record(tmp_path: Path):
    path = _file(tmp_path, '{"text": "hello"}', '{"text": "world"}')
    examples = data.read_examples(path)
    assert [ex.format for ex in examples] == [DatasetFormat.TEXT, DatasetFormat.TEXT]


def test_prompt_completion_trains_on_completion_and_eos_only(tmp_path: Path):
    path = _file(tmp_path, json.dumps({"prompt": "Q:", "completion": " A"}))
    (tokenized,) = data.tokenize(data.read_examples(path), CharTokenizer(), max_seq_length=64)
    assert tokenized.input_ids[0] == BOS
    trained = [
        t for t, label in zip(tokenized.input_ids, tokenized.labels, strict=True) if label != -100
    ]
    assert _decode(tuple(trained)) == " A"
    assert trained[-1] == EOS


def test_text_records_train_on_every_token(tmp_path: Path):
    path = _file(tmp_path, json.dumps({"text": "abc"}))
    (tokenized,) = data.tokenize(data.read_examples(path), CharTokenizer(), max_seq_length=64)
    assert tokenized.labels[1:] == tokenized.input_ids[1:]


def test_chat_records_train_on_assistant_replies_not_on_headers(tmp_path: Path):
    record = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "ok"},
        ]
    }
    path = _file(tmp_path, json.dumps(record))
    (tokenized,) = data.tokenize(data.read_examples(path), CharTokenizer(), max_seq_length=256)
    assert _decode(tokenized.input_ids) == (
        "<system>be brief</><user>hi</><assistant>yo</><user>again</><assistant>ok</>"
    )
    trained = tuple(
        t for t, label in zip(tokenized.input_ids, tokenized.labels, strict=True) if label != -100
    )
    assert _decode(trained) == "yo</>ok</>"


def test_examples_without_trained_tokens_after_truncation_are_dropped(tmp_path: Path):
    path = _file(tmp_path, json.dumps({"prompt": "x" * 50, "completion": "y"}))
    assert data.tokenize(data.read_examples(path), CharTokenizer(), max_seq_length=10) == []


def test_split_is_reproducible_for_a_seed_and_holds_out_the_fraction(tmp_path: Path):
    path = _file(tmp_path, *(json.dumps({"text": f"row {i}"}) for i in range(50)))
    examples = data.read_examples(path)
    train, held = data.split(examples, fraction=0.1, seed=3)
    again_train, again_held = data.split(examples, fraction=0.1, seed=3)
    assert (len(train), len(held)) == (45, 5)
    assert held == again_held
    assert train == again_train
    assert {ex.line for ex in train}.isdisjoint({ex.line for ex in held})


def test_packing_puts_whole_examples_side_by_side_each_from_position_zero(tmp_path: Path):
    rows = [json.dumps({"prompt": "pp", "completion": "cc"}) for _ in range(5)]
    examples = data.read_examples(_file(tmp_path, *rows))
    tokenized = data.tokenize(examples, CharTokenizer(), max_seq_length=64)
    # Each example is <bos> p p c c <eos>: 6 tokens, so two fit in 16 and a third does not.
    blocks = data.pack(tokenized, block=16)

    assert [len(block.input_ids) for block in blocks] == [12, 12, 6]
    c, ignored = ord("c") + 10, -100
    one_example = (ignored, ignored, ignored, c, c, EOS)
    assert blocks[0].labels == one_example + one_example
    assert blocks[0].position_ids == (0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5)
    assert blocks[2].position_ids == (0, 1, 2, 3, 4, 5)


def test_packing_never_predicts_an_example_from_the_one_before_it(tmp_path: Path):
    # Text records train on every token, the first one too: packed, its label is masked,
    # since the token before it belongs to another example.
    path = _file(tmp_path, '{"text": "ab"}', '{"text": "cd"}')
    tokenized = data.tokenize(data.read_examples(path), NoBosTokenizer(), max_seq_length=64)
    (block,) = data.pack(tokenized, block=64)
    a, b, c, d = (ord(ch) + 10 for ch in "abcd")
    assert block.input_ids == (a, b, EOS, c, d, EOS)
    assert block.labels == (-100, b, EOS, -100, d, EOS)
    assert block.position_ids == (0, 1, 2, 0, 1, 2)


def test_packing_keeps_every_example_and_never_splits_one(tmp_path: Path):
    rows = [json.dumps({"text": "x" * n}) for n in (3, 9, 2, 7, 5, 1)]
    tokenized = data.tokenize(
        data.read_examples(_file(tmp_path, *rows)), CharTokenizer(), max_seq_length=64
    )
    blocks = data.pack(tokenized, block=12)
    assert sum(len(b.input_ids) for b in blocks) == sum(len(t.input_ids) for t in tokenized)
    assert all(len(b.input_ids) <= 12 for b in blocks)
    starts = [b.position_ids.count(0) for b in blocks]
    assert sum(starts) == len(rows)


class NoBosTokenizer(CharTokenizer):
    bos_token_id = None


def test_fingerprint_changes_when_the_data_changes(tmp_path: Path):
    path = _file(tmp_path, '{"text": "a"}')
    before = data.read_dataset(path).fingerprint
    path.write_text('{"text": "b"}\n')
    assert data.read_dataset(path).fingerprint != before
    assert before.startswith("sha256:")


def test_a_parquet_part_gives_the_same_examples_as_its_jsonl_twin(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "jsonl" / "rows.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text('{"text": "a"}\n{"text": "b"}\n')
    parquet = tmp_path / "parquet" / "rows.parquet"
    parquet.parent.mkdir()
    pq.write_table(pa.table({"text": ["a", "b"]}), parquet)
    assert data.read_dataset(parquet).fingerprint != data.read_dataset(jsonl).fingerprint, (
        "the part's name is part of the fingerprint"
    )
    assert data.read_examples(parquet) == data.read_examples(jsonl)

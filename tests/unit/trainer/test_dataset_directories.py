"""A dataset may be a directory of JSON Lines or Parquet parts: what Kubeflow's dataset
initializer writes at /workspace/dataset (the source's own layout, e.g. a hub snapshot). The
storage layer finds the parts (runtimes/storage/datasets.py); the trainer validates them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtimes.trainer import data
from runtimes.trainer.errors import DatasetNotFoundError, MalformedDatasetError


def _part(path: Path, *texts: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


def _texts(examples: list[data.Example]) -> list[str]:
    return [example.segments[0].text for example in examples]


def test_a_single_file_is_the_whole_dataset(tmp_path: Path):
    path = _part(tmp_path / "rows.jsonl", "a")
    dataset = data.read_dataset(f"file://{path}")
    assert dataset.parts == (f"file://{path}",)
    assert _texts(dataset.examples) == ["a"]


def test_a_directory_is_read_part_by_part_in_the_order_of_their_paths(tmp_path: Path):
    root = tmp_path / "dataset"
    _part(root / "data" / "train-00001.jsonl", "c", "d")
    _part(root / "data" / "train-00000.jsonl", "a", "b")
    _part(root / "extra.jsonl", "e")
    (root / "README.md").write_text("# a dataset card, not data\n")
    _part(root / ".cache" / "huggingface" / "stale.jsonl", "never read")

    dataset = data.read_dataset(str(root))

    assert [part.removeprefix(f"file://{root}/") for part in dataset.parts] == [
        "data/train-00000.jsonl",
        "data/train-00001.jsonl",
        "extra.jsonl",
    ]
    assert _texts(dataset.examples) == ["a", "b", "c", "d", "e"]


def test_the_same_directory_always_gives_the_same_fingerprint(tmp_path: Path):
    root = tmp_path / "dataset"
    for index in (3, 1, 2):
        _part(root / f"part-{index}.jsonl", str(index))
    first = data.read_dataset(str(root)).fingerprint
    assert data.read_dataset(str(root)).fingerprint == first


def test_an_empty_part_is_skipped_but_an_empty_dataset_is_an_error(tmp_path: Path):
    root = tmp_path / "dataset"
    _part(root / "a.jsonl")
    _part(root / "b.jsonl", "x")
    assert _texts(data.read_examples(str(root))) == ["x"]

    (root / "b.jsonl").write_text("")
    with pytest.raises(MalformedDatasetError, match="no records"):
        data.read_dataset(str(root))


def test_a_part_of_another_shape_is_named_with_its_line(tmp_path: Path):
    root = tmp_path / "dataset"
    _part(root / "a.jsonl", "x")
    (root / "b.jsonl").write_text('{"prompt": "p", "completion": "c"}\n')
    with pytest.raises(MalformedDatasetError) as caught:
        data.read_dataset(str(root))
    assert str(caught.value).startswith(f"{root / 'b.jsonl'}:1:")


def test_an_empty_directory_is_a_missing_dataset(tmp_path: Path):
    root = tmp_path / "dataset"
    root.mkdir()
    with pytest.raises(DatasetNotFoundError, match="an empty directory"):
        data.read_dataset(str(root))


def test_a_directory_without_parts_says_what_it_holds(tmp_path: Path):
    root = tmp_path / "dataset"
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.csv").write_text("text\na\n")
    (root / "README.md").write_text("card\n")
    with pytest.raises(DatasetNotFoundError) as caught:
        data.read_dataset(str(root))
    assert "(README.md, train.csv)" in str(caught.value)
    assert caught.value.exit_code == 2, "never retried as is"


def test_a_missing_location_is_a_missing_dataset(tmp_path: Path):
    with pytest.raises(DatasetNotFoundError, match="no such file or prefix"):
        data.read_dataset(str(tmp_path / "nowhere"))

"""Datasets: JSON Lines or Parquet, one file or a prefix (a directory) of parts, in path order.

A prefix is read part by part in sorted path order, so the same prefix always gives the same
records in the same order (the trainer's seeded split depends on it). Names starting with `.`
or `_` (`_SUCCESS`, `.crc` files that Spark and friends leave, a hub client's `.cache/`
folder), at any depth below the prefix, and other suffixes are skipped.

`open_dataset` gives the records; `dataset_rows` gives each with where it came from (the
part and its 1-based line or row), which the trainer needs to name a bad record.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from runtimes.storage.errors import (
    InvalidLocationError,
    MalformedDatasetError,
    NothingAtLocationError,
)
from runtimes.storage.filesystems import files_under, filesystem_for, kind_of, translated_errors
from runtimes.storage.locations import Location, parse_location
from runtimes.storage.settings import StorageSettings

JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
Record = dict[str, Any]


@dataclass(frozen=True, slots=True)
class DatasetRow:
    """One record and where it came from."""

    part: str
    """The part's URI (`file:///...`, `s3://bucket/key`)."""
    number: int
    """1-based: the line of a JSON Lines part, the row of a Parquet part."""
    record: Record


def open_dataset(
    uri: str, settings: StorageSettings, *, required_columns: Sequence[str] = ()
) -> Iterator[Record]:
    """The records of the dataset at *uri*, each a mapping of column to value.

    What can be checked without reading every record is checked before this returns: the
    location exists, holds at least one part, and every Parquet part has *required_columns*.

    Raises:
        InvalidLocationError: the URI is malformed, or names one file of another format.
        NothingAtLocationError: no such file or prefix, or a prefix with no part.
        MalformedDatasetError: a Parquet part lacks a required column (here); a JSON line
            that is not an object or lacks one (while iterating).
        CredentialsRefusedError: the store refused the credentials.
        StorageError: the store failed otherwise (while listing or while iterating).
    """
    location = parse_location(uri)
    fs = filesystem_for(location, settings)
    with translated_errors(location):
        parts = _parts(fs, location)
        for part in parts:
            if part.endswith(PARQUET_SUFFIXES):
                _check_parquet_columns(fs, location, part, required_columns)
    return (row.record for row in _rows(fs, location, parts, tuple(required_columns)))


def dataset_rows(
    uri: str, settings: StorageSettings, *, required_columns: Sequence[str] = ()
) -> tuple[tuple[str, ...], Iterator[DatasetRow]]:
    """The parts of the dataset at *uri* (URIs, in reading order) and its rows, each with its
    part and line or row number. Checks and raises as `open_dataset` does."""
    location = parse_location(uri)
    fs = filesystem_for(location, settings)
    with translated_errors(location):
        parts = _parts(fs, location)
        for part in parts:
            if part.endswith(PARQUET_SUFFIXES):
                _check_parquet_columns(fs, location, part, required_columns)
    uris = tuple(_part_uri(location, part) for part in parts)
    return uris, _rows(fs, location, parts, tuple(required_columns))


def _parts(fs: Any, location: Location) -> list[str]:
    kind = kind_of(fs, location.path)
    if kind is None:
        raise NothingAtLocationError(location.uri, "no such file or prefix")
    if kind == "file":
        if not location.path.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES):
            raise InvalidLocationError(
                f"{location.uri}: a dataset file ends in .jsonl, .json or .parquet"
            )
        return [location.path]
    found = files_under(fs, location.path)
    if not found:
        raise NothingAtLocationError(location.uri, "an empty directory")
    parts = [path for path in found if _is_part(posixpath.relpath(path, location.path))]
    if not parts:
        shown = ", ".join(posixpath.basename(path) for path in found[:5])
        raise NothingAtLocationError(
            location.uri,
            f"no .jsonl, .json or .parquet part among its {len(found)} file(s) ({shown})",
        )
    return parts


def _is_part(relative: str) -> bool:
    hidden = any(name.startswith((".", "_")) for name in relative.split("/"))
    return not hidden and relative.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES)


def _check_parquet_columns(fs: Any, location: Location, part: str, required: Sequence[str]) -> None:
    import pyarrow.parquet as pq

    with fs.open(part, "rb") as handle:
        names = set(pq.ParquetFile(handle).schema_arrow.names)
    missing = [column for column in required if column not in names]
    if missing:
        raise MalformedDatasetError(
            _part_uri(location, part),
            f"the Parquet file has no column(s) {', '.join(missing)} "
            f"(it has {', '.join(sorted(names)) or 'none'})",
        )


def _rows(
    fs: Any, location: Location, parts: Sequence[str], required: Sequence[str]
) -> Iterator[DatasetRow]:
    for part in parts:
        part_uri = _part_uri(location, part)
        with translated_errors(location):
            records: Iterator[tuple[int, Record]]
            if part.endswith(PARQUET_SUFFIXES):
                records = enumerate(_parquet_records(fs, part), start=1)
            else:
                records = _jsonl_records(fs, part_uri, part, required)
            for number, record in records:
                yield DatasetRow(part_uri, number, record)


def _parquet_records(fs: Any, part: str) -> Iterator[Record]:
    import pyarrow.parquet as pq

    with fs.open(part, "rb") as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=1024):
            yield from batch.to_pylist()


def _jsonl_records(
    fs: Any, part_uri: str, part: str, required: Sequence[str]
) -> Iterator[tuple[int, Record]]:
    with fs.open(part, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise MalformedDatasetError(
                    part_uri, f"not valid JSON: {exc}", line=number
                ) from exc
            if not isinstance(record, dict):
                raise MalformedDatasetError(
                    part_uri, f"a record is a JSON object, not {type(record).__name__}", line=number
                )
            missing = [column for column in required if column not in record]
            if missing:
                raise MalformedDatasetError(
                    part_uri, f"no field(s) {', '.join(missing)}", line=number
                )
            yield number, record


def _part_uri(location: Location, part: str) -> str:
    return Location(location.scheme, part).uri

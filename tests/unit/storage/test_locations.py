from __future__ import annotations

import os

import pytest

from runtimes.storage import InvalidLocationError, Location, Scheme, parse_location


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/data/train.jsonl", Location(Scheme.FILE, "/data/train.jsonl")),
        ("file:///data/train.jsonl", Location(Scheme.FILE, "/data/train.jsonl")),
        ("file://localhost/data/x", Location(Scheme.FILE, "/data/x")),
        ("s3://bucket/prefix/part-0.parquet", Location(Scheme.S3, "bucket/prefix/part-0.parquet")),
        ("s3://bucket/prefix/", Location(Scheme.S3, "bucket/prefix")),
        ("S3://bucket", Location(Scheme.S3, "bucket")),
        (
            "hf://datasets/org/name/train.jsonl",
            Location(Scheme.HF, "datasets/org/name/train.jsonl"),
        ),
    ],
    ids=["path", "file-uri", "file-localhost", "s3-key", "s3-prefix-slash", "s3-upper", "hf"],
)
def test_a_location_names_its_store_and_path(text: str, expected: Location) -> None:
    assert parse_location(text) == expected


def test_a_relative_path_is_taken_from_the_working_directory() -> None:
    assert parse_location("data/train.jsonl").path == os.path.join(os.getcwd(), "data/train.jsonl")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("gs://bucket/x", "unsupported scheme 'gs'"),
        ("s3:///key", "starts with a bucket"),
        ("s3://AKIA:secret@bucket/key", "credentials never go in a URI"),
        ("s3://bucket/key?versionId=1", "no query"),
        ("file://otherhost/data", "names this machine only"),
    ],
    ids=["empty", "other-scheme", "no-bucket", "credentials", "query", "remote-file"],
)
def test_a_location_that_cannot_be_used_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(InvalidLocationError, match=message):
        parse_location(text)


def test_a_refused_uri_with_credentials_does_not_repeat_the_secret() -> None:
    with pytest.raises(InvalidLocationError) as caught:
        parse_location("s3://AKIA:topsecret@bucket/key")

    assert "topsecret" not in str(caught.value)


def test_a_child_location_joins_with_single_slashes() -> None:
    out = parse_location("s3://bucket/adapters/")

    assert out.child("job-1", "/manifest.json").uri == "s3://bucket/adapters/job-1/manifest.json"
    assert parse_location("/tmp/out").child("job-1").uri == "file:///tmp/out/job-1"

from __future__ import annotations

import json

import pytest

from runtimes.storage import Manifest, ManifestEntry
from runtimes.storage.manifest import ManifestFormatError

DIGEST = "a" * 64


def test_a_manifest_lists_its_files_sorted_by_path_with_size_and_digest() -> None:
    manifest = Manifest(
        job="job-1",
        files=(ManifestEntry("result.json", 10, DIGEST), ManifestEntry("adapter/a.bin", 5, DIGEST)),
    )

    assert json.loads(manifest.to_bytes()) == {
        "format": "tuneloop.adapter-manifest/v1",
        "job": "job-1",
        "files": [
            {"path": "adapter/a.bin", "size": 5, "sha256": DIGEST},
            {"path": "result.json", "size": 10, "sha256": DIGEST},
        ],
    }


def test_a_manifest_reads_back_what_was_written() -> None:
    written = Manifest(job="j", files=(ManifestEntry("a.bin", 1, DIGEST),))

    assert Manifest.from_bytes(written.to_bytes()) == written


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"format": "something-else/v1", "job": "j", "files": []}',
        b'{"format": "tuneloop.adapter-manifest/v1", "files": []}',
        b'{"format": "tuneloop.adapter-manifest/v1", "job": "j", "files": [{"path": "../x", '
        b'"size": 1, "sha256": "' + DIGEST.encode() + b'"}]}',
        b'{"format": "tuneloop.adapter-manifest/v1", "job": "j", "files": [{"path": "x", '
        b'"size": -1, "sha256": "' + DIGEST.encode() + b'"}]}',
    ],
    ids=["not-json", "other-format", "no-job", "path-escapes", "negative-size"],
)
def test_bytes_that_are_not_a_manifest_are_refused(body: bytes) -> None:
    with pytest.raises(ManifestFormatError):
        Manifest.from_bytes(body)

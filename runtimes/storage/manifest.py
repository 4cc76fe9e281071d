"""The adapter manifest: every published file with its size and SHA-256, written last.

    {"format": "tuneloop.adapter-manifest/v1", "job": "lora-...-3f2a",
     "files": [{"path": "adapter/adapter_config.json", "size": 611, "sha256": "9c1e..."}, ...]}

Paths are relative to the manifest's own folder, with `/` separators, sorted. A reader that
finds the manifest may rely on every listed file being complete; one that does not, must
treat the adapter as absent. Pure: turning values into bytes and back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "tuneloop.adapter-manifest/v1"


class ManifestFormatError(ValueError):
    """The bytes are not a manifest this version reads: the adapter counts as absent."""


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    job: str
    files: tuple[ManifestEntry, ...]

    def to_bytes(self) -> bytes:
        body = {
            "format": MANIFEST_FORMAT,
            "job": self.job,
            "files": [
                {"path": entry.path, "size": entry.size, "sha256": entry.sha256}
                for entry in sorted(self.files, key=lambda entry: entry.path)
            ],
        }
        return (json.dumps(body, indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Raises: ManifestFormatError: not JSON, another format, or a malformed entry."""
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestFormatError(f"not JSON: {exc}") from exc
        if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
            raise ManifestFormatError(f"not a {MANIFEST_FORMAT} manifest")
        files = body.get("files")
        job = body.get("job")
        if not isinstance(job, str) or not isinstance(files, list):
            raise ManifestFormatError("a manifest has a job name and a list of files")
        return cls(job=job, files=tuple(_entry(item) for item in files))


def _entry(item: object) -> ManifestEntry:
    if not isinstance(item, dict):
        raise ManifestFormatError(f"a file entry is an object, not {item!r}")
    path, size, digest = item.get("path"), item.get("size"), item.get("sha256")
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or ".." in path.split("/")
        or not isinstance(size, int)
        or size < 0
        or not isinstance(digest, str)
        or len(digest) != 64
    ):
        raise ManifestFormatError(f"malformed file entry {item!r}")
    return ManifestEntry(path=path, size=size, sha256=digest)

"""URIs -> `Location`: which store, and the path inside it. Pure: nothing is opened here.

    /data/train.jsonl, data/train.jsonl, file:///data/train.jsonl   the local filesystem
    s3://bucket/prefix/part-0.parquet                                any S3-compatible store
    hf://datasets/org/name/train.jsonl, hf://org/model               the Hugging Face Hub

Credentials never go in a URI (they would land in rule files, events and logs): a URI with a
user part is refused, and the settings carry them instead.
"""

from __future__ import annotations

import enum
import os
import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit

from runtimes.storage.errors import InvalidLocationError


class Scheme(enum.Enum):
    FILE = "file"
    S3 = "s3"
    HF = "hf"


@dataclass(frozen=True, slots=True)
class Location:
    """One file or prefix: `path` is what the store's fsspec filesystem takes (`bucket/key`
    for S3, an absolute path for files), `uri` is how it is written back to users."""

    scheme: Scheme
    path: str

    @property
    def uri(self) -> str:
        if self.scheme is Scheme.FILE:
            return f"file://{self.path}"
        return f"{self.scheme.value}://{self.path}"

    def child(self, *parts: str) -> Location:
        """The location of *parts* below this one (`s3://b/out` + `job`, `a.json`)."""
        cleaned = [part.strip("/") for part in parts if part.strip("/")]
        return Location(self.scheme, posixpath.join(self.path.rstrip("/"), *cleaned))

    def __str__(self) -> str:
        return self.uri


_SUPPORTED = ", ".join(f"{scheme.value}://" for scheme in Scheme) + " or a plain path"


def parse_location(text: str) -> Location:
    """Parse a model, dataset or output URI.

    Raises:
        InvalidLocationError: empty, an unsupported scheme, an S3 URI without a bucket, a
            `file://` URI naming another host, or any URI carrying credentials, a query or a
            fragment.
    """
    raw = text.strip()
    if not raw:
        raise InvalidLocationError("an empty string is not a location")
    if "://" not in raw:
        return Location(Scheme.FILE, os.path.abspath(os.path.expanduser(raw)))
    parts = urlsplit(raw)
    try:
        scheme = Scheme(parts.scheme.lower())
    except ValueError:
        raise InvalidLocationError(
            f"{raw!r}: unsupported scheme {parts.scheme!r}; use {_SUPPORTED}"
        ) from None
    if "@" in parts.netloc:
        raise InvalidLocationError(
            f"{_redacted(raw)}: credentials never go in a URI; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (from a Kubernetes Secret) instead"
        )
    if parts.query or parts.fragment:
        raise InvalidLocationError(f"{raw!r}: a location has no query or fragment")
    if scheme is Scheme.FILE:
        if parts.netloc not in ("", "localhost"):
            raise InvalidLocationError(
                f"{raw!r}: file:// names this machine only (file:///path), not {parts.netloc!r}"
            )
        if not parts.path.startswith("/"):
            raise InvalidLocationError(f"{raw!r}: a file:// URI needs an absolute path")
        return Location(Scheme.FILE, posixpath.normpath(parts.path))
    if scheme is Scheme.S3 and not parts.netloc:
        raise InvalidLocationError(f"{raw!r}: an s3:// URI starts with a bucket (s3://bucket/key)")
    path = f"{parts.netloc}{parts.path}".rstrip("/")
    if not path:
        raise InvalidLocationError(f"{raw!r}: names no repository or file")
    return Location(scheme, path)


def _redacted(uri: str) -> str:
    parts = urlsplit(uri)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://***@{host}{parts.path}"

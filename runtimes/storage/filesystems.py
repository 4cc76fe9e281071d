"""Location + settings -> an fsspec filesystem, and the store's errors -> ours.

S3 goes through pyarrow's S3 client (the AWS C++ SDK) behind fsspec's `ArrowFSWrapper`,
not s3fs: s3fs needs aiobotocore, whose botocore pins python-dateutil below 3, while the
kubernetes client tuneloop uses needs python-dateutil 3 or newer, so the two cannot be
installed together (checked 2026-12 with s3fs 2026.9.0, aiobotocore 3.10.0, kubernetes 37).
Callers see the same fsspec interface either way; swapping back is this module's change only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.local import LocalFileSystem

from runtimes.storage.errors import (
    CredentialsRefusedError,
    NothingAtLocationError,
    StorageError,
    StorageInputError,
)
from runtimes.storage.locations import Location, Scheme
from runtimes.storage.settings import StorageSettings

_REFUSED_MARKERS = ("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")
_MISSING_MARKERS = ("NO_SUCH_BUCKET", "NoSuchBucket", "NO_SUCH_KEY", "NoSuchKey")


def filesystem_for(location: Location, settings: StorageSettings) -> Any:
    """The fsspec filesystem that serves *location* (typed Any: fsspec ships no types).

    Raises:
        StorageInputError: `hf://` while the Hub is switched off (`HF_HUB_OFFLINE`).
    """
    if location.scheme is Scheme.FILE:
        return LocalFileSystem()
    if location.scheme is Scheme.S3:
        return ArrowFSWrapper(_arrow_s3(settings))
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise StorageInputError(
            f"{location.uri} is on the Hugging Face Hub, and HF_HUB_OFFLINE is set: copy it to "
            "a directory or an s3:// prefix, or allow the network for this job"
        )
    return fsspec.filesystem("hf")


def _arrow_s3(settings: StorageSettings) -> Any:
    from pyarrow import fs as arrow_fs

    options: dict[str, Any] = {
        "region": settings.region,
        "connect_timeout": settings.connect_timeout,
        "request_timeout": settings.request_timeout,
        "retry_strategy": arrow_fs.AwsStandardS3RetryStrategy(max_attempts=settings.max_attempts),
    }
    if settings.endpoint_url:
        options["endpoint_override"] = settings.endpoint_url
    if settings.has_static_credentials:
        options["access_key"] = settings.access_key_id
        options["secret_key"] = settings.secret_access_key
        if settings.session_token:
            options["session_token"] = settings.session_token
    return arrow_fs.S3FileSystem(**options)


@contextlib.contextmanager
def translated_errors(location: Location) -> Iterator[None]:
    """Turn the store's exceptions into storage errors naming *location* (chained)."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError as exc:
        raise NothingAtLocationError(location.uri, "no such file, prefix or bucket") from exc
    except PermissionError as exc:
        raise CredentialsRefusedError(f"{location.uri}: permission denied: {exc}") from exc
    except OSError as exc:
        text = str(exc)
        if any(marker in text for marker in _REFUSED_MARKERS):
            raise CredentialsRefusedError(
                f"{location.uri}: the store refused the credentials from AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY: {text}"
            ) from exc
        if any(marker in text for marker in _MISSING_MARKERS):
            raise NothingAtLocationError(location.uri, text) from exc
        raise StorageError(f"{location.uri}: {text}") from exc


def kind_of(fs: Any, path: str) -> str | None:
    """ "file", "directory" (a prefix with objects under it) or None when nothing is there.

    fsspec's `isfile`, `exists` and `find` answer False or [] for *any* error, refused
    credentials included; this asks the store directly, so only "not found" means absent.
    """
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    kind = info.get("type")
    return kind if kind in ("file", "directory") else None


def files_under(fs: Any, path: str) -> list[str]:
    """Every file below *path*, sorted; the store's errors are raised, not skipped."""
    return sorted(fs.find(path, on_error="raise"))

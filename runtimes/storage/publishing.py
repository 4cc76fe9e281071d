"""Publishing an adapter: every file first, the manifest last, and nothing half-published.

`publish_adapter` uploads the trainer's output folder (the adapter, `result.json`, the
metrics and the data card) to `<output_uri>/<job>/`, hashing each file as it streams, then
writes `manifest.json`. The manifest is one object (S3) or one rename (files), so it
appears whole or not at all, and only after every file it lists. A stale manifest from an
earlier attempt of the same job is deleted *first*, so that while files are being replaced
no reader trusts a manifest that no longer matches them. Any failure raises
`AdapterUploadFailedError` before the manifest is written: the job fails, and
`adapter_exists` stays false.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes.storage.errors import (
    AdapterUploadFailedError,
    InvalidLocationError,
    NothingAtLocationError,
    StorageError,
)
from runtimes.storage.filesystems import filesystem_for, kind_of, translated_errors
from runtimes.storage.locations import Location, Scheme, parse_location
from runtimes.storage.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestEntry,
    ManifestFormatError,
)
from runtimes.storage.settings import StorageSettings

NOT_PUBLISHED = ("checkpoints", "inputs", "failure.json", MANIFEST_NAME)
"""Top-level names of the output folder left behind: resumable training state (large, and
useless to a reader of the adapter), the inputs a job fetched (a base model copied from a
prefix), a failure record, and any local manifest."""

_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AdapterLocation:
    """A published adapter: its folder, its manifest and what the manifest lists."""

    uri: str
    manifest_uri: str
    files: tuple[ManifestEntry, ...]


def adapter_location(output_uri: str, job: str) -> Location:
    """`<output_uri>/<job>`, the folder a job's adapter is published to.

    Raises:
        InvalidLocationError: the URI is malformed, or *job* is not one path segment.
    """
    if not job or "/" in job or job in (".", ".."):
        raise InvalidLocationError(f"job name {job!r} is not a single path segment")
    return parse_location(output_uri).child(job)


def publish_adapter(
    local_dir: Path,
    output_uri: str,
    job: str,
    settings: StorageSettings,
    *,
    on_uploaded: Callable[[str], None] | None = None,
) -> AdapterLocation:
    """Upload *local_dir* to `<output_uri>/<job>/` and write its manifest last.

    *on_uploaded* is called with each file's relative path once it is stored (progress).

    Raises:
        InvalidLocationError: a malformed URI or job name.
        NothingAtLocationError: *local_dir* holds no file to publish.
        CredentialsRefusedError: the store refused the credentials before any upload.
        AdapterUploadFailedError: a file or the manifest could not be stored: the job fails.
    """
    target = adapter_location(output_uri, job)
    files = _files_to_publish(local_dir)
    fs = filesystem_for(target, settings)
    manifest_location = target.child(MANIFEST_NAME)
    with translated_errors(target):
        if kind_of(fs, manifest_location.path) is not None:
            fs.rm_file(manifest_location.path)
    entries: list[ManifestEntry] = []
    for relative in files:
        try:
            entries.append(_upload(fs, local_dir, relative, target))
        except (OSError, StorageError) as exc:
            raise AdapterUploadFailedError(
                target.uri, [entry.path for entry in entries], relative, str(exc)
            ) from exc
        if on_uploaded is not None:
            on_uploaded(relative)
    manifest = Manifest(job=job, files=tuple(entries))
    try:
        _write_whole(fs, manifest_location, manifest.to_bytes())
    except OSError as exc:
        raise AdapterUploadFailedError(
            target.uri, [entry.path for entry in entries], MANIFEST_NAME, str(exc)
        ) from exc
    return AdapterLocation(uri=target.uri, manifest_uri=manifest_location.uri, files=manifest.files)


def read_manifest(uri: str, settings: StorageSettings) -> Manifest:
    """The manifest of the adapter published at *uri* (`<output_uri>/<job>`).

    Raises:
        NothingAtLocationError: no manifest there (not published, or not yet).
        StorageError: the manifest is not one this version reads, or the store failed.
    """
    location = parse_location(uri).child(MANIFEST_NAME)
    fs = filesystem_for(location, settings)
    with translated_errors(location):
        data = fs.cat_file(location.path)
    try:
        return Manifest.from_bytes(data)
    except ManifestFormatError as exc:
        raise StorageError(f"{location.uri}: {exc}") from exc


def adapter_exists(uri: str, settings: StorageSettings) -> bool:
    """True only when the manifest at *uri* exists, reads, and every file it lists exists
    with the listed size.

    Raises:
        InvalidLocationError: a malformed URI.
        CredentialsRefusedError: the store refused the credentials (not the same as absent).
        StorageError: the store failed otherwise.
    """
    location = parse_location(uri)
    try:
        manifest = read_manifest(uri, settings)
    except NothingAtLocationError:
        return False
    except StorageError as exc:
        if isinstance(exc.__cause__, ManifestFormatError):
            return False
        raise
    fs = filesystem_for(location, settings)
    with translated_errors(location):
        for entry in manifest.files:
            path = location.child(entry.path).path
            try:
                info = fs.info(path)
            except FileNotFoundError:
                return False
            if info.get("type") != "file" or info.get("size") != entry.size:
                return False
    return True


def _files_to_publish(local_dir: Path) -> list[str]:
    if not local_dir.is_dir():
        raise NothingAtLocationError(str(local_dir), "no such directory to publish")
    found = sorted(
        path.relative_to(local_dir).as_posix()
        for path in local_dir.rglob("*")
        if path.is_file() and path.relative_to(local_dir).parts[0] not in NOT_PUBLISHED
    )
    if not found:
        raise NothingAtLocationError(str(local_dir), "no adapter files to publish")
    return found


def _upload(fs: Any, local_dir: Path, relative: str, target: Location) -> ManifestEntry:
    remote = target.child(relative)
    source_path = local_dir / relative
    if remote.scheme is Scheme.FILE:
        if os.path.realpath(remote.path) == os.path.realpath(source_path):
            # Published where it was written (a trainer whose output_dir is already the
            # shared volume): only the manifest is new. Copying would truncate the file.
            return _hashed_in_place(source_path, relative)
        fs.makedirs(os.path.dirname(remote.path), exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    with source_path.open("rb") as source, fs.open(remote.path, "wb") as sink:
        for chunk in _chunks(source):
            digest.update(chunk)
            size += len(chunk)
            sink.write(chunk)
    return ManifestEntry(path=relative, size=size, sha256=digest.hexdigest())


def _hashed_in_place(path: Path, relative: str) -> ManifestEntry:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as source:
        for chunk in _chunks(source):
            digest.update(chunk)
            size += len(chunk)
    return ManifestEntry(path=relative, size=size, sha256=digest.hexdigest())


def _chunks(source: Any) -> Iterable[bytes]:
    while chunk := source.read(_CHUNK):
        yield chunk


def _write_whole(fs: Any, location: Location, data: bytes) -> None:
    if location.scheme is Scheme.FILE:
        # A rename is atomic on one filesystem: the manifest appears complete or not at all.
        partial = f"{location.path}.partial-{os.getpid()}"
        try:
            with open(partial, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, location.path)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return
    # One PUT of a small object: S3 makes it visible whole, after every file above.
    with fs.open(location.path, "wb") as handle:
        handle.write(data)

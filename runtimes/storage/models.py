"""Models: a local directory is used where it is; a remote prefix is copied into a directory.

The copy lands in a scratch folder beside *into* and is renamed into place only when every
file has arrived, so an interrupted fetch never leaves a directory that looks like a model.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path
from typing import Any

from runtimes.storage.errors import NothingAtLocationError, StorageError
from runtimes.storage.filesystems import files_under, filesystem_for, kind_of, translated_errors
from runtimes.storage.locations import Location, Scheme, parse_location
from runtimes.storage.settings import StorageSettings

FETCHED_MARKER = ".tuneloop-fetched"
"""Written last into a fetched directory, holding the source URI: a second fetch of the same
URI into the same directory (a retried pod on the same volume) downloads nothing."""


def fetch_model(uri: str, settings: StorageSettings, *, into: Path) -> Path:
    """A local directory holding the model at *uri*: the directory itself for a local path,
    else *into*, filled with every file under the remote prefix (relative paths kept).

    Raises:
        InvalidLocationError: the URI is malformed.
        NothingAtLocationError: no such directory or prefix, or nothing in it.
        CredentialsRefusedError: the store refused the credentials.
        StorageError: *into* holds something else, or the store failed otherwise.
    """
    location = parse_location(uri)
    if location.scheme is Scheme.FILE:
        return _local_model(location)
    marker = into / FETCHED_MARKER
    if marker.is_file() and marker.read_text() == location.uri:
        return into
    if into.exists() and any(into.iterdir()):
        raise StorageError(f"{into} is not empty and holds no fetch of {location.uri}")
    fs = filesystem_for(location, settings)
    with translated_errors(location):
        files = files_under(fs, location.path) if kind_of(fs, location.path) else []
        if not files:
            raise NothingAtLocationError(location.uri, "no such prefix, or no files under it")
        _download(fs, location, files, into)
    return into


def _local_model(location: Location) -> Path:
    path = Path(location.path)
    if not path.is_dir():
        detail = "a model is a directory, not a file" if path.exists() else "no such directory"
        raise NothingAtLocationError(location.uri, detail)
    if not any(path.iterdir()):
        raise NothingAtLocationError(location.uri, "the directory is empty")
    return path


def _download(fs: Any, location: Location, files: list[str], into: Path) -> None:
    into.parent.mkdir(parents=True, exist_ok=True)
    scratch = into.parent / f".{into.name}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        for remote in files:
            relative = posixpath.relpath(remote, location.path)
            target = scratch.joinpath(*relative.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(target))
        (scratch / FETCHED_MARKER).write_text(location.uri)
        if into.exists():
            into.rmdir()  # checked empty by the caller
        scratch.rename(into)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

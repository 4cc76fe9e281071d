"""Storage errors, named for what happens next: every one of them fails the job that hit it.

    StorageError                 exit 1: the job fails; the same job may succeed later
                                 (the endpoint was down, the connection broke)
      AdapterUploadFailedError   the job fails: an adapter file did not reach the store, so no
                                 manifest was written and no reader ever sees the adapter
      StorageInputError          exit 2: the job fails and will fail again as asked: don't retry
        InvalidLocationError     the URI cannot name anything tuneloop reads or writes
        NothingAtLocationError   a missing file, prefix or bucket, or a directory without parts
        MalformedDatasetError    a record or a Parquet schema cannot be used (file and line)
        CredentialsRefusedError  the store refused the credentials the settings carry

The exit codes and `to_mapping()` follow `runtimes/trainer/errors.py`, so the trainer can
report these the way it reports its own (one JSON line, `failure.json`, the exit code).
"""

from __future__ import annotations

from collections.abc import Sequence


class StorageError(Exception):
    """Reading or writing a model, a dataset or an adapter failed: the job fails."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_mapping(self) -> dict[str, object]:
        return {"kind": type(self).__name__, "message": self.message, "exit_code": self.exit_code}


class AdapterUploadFailedError(StorageError):
    """The adapter is not published: the job fails, and its manifest was never written."""

    def __init__(self, location: str, uploaded: Sequence[str], failed: str, detail: str) -> None:
        super().__init__(
            f"publishing the adapter to {location} failed at {failed} after "
            f"{len(uploaded)} file(s): {detail}; no manifest was written, so the job fails "
            "and no reader sees a partial adapter"
        )
        self.location = location
        self.uploaded = tuple(uploaded)
        self.failed = failed


class StorageInputError(StorageError):
    """The locations or the credentials are wrong: the same job fails again, don't retry."""

    exit_code = 2


class InvalidLocationError(StorageInputError):
    """The URI is malformed, of an unsupported scheme, or carries credentials."""


class NothingAtLocationError(StorageInputError):
    """No file, prefix or bucket at the location, or nothing readable under it."""

    def __init__(self, location: str, detail: str) -> None:
        super().__init__(f"nothing to read at {location}: {detail}")
        self.location = location


class MalformedDatasetError(StorageInputError):
    """A dataset file cannot be used: a bad JSON line, or a Parquet file missing columns."""

    def __init__(self, location: str, reason: str, *, line: int | None = None) -> None:
        where = location if line is None else f"{location}:{line}"
        super().__init__(f"{where}: {reason}")
        self.location = location
        self.line = line
        self.reason = reason

    def to_mapping(self) -> dict[str, object]:
        return {**super().to_mapping(), "location": self.location, "line": self.line}


class CredentialsRefusedError(StorageInputError):
    """The store answered "access denied" (wrong key, wrong secret, or no permission)."""

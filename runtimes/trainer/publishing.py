"""The trainer's way out: its outputs written in `output_dir`, then published to storage.

`training.py` calls `write_outputs` on rank 0 once the adapter is saved, and `publish` when the
config names an `output_uri`. Publishing is the storage layer's (`runtimes.storage.
publish_adapter`: every file, then the manifest, last); what this adds is the trainer's side
of the failure rule in docs/storage.md: `result.json`, whose presence means success to the
local-process backend, names the published location (`adapter_uri`) and is removed again when
the publish fails, so a run whose upload failed never looks like one that succeeded. The
storage error itself reaches `__main__.py`, which exits with its code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runtimes import storage
from runtimes.trainer.progress import Reporter

RESULT = "result.json"
METRICS = "metrics.json"
DATA_CARD = "data_card.json"
FAULT_STORE_GONE_AFTER = "TUNELOOP_FAULT_STORE_GONE_AFTER"
"""Test hook: the store goes away once this many files of the publish are stored, as an S3
server stopped halfway through it would: the publish fails (`AdapterUploadFailedError`,
no manifest) at the next file."""


def write_outputs(output_dir: Path, result: dict[str, Any]) -> None:
    """`metrics.json`, `data_card.json`, then `result.json`, each written whole."""
    _write_json_atomically(output_dir / METRICS, result["metrics"])
    card = {
        "job_name": result["job_name"],
        "base_model": result["base_model"],
        **result["data"],
    }
    _write_json_atomically(output_dir / DATA_CARD, card)
    _write_json_atomically(output_dir / RESULT, result)


def publish(
    output_dir: Path,
    output_uri: str,
    *,
    job: str,
    settings: storage.StorageSettings,
    reporter: Reporter,
    result: dict[str, Any],
) -> storage.AdapterLocation:
    """Publish *output_dir* to `<output_uri>/<job>/`; `result.json` then names it.

    Raises:
        StorageError: the publish failed (`AdapterUploadFailedError`: no manifest was
            written); `result.json` has been removed, so the run counts as failed.
    """
    target = storage.adapter_location(output_uri, job).uri
    # The published result.json says where it lives, so a reader holding only it knows.
    _write_json_atomically(output_dir / RESULT, {**result, "adapter_uri": target})
    reporter.emit("publishing", adapter_uri=target)
    stored: list[str] = []
    gone_after = int(os.environ.get(FAULT_STORE_GONE_AFTER) or 0)

    def uploaded(relative: str) -> None:
        reporter.emit("uploaded", file=relative)
        stored.append(relative)
        if gone_after and len(stored) >= gone_after:
            raise storage.AdapterUploadFailedError(
                target, stored, "the next file", f"{FAULT_STORE_GONE_AFTER}={gone_after}"
            )

    try:
        published = storage.publish_adapter(
            output_dir, output_uri, job, settings, on_uploaded=uploaded
        )
    except storage.StorageError:
        (output_dir / RESULT).unlink(missing_ok=True)
        raise
    reporter.emit(
        "published",
        adapter_uri=published.uri,
        manifest_uri=published.manifest_uri,
        files=len(published.files),
    )
    return published


def _write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    partial.replace(path)

"""The trainer's way in and out through object storage, on the real S3 server (s3proxy).

The tiny model trains from an `s3://` JSON Lines dataset and from an `s3://` prefix of Parquet
parts (its base model fetched from an `s3://` prefix too), and publishes to `s3://`: the
manifest lists every file with the SHA-256 of the bytes the trainer wrote. A server stopped
halfway through the publish fails the run with the storage error, leaves no manifest and
no `result.json`; the command line turns a failed publish into its exit code and a
`failure.json` the backends read.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devservices.object_storage import LocalObjectStorage, ObjectStorageEndpoint
from runtimes.storage import (
    MANIFEST_NAME,
    AdapterUploadFailedError,
    NothingAtLocationError,
    StorageSettings,
    adapter_exists,
    parse_location,
    read_manifest,
)
from runtimes.storage.filesystems import filesystem_for
from runtimes.trainer import training
from runtimes.trainer.config import ProgressMode, TrainerConfig

pytestmark = [pytest.mark.training, pytest.mark.storage]


class RecordingReporter:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, /, **fields: Any) -> None:
        self.events.append((event, fields))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


@pytest.fixture
def s3_environment(
    object_storage: ObjectStorageEndpoint, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The variables a pod's Secret would set; the trainer reads them, never the URIs."""
    variables = {
        "TUNELOOP_S3_ENDPOINT_URL": object_storage.endpoint_url,
        "AWS_REGION": object_storage.region,
        "AWS_ACCESS_KEY_ID": object_storage.access_key_id,
        "AWS_SECRET_ACCESS_KEY": object_storage.secret_access_key,
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return variables


def _put(uri: str, data: bytes, settings: StorageSettings) -> None:
    location = parse_location(uri)
    with filesystem_for(location, settings).open(location.path, "wb") as handle:
        handle.write(data)


def _get(uri: str, settings: StorageSettings) -> bytes:
    location = parse_location(uri)
    data: bytes = filesystem_for(location, settings).cat_file(location.path)
    return data


def _rows(dataset: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]


def _config(model: str, dataset: str, output: Path, **changes: Any) -> TrainerConfig:
    values: dict[str, Any] = {
        "base_model": model,
        "dataset": dataset,
        "output_dir": str(output),
        "max_steps": 4,
        "learning_rate": 3e-3,
        "batch_size": 8,
        "save_steps": 2,
        "cpu_threads": 1,
        "progress": ProgressMode.NONE,
        "base_model_name": "tiny-llama",
    }
    values.update(changes)
    return TrainerConfig(**values)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_tiny_model_trains_on_an_s3_jsonl_dataset_and_is_published_with_a_manifest(
    tiny_model_dir: Path,
    reverse_dataset: Path,
    s3_prefix: str,
    s3_environment: dict[str, str],
    storage_settings: StorageSettings,
    tmp_path: Path,
) -> None:
    dataset = f"{s3_prefix}/datasets/reverse.jsonl"
    _put(dataset, reverse_dataset.read_bytes(), storage_settings)
    output = tmp_path / "work"
    reporter = RecordingReporter()

    result = training.run(
        _config(
            str(tiny_model_dir),
            dataset,
            output,
            output_uri=f"{s3_prefix}/adapters",
            job_name="ft-jsonl",
        ),
        reporter,
    )

    published = f"{s3_prefix}/adapters/ft-jsonl"
    assert result["adapter_uri"] == published
    assert result["data"]["files"] == [dataset]
    assert adapter_exists(published, storage_settings)
    manifest = read_manifest(published, storage_settings)
    paths = [entry.path for entry in manifest.files]
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"} <= set(paths)
    assert {"result.json", "metrics.json", "data_card.json"} <= set(paths)
    assert not [path for path in paths if path.startswith("checkpoints/")], "never published"
    for entry in manifest.files:
        local = (output / entry.path).read_bytes()
        remote = _get(f"{published}/{entry.path}", storage_settings)
        assert entry.sha256 == _sha256(local) == _sha256(remote), entry.path
        assert entry.size == len(local)
    published_result = json.loads(_get(f"{published}/result.json", storage_settings))
    assert published_result["adapter_uri"] == published
    card = json.loads(_get(f"{published}/data_card.json", storage_settings))
    assert card["files"] == [dataset]
    names = reporter.names()
    assert names.index("published") < names.index("completed")
    completed = dict(reporter.events)["completed"]
    assert completed["adapter_uri"] == published


def test_the_tiny_model_trains_on_s3_parquet_parts_from_a_model_on_s3(
    tiny_model_dir: Path,
    reverse_dataset: Path,
    s3_prefix: str,
    s3_environment: dict[str, str],
    storage_settings: StorageSettings,
    tmp_path: Path,
) -> None:
    rows = _rows(reverse_dataset)
    half = len(rows) // 2
    for index, part in enumerate((rows[:half], rows[half:])):
        sink = pa.BufferOutputStream()
        table = pa.table(
            {
                "prompt": [row["prompt"] for row in part],
                "completion": [row["completion"] for row in part],
            }
        )
        pq.write_table(table, sink)
        _put(
            f"{s3_prefix}/datasets/reverse/part-{index}.parquet",
            sink.getvalue().to_pybytes(),
            storage_settings,
        )
    _put(f"{s3_prefix}/datasets/reverse/_SUCCESS", b"", storage_settings)
    for file in sorted(tiny_model_dir.rglob("*")):
        if file.is_file() and not file.name.startswith("."):
            relative = file.relative_to(tiny_model_dir).as_posix()
            _put(f"{s3_prefix}/models/tiny/{relative}", file.read_bytes(), storage_settings)
    output = tmp_path / "work"

    result = training.run(
        _config(
            f"{s3_prefix}/models/tiny",
            f"{s3_prefix}/datasets/reverse/",
            output,
            output_uri=f"{s3_prefix}/adapters",
            job_name="ft-parquet",
        ),
        RecordingReporter(),
    )

    assert result["data"]["files"] == [
        f"{s3_prefix}/datasets/reverse/part-0.parquet",
        f"{s3_prefix}/datasets/reverse/part-1.parquet",
    ]
    assert result["data"]["train_examples"] + result["data"]["eval_examples"] == len(rows)
    assert result["base_model_path"] == str(output / "inputs" / "model")
    assert adapter_exists(f"{s3_prefix}/adapters/ft-parquet", storage_settings)
    manifest = read_manifest(f"{s3_prefix}/adapters/ft-parquet", storage_settings)
    assert not [e.path for e in manifest.files if e.path.startswith("inputs/")], (
        "the fetched base model is an input, never published with the adapter"
    )


def test_a_server_stopped_halfway_through_the_publish_fails_the_run_and_leaves_no_manifest(
    tiny_model_dir: Path,
    reverse_dataset: Path,
    s3_prefix: str,
    s3_environment: dict[str, str],
    storage_settings: StorageSettings,
    local_object_storage: LocalObjectStorage,
    tmp_path: Path,
) -> None:
    output = tmp_path / "work"

    class StopsTheServerAfterTheFirstUpload(RecordingReporter):
        def emit(self, event: str, /, **fields: Any) -> None:
            super().emit(event, **fields)
            if event == "uploaded" and self.names().count("uploaded") == 1:
                local_object_storage.stop()

    reporter = StopsTheServerAfterTheFirstUpload()
    with pytest.raises(AdapterUploadFailedError, match="no manifest was written") as caught:
        training.run(
            _config(
                str(tiny_model_dir),
                str(reverse_dataset),
                output,
                output_uri=f"{s3_prefix}/adapters",
                job_name="ft-halfway",
            ),
            reporter,
        )

    assert len(caught.value.uploaded) == 1, "it failed halfway, after one file"
    assert caught.value.exit_code == 1
    assert "completed" not in reporter.names()
    assert not (output / "result.json").exists(), "a run whose publish failed never succeeded"
    local_object_storage.start()
    assert not adapter_exists(f"{s3_prefix}/adapters/ft-halfway", storage_settings)
    with pytest.raises(NothingAtLocationError):
        read_manifest(f"{s3_prefix}/adapters/ft-halfway", storage_settings)
    fs = filesystem_for(parse_location(s3_prefix), storage_settings)
    manifest = parse_location(f"{s3_prefix}/adapters/ft-halfway").child(MANIFEST_NAME)
    assert not fs.exists(manifest.path)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_the_cli_fails_a_run_whose_publish_fails_with_the_storage_errors_code(
    reverse_dataset: Path, tmp_path: Path
) -> None:
    output = tmp_path / "work"
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TUNELOOP_S3_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}",
        "AWS_ACCESS_KEY_ID": "nobody",
        "AWS_SECRET_ACCESS_KEY": "nothing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtimes.trainer",
            "--base-model",
            "tiny",
            "--dataset",
            str(reverse_dataset),
            "--output-dir",
            str(output),
            "--output-uri",
            "s3://nowhere/adapters",
            "--job-name",
            "ft-unreachable",
            "--max-steps",
            "2",
            "--save-steps",
            "0",
            "--cpu-threads",
            "1",
            "--progress",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=environment,
    )

    assert completed.returncode == 1, completed.stderr[-2000:]
    failure = json.loads(completed.stdout.strip().splitlines()[-1])
    assert failure["event"] == "failed"
    assert failure["kind"] in ("StorageError", "AdapterUploadFailedError")
    assert "s3://nowhere/adapters/ft-unreachable" in failure["message"]
    assert "s3://nowhere/adapters/ft-unreachable" in completed.stderr.strip().splitlines()[-1]
    assert json.loads((output / "failure.json").read_text())["exit_code"] == 1
    assert not (output / "result.json").exists()
    assert '"event": "completed"' not in completed.stdout

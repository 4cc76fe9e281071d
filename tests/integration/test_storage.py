"""The storage layer against a real S3-compatible server (s3proxy) and the local filesystem.

Every behaviour is checked on both stores through the `root` fixture (`s3://bucket/<unique>`
or `file:///tmp/...`); what only one store can do (refused credentials, a server stopped
halfway through an upload) has its own test.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devservices.object_storage import LocalObjectStorage
from runtimes.storage import (
    MANIFEST_NAME,
    AdapterUploadFailedError,
    CredentialsRefusedError,
    MalformedDatasetError,
    NothingAtLocationError,
    StorageSettings,
    adapter_exists,
    dataset_rows,
    fetch_model,
    open_dataset,
    parse_location,
    publish_adapter,
    read_manifest,
)
from runtimes.storage.filesystems import filesystem_for

pytestmark = pytest.mark.storage

Put = Callable[[str, bytes], None]


@pytest.fixture(params=["s3", "file"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return str(request.getfixturevalue("s3_prefix"))
    return (tmp_path / "store").as_uri()


@pytest.fixture
def settings(request: pytest.FixtureRequest, root: str) -> StorageSettings:
    if root.startswith("s3://"):
        settings: StorageSettings = request.getfixturevalue("storage_settings")
        return settings
    return StorageSettings()


@pytest.fixture
def put(root: str, settings: StorageSettings) -> Put:
    """Write test input under *root* (each object in one write, as any producer would)."""

    def write(relative: str, data: bytes) -> None:
        location = parse_location(root).child(relative)
        fs = filesystem_for(location, settings)
        if location.uri.startswith("file://"):
            Path(location.path).parent.mkdir(parents=True, exist_ok=True)
        with fs.open(location.path, "wb") as handle:
            handle.write(data)

    return write


def jsonl(*rows: dict[str, object]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def parquet(columns: dict[str, list[object]]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    return bytes(sink.getvalue().to_pybytes())


def adapter_folder(base: Path, *, files: int = 3, size: int = 4096) -> Path:
    """What the trainer leaves in its output folder, checkpoints included."""
    folder = base / "out"
    (folder / "adapter").mkdir(parents=True)
    for index in range(files):
        (folder / "adapter" / f"part-{index}.bin").write_bytes(bytes([index]) * size)
    (folder / "adapter" / "adapter_config.json").write_text('{"r": 8}\n')
    (folder / "result.json").write_text('{"metrics": {"train_loss": 1.5}}\n')
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (folder / "data_card.md").write_text("# data card\n")
    (folder / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-1" / "optimizer.pt").write_bytes(b"x" * 100)
    return folder


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- datasets ---------------------------------------------------------------------------------


def test_a_jsonl_dataset_is_read_from_one_object(
    root: str, settings: StorageSettings, put: Put
) -> None:
    put("data/train.jsonl", jsonl({"prompt": "a", "completion": "b"}, {"prompt": "c"}))

    records = list(open_dataset(f"{root}/data/train.jsonl", settings))

    assert records == [{"prompt": "a", "completion": "b"}, {"prompt": "c"}]


def test_a_prefix_of_parts_is_read_in_path_order_skipping_markers(
    root: str, settings: StorageSettings, put: Put
) -> None:
    put("data/part-1.jsonl", jsonl({"n": 2}, {"n": 3}))
    put("data/part-0.jsonl", jsonl({"n": 0}, {"n": 1}))
    put("data/_SUCCESS", b"")
    put("data/README.txt", b"not a part")

    records = list(open_dataset(f"{root}/data", settings))

    assert records == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]


def test_each_row_names_its_part_and_line_and_hidden_folders_at_any_depth_are_skipped(
    root: str, settings: StorageSettings, put: Put
) -> None:
    put("rows/b/part-1.jsonl", jsonl({"n": 2}))
    put("rows/a/part-0.jsonl", b'{"n": 0}\n\n{"n": 1}\n')
    put("rows/.cache/huggingface/stale.jsonl", jsonl({"n": -1}))
    put("rows/_temporary/0/part-9.jsonl", jsonl({"n": -2}))
    put("rows/pq/part-2.parquet", parquet({"n": [3, 4]}))

    parts, rows = dataset_rows(f"{root}/rows", settings)

    assert parts == (
        f"{root}/rows/a/part-0.jsonl",
        f"{root}/rows/b/part-1.jsonl",
        f"{root}/rows/pq/part-2.parquet",
    )
    assert [(row.part.rsplit("/", 1)[-1], row.number, row.record["n"]) for row in rows] == [
        ("part-0.jsonl", 1, 0),
        ("part-0.jsonl", 3, 1),
        ("part-1.jsonl", 1, 2),
        ("part-2.parquet", 1, 3),
        ("part-2.parquet", 2, 4),
    ]


def test_a_parquet_dataset_gives_its_rows_as_records(
    root: str, settings: StorageSettings, put: Put
) -> None:
    put("pq/part-0.parquet", parquet({"prompt": ["p1", "p2"], "completion": ["c1", "c2"]}))
    put("pq/part-1.parquet", parquet({"prompt": ["p3"], "completion": ["c3"]}))

    records = list(open_dataset(f"{root}/pq/", settings, required_columns=("prompt",)))

    assert records == [
        {"prompt": "p1", "completion": "c1"},
        {"prompt": "p2", "completion": "c2"},
        {"prompt": "p3", "completion": "c3"},
    ]


def test_a_parquet_file_without_the_needed_columns_is_refused_before_any_record(
    root: str, settings: StorageSettings, put: Put
) -> None:
    put("pq/rows.parquet", parquet({"text": ["t"]}))

    with pytest.raises(MalformedDatasetError, match=r"no column\(s\) prompt, completion"):
        open_dataset(f"{root}/pq/rows.parquet", settings, required_columns=("prompt", "completion"))


def test_a_jsonl_line_that_is_not_an_object_names_its_line(
    root: str, settings: StorageSettings, put: Put
) -> None:
    put("bad.jsonl", jsonl({"n": 1}) + b"[1, 2]\n")

    with pytest.raises(MalformedDatasetError) as caught:
        list(open_dataset(f"{root}/bad.jsonl", settings))

    assert caught.value.line == 2


def test_a_missing_prefix_says_nothing_is_there(root: str, settings: StorageSettings) -> None:
    with pytest.raises(NothingAtLocationError, match="nothing to read"):
        open_dataset(f"{root}/no-such-prefix", settings)


def test_a_prefix_without_parts_lists_what_it_holds(
    root: str, settings: StorageSettings, put: Put
) -> None:
    put("odd/notes.txt", b"hello")

    with pytest.raises(NothingAtLocationError, match=r"notes\.txt"):
        open_dataset(f"{root}/odd", settings)


def test_an_empty_directory_says_nothing_is_there(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()

    with pytest.raises(NothingAtLocationError):
        open_dataset(str(tmp_path / "empty"), StorageSettings())


def test_credentials_the_server_refuses_are_named_as_such(
    s3_prefix: str, storage_settings: StorageSettings
) -> None:
    wrong = StorageSettings(
        endpoint_url=storage_settings.endpoint_url,
        region=storage_settings.region,
        access_key_id=storage_settings.access_key_id,
        secret_access_key="not-the-secret",
        max_attempts=1,
    )

    with pytest.raises(CredentialsRefusedError, match="refused"):
        open_dataset(f"{s3_prefix}/data", wrong)


def test_publishing_with_refused_credentials_is_refused_before_any_upload(
    s3_prefix: str, storage_settings: StorageSettings, tmp_path: Path
) -> None:
    wrong = StorageSettings(
        endpoint_url=storage_settings.endpoint_url,
        region=storage_settings.region,
        access_key_id="not-a-key",
        secret_access_key="not-the-secret",
        max_attempts=1,
    )
    uploaded: list[str] = []

    with pytest.raises(CredentialsRefusedError):
        publish_adapter(
            adapter_folder(tmp_path), s3_prefix, "job-0", wrong, on_uploaded=uploaded.append
        )

    assert uploaded == []


# --- models -------------------------------------------------------------------------------------


def test_a_model_is_fetched_from_a_prefix_with_its_relative_paths(
    s3_prefix: str, storage_settings: StorageSettings, tmp_path: Path
) -> None:
    fs = filesystem_for(parse_location(s3_prefix), storage_settings)
    base = parse_location(s3_prefix).path
    for name, data in {
        "model/config.json": b'{"model_type": "llama"}',
        "model/model.safetensors": b"\0" * 1000,
        "model/tokenizer/vocab.json": b"{}",
    }.items():
        with fs.open(f"{base}/{name}", "wb") as handle:
            handle.write(data)

    got = fetch_model(f"{s3_prefix}/model", storage_settings, into=tmp_path / "model")

    assert got == tmp_path / "model"
    assert (got / "config.json").read_bytes() == b'{"model_type": "llama"}'
    assert (got / "model.safetensors").stat().st_size == 1000
    assert (got / "tokenizer" / "vocab.json").read_bytes() == b"{}"


def test_a_model_fetched_again_into_the_same_directory_is_not_downloaded_again(
    s3_prefix: str, storage_settings: StorageSettings, tmp_path: Path
) -> None:
    location = parse_location(s3_prefix).child("model", "config.json")
    fs = filesystem_for(location, storage_settings)
    with fs.open(location.path, "wb") as handle:
        handle.write(b"{}")
    first = fetch_model(f"{s3_prefix}/model", storage_settings, into=tmp_path / "model")
    fs.rm_file(location.path)  # a second download would now find nothing

    again = fetch_model(f"{s3_prefix}/model", storage_settings, into=tmp_path / "model")

    assert again == first
    assert (again / "config.json").read_bytes() == b"{}"


def test_a_local_model_directory_is_used_where_it_is(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")

    assert (
        fetch_model(str(tmp_path / "m"), StorageSettings(), into=tmp_path / "x") == tmp_path / "m"
    )
    assert not (tmp_path / "x").exists()


def test_a_model_prefix_with_nothing_under_it_is_refused(
    s3_prefix: str, storage_settings: StorageSettings, tmp_path: Path
) -> None:
    with pytest.raises(NothingAtLocationError):
        fetch_model(f"{s3_prefix}/none", storage_settings, into=tmp_path / "model")

    assert not (tmp_path / "model").exists()


# --- adapters -----------------------------------------------------------------------------------


def test_an_adapter_is_published_with_a_manifest_of_every_file_written_last(
    root: str, settings: StorageSettings, tmp_path: Path
) -> None:
    folder = adapter_folder(tmp_path)
    seen_before_the_end: list[bool] = []

    def uploaded(_relative: str) -> None:
        seen_before_the_end.append(adapter_exists(f"{root}/job-1", settings))

    published = publish_adapter(folder, root, "job-1", settings, on_uploaded=uploaded)

    expected = {
        "adapter/adapter_config.json",
        "adapter/part-0.bin",
        "adapter/part-1.bin",
        "adapter/part-2.bin",
        "data_card.md",
        "metrics.jsonl",
        "result.json",
    }
    assert seen_before_the_end == [False] * len(expected)
    assert published.uri == f"{root}/job-1"
    assert adapter_exists(published.uri, settings)
    manifest = read_manifest(published.uri, settings)
    assert {entry.path for entry in manifest.files} == expected
    for entry in manifest.files:
        assert entry.size == (folder / entry.path).stat().st_size
        assert entry.sha256 == sha256(folder / entry.path)


def test_a_folder_published_where_it_already_is_gets_only_its_manifest(tmp_path: Path) -> None:
    folder = adapter_folder(tmp_path)
    config = (folder / "adapter" / "adapter_config.json").read_bytes()

    published = publish_adapter(folder, tmp_path.as_uri(), "out", StorageSettings())

    assert published.uri == f"{tmp_path.as_uri()}/out"
    assert adapter_exists(published.uri, StorageSettings())
    assert (folder / "adapter" / "adapter_config.json").read_bytes() == config, "not truncated"
    entries = {entry.path: entry for entry in published.files}
    assert entries["adapter/adapter_config.json"].sha256 == hashlib.sha256(config).hexdigest()


def test_a_reader_polling_during_the_upload_never_sees_a_manifest_before_all_files(
    root: str, settings: StorageSettings, tmp_path: Path
) -> None:
    folder = adapter_folder(tmp_path, files=8, size=64 * 1024)
    listed = sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and "checkpoints" not in path.parts
    )
    fs = filesystem_for(parse_location(root), settings)
    job = parse_location(root).child("job-2")
    done = threading.Event()
    polls: list[tuple[bool, bool]] = []  # (manifest there, every file there)

    def poll() -> None:
        while not done.is_set():
            manifest_there = fs.exists(job.child(MANIFEST_NAME).path)
            files_there = all(fs.exists(job.child(name).path) for name in listed)
            polls.append((manifest_there, files_there))
            time.sleep(0.01)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        publish_adapter(folder, root, "job-2", settings, on_uploaded=lambda _path: time.sleep(0.05))
    finally:
        done.set()
        reader.join()

    assert len(polls) >= 5
    assert [poll for poll in polls if poll[0] and not poll[1]] == []
    assert adapter_exists(job.uri, settings)


def test_adapter_exists_is_false_when_a_listed_file_is_gone(
    root: str, settings: StorageSettings, tmp_path: Path
) -> None:
    published = publish_adapter(adapter_folder(tmp_path), root, "job-3", settings)
    fs = filesystem_for(parse_location(root), settings)

    fs.rm_file(parse_location(published.uri).child("result.json").path)

    assert not adapter_exists(published.uri, settings)


def test_an_upload_that_fails_halfway_fails_the_job_and_leaves_no_manifest(
    root: str, settings: StorageSettings, tmp_path: Path
) -> None:
    folder = adapter_folder(tmp_path)

    def source_vanishes(_relative: str) -> None:
        (folder / "metrics.jsonl").unlink(missing_ok=True)

    with pytest.raises(AdapterUploadFailedError, match="no manifest was written") as caught:
        publish_adapter(folder, root, "job-4", settings, on_uploaded=source_vanishes)

    assert caught.value.failed == "metrics.jsonl"
    assert not adapter_exists(f"{root}/job-4", settings)
    fs = filesystem_for(parse_location(root), settings)
    assert not fs.exists(parse_location(root).child("job-4", MANIFEST_NAME).path)


def test_a_server_stopped_mid_upload_fails_the_job_and_no_manifest_appears_after_it_is_back(
    local_object_storage: LocalObjectStorage,
    s3_prefix: str,
    storage_settings: StorageSettings,
    tmp_path: Path,
) -> None:
    folder = adapter_folder(tmp_path)
    impatient = StorageSettings(
        endpoint_url=storage_settings.endpoint_url,
        region=storage_settings.region,
        access_key_id=storage_settings.access_key_id,
        secret_access_key=storage_settings.secret_access_key,
        connect_timeout=1.0,
        request_timeout=5.0,
        max_attempts=1,
    )
    uploaded: list[str] = []

    def stop_after_the_first_file(relative: str) -> None:
        uploaded.append(relative)
        if len(uploaded) == 1:
            local_object_storage.stop()

    with pytest.raises(AdapterUploadFailedError) as caught:
        publish_adapter(
            folder, s3_prefix, "job-5", impatient, on_uploaded=stop_after_the_first_file
        )

    assert caught.value.uploaded == ("adapter/adapter_config.json",)
    local_object_storage.start()
    assert not adapter_exists(f"{s3_prefix}/job-5", storage_settings)
    with pytest.raises(NothingAtLocationError):
        read_manifest(f"{s3_prefix}/job-5", storage_settings)


def test_publishing_a_job_again_replaces_its_manifest(
    root: str, settings: StorageSettings, tmp_path: Path
) -> None:
    folder = adapter_folder(tmp_path)
    publish_adapter(folder, root, "job-6", settings)
    (folder / "result.json").write_text('{"metrics": {"train_loss": 0.5}}\n')

    publish_adapter(folder, root, "job-6", settings)

    entries = {entry.path: entry for entry in read_manifest(f"{root}/job-6", settings).files}
    assert entries["result.json"].sha256 == sha256(folder / "result.json")

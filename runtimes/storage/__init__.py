"""One storage layer for models, datasets and adapters, on fsspec (docs/storage.md).

    open_dataset(uri, settings)                    records of a JSONL or Parquet file or prefix
    fetch_model(uri, settings, into=dir)           a local directory holding the model
    publish_adapter(dir, output_uri, job, settings) files first, manifest.json last
    adapter_exists(uri, settings)                  the manifest and every file it lists exist

Locations are `file://` or plain paths, `s3://` on any S3-compatible endpoint, and `hf://`
where the network allows it; `StorageSettings.from_env()` reads the endpoint, region and
credentials from the standard variables, never from rule files.
"""

from runtimes.storage.datasets import DatasetRow, dataset_rows, open_dataset
from runtimes.storage.errors import (
    AdapterUploadFailedError,
    CredentialsRefusedError,
    InvalidLocationError,
    MalformedDatasetError,
    NothingAtLocationError,
    StorageError,
    StorageInputError,
)
from runtimes.storage.locations import Location, Scheme, parse_location
from runtimes.storage.manifest import MANIFEST_NAME, Manifest, ManifestEntry
from runtimes.storage.models import fetch_model
from runtimes.storage.publishing import (
    AdapterLocation,
    adapter_exists,
    adapter_location,
    publish_adapter,
    read_manifest,
)
from runtimes.storage.settings import StorageSettings

__all__ = [
    "MANIFEST_NAME",
    "AdapterLocation",
    "AdapterUploadFailedError",
    "CredentialsRefusedError",
    "DatasetRow",
    "InvalidLocationError",
    "Location",
    "MalformedDatasetError",
    "Manifest",
    "ManifestEntry",
    "NothingAtLocationError",
    "Scheme",
    "StorageError",
    "StorageInputError",
    "StorageSettings",
    "adapter_exists",
    "adapter_location",
    "dataset_rows",
    "fetch_model",
    "open_dataset",
    "parse_location",
    "publish_adapter",
    "read_manifest",
]

"""What the Kubernetes end-to-end tests share about object storage.

- `create_storage_secret(api, namespace, endpoint)`: the Secret that gives TrainJob pods the
  store's endpoint, region and key pair, as `TUNELOOP_KUBERNETES_STORAGE_SECRET` names it in a
  deployment (the TrainJob carries `secretKeyRef`s to it, never the values);
- `ArrowStore(endpoint)`: a client of the same server that is not tuneloop's storage layer
  (pyarrow's S3 filesystem, on the AWS C++ SDK rather than s3fs/botocore), so what a test
  puts there and reads back does not depend on the code under test: `put`, `get` (None when
  absent), `files` (the keys under a prefix, relative to it) and `manifest` (the adapter
  folder's manifest.json, parsed here, or None).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from devservices.object_storage import ObjectStorageEndpoint

STORAGE_SECRET = "tuneloop-storage"
"""The Secret's name in the test namespace (the backend's `storage_secret`)."""
MANIFEST = "manifest.json"
"""Where the storage contract (docs/storage.md) says a published adapter's manifest is."""


def create_storage_secret(
    api: client.ApiClient, namespace: str, endpoint: ObjectStorageEndpoint
) -> str:
    """The storage Secret in *namespace*, with the keys docs/storage.md lists; its name."""
    client.CoreV1Api(api).create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": STORAGE_SECRET},
            "stringData": {
                "TUNELOOP_S3_ENDPOINT_URL": endpoint.endpoint_url,
                "AWS_REGION": endpoint.region,
                "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
                "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
            },
        },
    )
    return STORAGE_SECRET


class ArrowStore:
    """The S3 server as pyarrow sees it; URIs are `s3://bucket/key`."""

    def __init__(self, endpoint: ObjectStorageEndpoint) -> None:
        from pyarrow import fs as arrow_fs

        self._s3 = arrow_fs.S3FileSystem(
            access_key=endpoint.access_key_id,
            secret_key=endpoint.secret_access_key,
            region=endpoint.region,
            endpoint_override=endpoint.endpoint_url,
        )

    @staticmethod
    def _path(uri: str) -> str:
        if not uri.startswith("s3://"):
            raise ValueError(f"not an s3:// URI: {uri}")
        return uri.removeprefix("s3://").rstrip("/")

    def put(self, uri: str, data: bytes) -> None:
        with self._s3.open_output_stream(self._path(uri)) as out:
            out.write(data)

    def get(self, uri: str) -> bytes | None:
        from pyarrow import fs as arrow_fs

        path = self._path(uri)
        if self._s3.get_file_info(path).type != arrow_fs.FileType.File:
            return None
        with self._s3.open_input_stream(path) as stream:
            return bytes(stream.read())

    def files(self, prefix: str) -> list[str]:
        """Every object under *prefix*, as paths relative to it, sorted."""
        from pyarrow import fs as arrow_fs

        path = self._path(prefix)
        selector = arrow_fs.FileSelector(path, recursive=True, allow_not_found=True)
        return sorted(
            info.path.removeprefix(f"{path}/")
            for info in self._s3.get_file_info(selector)
            if info.type == arrow_fs.FileType.File
        )

    def manifest(self, adapter_uri: str) -> dict[str, Any] | None:
        """The manifest of the adapter folder *adapter_uri*, or None where there is none."""
        data = self.get(f"{adapter_uri.rstrip('/')}/{MANIFEST}")
        return None if data is None else dict(json.loads(data))

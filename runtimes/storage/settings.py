"""Where the object store is and who we are to it: from the environment, never from rule files.

The standard AWS variable names work, so a Kubernetes Secret mounted with `envFrom` (or a
`valueFrom.secretKeyRef` per key) configures a TrainJob's pod the way it would configure any
AWS SDK; docs/storage.md shows the manifest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from runtimes.storage.errors import InvalidLocationError

ENDPOINT_VARIABLES = ("TUNELOOP_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Tried in order: tuneloop's own name first, then the AWS SDKs' service-specific and global
endpoint variables, so an environment already set up for the AWS CLI needs nothing more."""

REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """How to reach `s3://` locations. Local paths and `hf://` need none of it."""

    endpoint_url: str | None = None
    """An S3-compatible endpoint such as `http://127.0.0.1:9000` (default: AWS itself, chosen
    by the region). Set it for s3proxy, SeaweedFS, Ceph or any other S3-compatible store."""

    region: str = "us-east-1"
    """The region requests are signed for (default us-east-1, what most S3-compatible servers
    accept whatever their location)."""

    access_key_id: str | None = field(default=None, repr=False)
    """With `secret_access_key`: static credentials. Both unset: the SDK's own chain (web
    identity, instance profile) decides, which is what IRSA and workload identity need."""

    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    """Only for temporary credentials (STS)."""

    connect_timeout: float = 5.0
    """Seconds to open a connection (default 5): a store that is down fails the job in
    seconds instead of hanging a pod."""

    request_timeout: float = 60.0
    """Seconds one request may take (default 60), long enough for a part of a large model."""

    max_attempts: int = 3
    """Attempts per request, the first included (default 3): a blip is retried, an outage
    fails the job quickly."""

    def __post_init__(self) -> None:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise InvalidLocationError(
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together "
                "(or both left unset for the SDK's own credential chain)"
            )
        if self.max_attempts < 1:
            raise InvalidLocationError(f"max_attempts must be at least 1, not {self.max_attempts}")

    @property
    def has_static_credentials(self) -> bool:
        return self.access_key_id is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StorageSettings:
        """Read the settings from *environ* (default `os.environ`); empty values count as unset.

        Raises:
            InvalidLocationError: only one of the key id and the secret is set.
        """
        env = os.environ if environ is None else environ

        def first(*names: str) -> str | None:
            for name in names:
                value = env.get(name, "").strip()
                if value:
                    return value
            return None

        return cls(
            endpoint_url=first(*ENDPOINT_VARIABLES),
            region=first(*REGION_VARIABLES) or "us-east-1",
            access_key_id=first("AWS_ACCESS_KEY_ID"),
            secret_access_key=first("AWS_SECRET_ACCESS_KEY"),
            session_token=first("AWS_SESSION_TOKEN"),
        )

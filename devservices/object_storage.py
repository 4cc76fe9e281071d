"""A real S3-compatible server on 127.0.0.1: s3proxy, one jar Maven resolves, no Docker.

Who calls it:
- `python -m devservices prepare` (`make services`) calls `prepare()` once, so that the jar is
  in the cache before the tests need it;
- `tests/fixtures/object_storage.py` calls `object_storage_for_tests()`, which uses the
  endpoint `TUNELOOP_S3_ENDPOINT_URL` names or starts a `LocalObjectStorage`;
- the storage fault tests drive the `LocalObjectStorage` itself (`stop`, `start`).

Why s3proxy (Apache-2.0) and not SeaweedFS: the released `jar-with-dependencies` is one
~55 MB download that Maven resolved cold in 17 s here (2 cores, Maven's plugins already
cached), and the JVM serves requests about 2 s after it starts; SeaweedFS would be a Go build
of its whole module graph, minutes on two cores. Not moto (an in-process mock) and not MinIO
(AGPL). Its jclouds `filesystem-nio2` backend keeps each bucket as a folder under the work
directory, so a stopped server starts again with the same objects.

Environment:
    TUNELOOP_CACHE              the cache root (default ~/.cache/tuneloop)
    S3PROXY_VERSION             the s3proxy release to run (default 4.1.0; 4.x needs Java 17)
    TUNELOOP_S3_ENDPOINT_URL    use this S3-compatible endpoint instead of starting one; its
                                credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from devservices.kafka import cache_root, free_ports
from devservices.processes import (
    LoopbackServer,
    serve_until_interrupted,
)
from orchestrator.errors import ConfigError

DEFAULT_S3PROXY_VERSION = "4.1.0"
"""Checked 2026-12 on Maven Central (org.gaul:s3proxy, classifier jar-with-dependencies)."""

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
POM_PATH = Path(__file__).resolve().parents[1] / "deploy" / "local" / "object-storage" / "pom.xml"
LOCAL_IDENTITY = "tuneloop-local"
LOCAL_CREDENTIAL = "tuneloop-local-secret"
"""The only key pair the local server accepts: test-only values for a loopback server."""
LOCAL_REGION = "us-east-1"


class ObjectStorageUnavailableError(ConfigError):
    """No S3 server can be had here (no java or mvn, the jar unresolvable): tests skip, CI fails."""


class ObjectStorageStartError(RuntimeError):
    """The server exited or did not answer in time; the message carries its log tail."""


def _say(message: str) -> None:
    print(f"[tuneloop s3] {message}", file=sys.stderr, flush=True)


def _require_tool(name: str, purpose: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ObjectStorageUnavailableError(f"`{name}` is not on PATH; it is needed to {purpose}")
    return found


def s3proxy_version() -> str:
    return os.environ.get("S3PROXY_VERSION", "").strip() or DEFAULT_S3PROXY_VERSION


def prepared_jar(version: str, *, cache: Path | None = None) -> Path | None:
    """The server's jar for *version* if a resolution completed, else None."""
    jar = (cache or cache_root()) / f"s3proxy-{version}" / f"s3proxy-{version}.jar"
    return jar if jar.is_file() else None


def prepare_s3proxy(version: str | None = None, *, timeout: float = 600.0) -> Path:
    """Make sure s3proxy's jar is in the cache; return it. Idempotent, safe in parallel.

    Raises:
        ObjectStorageUnavailableError: mvn is missing, or the jar does not resolve.
    """
    version = version or s3proxy_version()
    cache = cache_root()
    home = cache / f"s3proxy-{version}"
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = prepared_jar(version, cache=cache)
        if ready is not None:
            return ready
        mvn = _require_tool("mvn", "resolve s3proxy from Maven Central")
        scratch = home / f"libs.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(POM_PATH),
            f"-Ds3proxy.version={version}",
            f"-Dmaven.repo.local={cache / 'm2'}",
            f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={scratch}",
        ]
        _say(f"resolving s3proxy {version} with Maven into {home} (~55 MB the first time)")
        started = time.monotonic()
        try:
            result = subprocess.run(
                command, capture_output=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
            )
            (home / "maven.log").write_bytes(result.stdout + result.stderr)
            jars = list(scratch.glob("s3proxy-*.jar"))
            if result.returncode != 0 or len(jars) != 1:
                raise ObjectStorageUnavailableError(
                    f"Maven could not resolve s3proxy {version} (exit {result.returncode}); "
                    f"log {home / 'maven.log'}:\n"
                    + (result.stdout + result.stderr).decode(errors="replace")[-3000:]
                )
            target = home / f"s3proxy-{version}.jar"
            jars[0].replace(target)
        except subprocess.TimeoutExpired as exc:
            raise ObjectStorageUnavailableError(
                f"Maven took more than {timeout:.0f} s to resolve s3proxy {version}"
            ) from exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _say(f"s3proxy {version} resolved in {time.monotonic() - started:.1f} s")
        return target


def prepare() -> None:
    """`python -m devservices prepare object-storage`: resolve s3proxy, start it once."""
    jar = prepare_s3proxy()
    work_dir = Path(tempfile.mkdtemp(prefix="tuneloop-s3-"))
    try:
        with LocalObjectStorage(jar=jar, work_dir=work_dir) as server:
            _say(f"s3proxy answered on {server.endpoint_url} in {server.last_start_seconds:.1f} s")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME", "").strip()
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return _require_tool("java", "run the local S3 server (OpenJDK 17 or newer)")


class LocalObjectStorage(LoopbackServer):
    """One s3proxy process on 127.0.0.1, its buckets folders under `work_dir/data`.

    `stop()` then `start()` keeps the port and the objects: that is how the tests make an
    upload fail halfway for real.
    """

    def __init__(
        self,
        *,
        jar: Path,
        work_dir: Path,
        port: int | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 15.0,
    ) -> None:
        super().__init__(
            "s3proxy",
            work_dir=work_dir,
            log_name="s3proxy.log",
            port=port or free_ports(1)[0],
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
        )
        self.jar = jar

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    def create_bucket(self, name: str) -> None:
        """A bucket of the filesystem backend is a folder; this works stopped or running."""
        (self.data_dir / name).mkdir(parents=True, exist_ok=True)

    def start(self) -> Self:
        """Start the server and return once it answers HTTP.

        Raises:
            ObjectStorageStartError: it exited or did not answer within `start_timeout`.
        """
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        properties = self.work_dir / "s3proxy.properties"
        properties.write_text(
            "\n".join(
                (
                    f"s3proxy.endpoint={self.endpoint_url}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={LOCAL_IDENTITY}",
                    f"s3proxy.credential={LOCAL_CREDENTIAL}",
                    "jclouds.provider=filesystem-nio2",
                    f"jclouds.filesystem.basedir={self.data_dir}",
                    "",
                )
            )
        )
        return self._launch_and_await(
            server_command(java=_java_executable(), jar=self.jar, properties=properties),
            ready=lambda: answers_http(self.endpoint_url),
            awaited=f"answer on {self.endpoint_url}",
            poll_seconds=0.2,
            error=ObjectStorageStartError,
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalObjectStorage({self.endpoint_url}, {state}, {self.work_dir})"


def server_command(*, java: str, jar: Path, properties: Path) -> list[str]:
    """The command line of the s3proxy JVM."""
    return [
        java,
        "-Xmx256m",
        # C1 only, as for the Kafka broker: a test server never runs long enough to profit
        # from C2, whose compile threads would compete for the same two cores.
        "-XX:TieredStopAtLevel=1",
        "-Djava.awt.headless=true",
        "-jar",
        str(jar),
        "--properties",
        str(properties),
    ]


def answers_http(url: str, *, timeout: float = 2.0) -> bool:
    """True when anything HTTP answers at *url*; s3proxy answers an unsigned GET with 403."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):  # noqa: S310 - our own loopback URL
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


# --- choosing a server for a test run -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectStorageEndpoint:
    """The S3 endpoint a test run uses, its credentials, and the server if it is ours."""

    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    region: str
    server: LocalObjectStorage | None = None


@contextlib.contextmanager
def object_storage_for_tests(work_dir: Path) -> Iterator[ObjectStorageEndpoint]:
    """An S3 endpoint for a test session: `TUNELOOP_S3_ENDPOINT_URL` (with the AWS_* key
    pair, left running on exit) or a local s3proxy, resolved first if needed and stopped on
    exit.

    Raises:
        ObjectStorageUnavailableError: no java or mvn, or the jar does not resolve; or an
            external endpoint without credentials.
        ObjectStorageStartError: the local server started but failed.
    """
    external = os.environ.get("TUNELOOP_S3_ENDPOINT_URL", "").strip()
    if external:
        key = os.environ.get("AWS_ACCESS_KEY_ID", "").strip()
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "").strip()
        if not key or not secret:
            raise ObjectStorageUnavailableError(
                f"TUNELOOP_S3_ENDPOINT_URL={external} needs AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY for the tests' bucket"
            )
        region = os.environ.get("AWS_REGION", "").strip() or LOCAL_REGION
        yield ObjectStorageEndpoint(external, key, secret, region)
        return
    server = LocalObjectStorage(jar=prepare_s3proxy(), work_dir=work_dir)
    with server:
        yield ObjectStorageEndpoint(
            server.endpoint_url, LOCAL_IDENTITY, LOCAL_CREDENTIAL, LOCAL_REGION, server
        )


def main(argv: Sequence[str]) -> int:
    """`python -m devservices.object_storage prepare|run`: `run` serves until Ctrl-C."""
    if list(argv) == ["prepare"]:
        prepare()
        return 0
    if list(argv) != ["run"]:
        print("usage: python -m devservices.object_storage prepare|run", file=sys.stderr)
        return 2

    def announce(server: LocalObjectStorage) -> None:
        print(f"export TUNELOOP_S3_ENDPOINT_URL={server.endpoint_url}", flush=True)
        print(f"export AWS_ACCESS_KEY_ID={LOCAL_IDENTITY}", flush=True)
        print(f"export AWS_SECRET_ACCESS_KEY={LOCAL_CREDENTIAL}", flush=True)

    return serve_until_interrupted(
        lambda work_dir: LocalObjectStorage(jar=prepare_s3proxy(), work_dir=work_dir),
        work_dir_prefix="tuneloop-s3-",
        announce=announce,
        say=_say,
        what="s3proxy",
    )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

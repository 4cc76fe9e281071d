"""A real Apache Kafka broker on 127.0.0.1, from jars Maven resolves: no Docker, no tarball.

Who calls it:
- `python -m devservices prepare` (`make services`) calls `prepare()` once, so
  that the jars are in the cache before the tests or the demo need them;
- `tests/fixtures/kafka.py`, the demo (`handlers/demo.py`) and `bench/` call
  `kafka_for_tests()`, which picks an external cluster, a testcontainers broker or a
  `LocalKafka`, in that order;
- fault suites drive the `LocalKafka` itself (`stop`, `kill`, `restart`) through the
  `kafka_broker` fixture.

The broker is a single-node KRaft cluster in combined mode (broker and controller in one JVM),
with every replication factor at 1 and the internal topics at one partition, so that the first
consumer group join and the first transactional producer are quick. Everything it needs lives
under `~/.cache/tuneloop` (`TUNELOOP_CACHE` overrides): the Maven repository in `m2/`, the
broker's classpath in `kafka-<version>/libs/`, and a JVM class-data archive beside it that
halves the start time. Verified with Kafka 3.9.2 (the default) and 4.4.0 on OpenJDK 17.

Environment:
    TUNELOOP_CACHE              the cache root (default ~/.cache/tuneloop)
    KAFKA_VERSION               the Apache Kafka release to run (default 3.9.2, then 3.9.1)
    TUNELOOP_KAFKA_BOOTSTRAP    use this cluster ("host:port[,host:port]") instead of starting one
    TUNELOOP_KAFKA_DOCKER       "0" skips the testcontainers leg even when Docker answers
    CI                          set: a missing broker is an error, never a skip
"""

from __future__ import annotations

import base64
import contextlib
import enum
import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from devservices.processes import LocalServer, ServiceProcess, serve_until_interrupted
from orchestrator.errors import ConfigError

DEFAULT_KAFKA_VERSIONS = ("3.9.2", "3.9.1")
"""Tried in order when KAFKA_VERSION is unset: 3.9.2 resolves from Maven Central (checked
2026-12); 3.9.1 is the fallback for a mirror that lags. 3.9 accepts every old protocol
version, which keeps the aiokafka code paths faust uses on their well-trodden side."""

MINIMUM_KAFKA_VERSION = (3, 5)
"""KRaft without ZooKeeper is production-ready from 3.5; older releases are refused."""

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
POM_PATH = Path(__file__).resolve().parents[1] / "deploy" / "local" / "kafka" / "pom.xml"
CONTAINER_IMAGE = "confluentinc/cp-kafka:7.9.0"
"""Kafka 3.9 in Confluent's image, which testcontainers' KafkaContainer drives (KRaft mode)."""
STARTED_MESSAGE = b"Kafka Server started"
"""`KafkaBroker.STARTED_MESSAGE` in 3.9 and 4.x; testcontainers waits on the same line."""

_VERSION_PATTERN = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_COMPLETE_MARKER = "libs.complete"


class KafkaUnavailableError(ConfigError):
    """No broker can be had here (no java or mvn, jars unresolvable): tests skip, CI fails."""


class BrokerStartError(RuntimeError):
    """The broker process exited or did not become ready; the message carries its log tail."""


class BrokerKind(enum.Enum):
    """Where the Kafka that a test run talks to comes from."""

    EXTERNAL = "external"
    CONTAINER = "container"
    LOCAL = "local"


# --- versions and paths -----------------------------------------------------------------


def parse_kafka_version(text: str) -> tuple[int, int, int]:
    """`"3.9.2"` -> `(3, 9, 2)`.

    Raises:
        ConfigError: *text* is not a release number, or is older than KRaft-only support.
    """
    match = _VERSION_PATTERN.match(text.strip())
    if match is None:
        raise ConfigError(
            f"KAFKA_VERSION={text!r} is not an Apache Kafka release number like 3.9.2 or 4.1.0"
        )
    major, minor, patch = (int(part) for part in match.groups())
    if (major, minor) < MINIMUM_KAFKA_VERSION:
        raise ConfigError(
            f"Kafka {text} is too old for tuneloop's local broker: it runs KRaft without "
            f"ZooKeeper, which needs {'.'.join(map(str, MINIMUM_KAFKA_VERSION))} or newer"
        )
    return major, minor, patch


def candidate_versions(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The Kafka releases to try, best first: `KAFKA_VERSION` alone if set, else the defaults.

    Raises:
        ConfigError: KAFKA_VERSION is set to something that is not a usable release.
    """
    env = os.environ if environ is None else environ
    chosen = env.get("KAFKA_VERSION", "").strip()
    if chosen:
        parse_kafka_version(chosen)
        return (chosen,)
    return DEFAULT_KAFKA_VERSIONS


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """`TUNELOOP_CACHE`, else `~/.cache/tuneloop`: every download and build goes below it."""
    env = os.environ if environ is None else environ
    configured = env.get("TUNELOOP_CACHE", "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tuneloop"


def kafka_home(version: str, *, cache: Path | None = None) -> Path:
    """`<cache>/kafka-<version>`: the classpath (`libs/`), its marker and the Maven log."""
    return (cache or cache_root()) / f"kafka-{version}"


def prepared_libs(version: str, *, cache: Path | None = None) -> Path | None:
    """The broker's classpath folder for *version* if a resolution completed, else None."""
    home = kafka_home(version, cache=cache)
    libs = home / "libs"
    if (home / _COMPLETE_MARKER).is_file() and any(libs.glob("kafka_2.13-*.jar")):
        return libs
    return None


# --- resolving the jars ---------------------------------------------------------------------


def _require_tool(name: str, purpose: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise KafkaUnavailableError(f"`{name}` is not on PATH; it is needed to {purpose}")
    return found


def _java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME", "").strip()
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return _require_tool("java", "run the local Kafka broker (OpenJDK 17 or newer)")


def _folder_megabytes(folder: Path) -> float:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total / 1_000_000


def _say(message: str) -> None:
    print(f"[tuneloop kafka] {message}", file=sys.stderr, flush=True)


def _resolve_with_maven(version: str, home: Path, *, cache: Path, timeout: float) -> Path:
    """Run Maven's copy-dependencies into a scratch folder, then move it into place."""
    mvn = _require_tool("mvn", "resolve the Kafka broker's jars from Maven Central")
    if not POM_PATH.is_file():
        raise KafkaUnavailableError(f"{POM_PATH} is missing; it lists the broker's jars")
    m2 = cache / "m2"
    # The caller holds the version's lock, so any scratch folder here is an interrupted run's.
    for stale in home.glob("libs.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    scratch = home / f"libs.partial-{os.getpid()}"
    maven_log = home / "maven.log"
    command = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(POM_PATH),
        f"-Dkafka.version={version}",
        f"-Dmaven.repo.local={m2}",
        f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={scratch}",
    ]
    _say(
        f"resolving Apache Kafka {version} with Maven into {home} (the first run downloads ~50 MB)"
    )
    started = time.monotonic()
    with maven_log.open("wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            # Maven runs quiet; a line every few seconds shows that the download moves.
            while True:
                try:
                    process.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > timeout:
                        raise KafkaUnavailableError(
                            f"Maven did not resolve Kafka {version} within {timeout:.0f} s; "
                            f"see {maven_log}"
                        ) from None
                    size = _folder_megabytes(m2) if m2.exists() else 0.0
                    _say(f"  ... {elapsed:4.0f} s, Maven repository at {size:.0f} MB")
        except BaseException:
            process.kill()
            process.wait()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    if process.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        tail = "\n".join(maven_log.read_text(errors="replace").splitlines()[-20:])
        raise KafkaUnavailableError(
            f"Maven could not resolve org.apache.kafka:kafka_2.13:{version} "
            f"(exit {process.returncode}); full log in {maven_log}:\n{tail}"
        )
    if not any(scratch.glob("kafka_2.13-*.jar")):
        shutil.rmtree(scratch, ignore_errors=True)
        raise KafkaUnavailableError(f"Maven finished but no kafka_2.13 jar is in {scratch}")
    libs = home / "libs"
    shutil.rmtree(libs, ignore_errors=True)
    scratch.rename(libs)
    jars = sorted(path.name for path in libs.glob("*.jar"))
    # The marker is written last: a folder without it is never trusted.
    (home / _COMPLETE_MARKER).write_text("\n".join(jars) + "\n")
    _say(
        f"Apache Kafka {version}: {len(jars)} jars, {_folder_megabytes(libs):.0f} MB "
        f"in {time.monotonic() - started:.0f} s"
    )
    return libs


def prepare_kafka(version: str | None = None, *, timeout: float = 900.0) -> Path:
    """Make sure the broker's classpath for *version* is in the cache; return its folder.

    Idempotent and safe to run from several processes at once (a file lock per version).
    With no *version*, `KAFKA_VERSION` decides; unset, 3.9.2 is tried, then 3.9.1.

    Raises:
        ConfigError: the version is malformed or too old.
        KafkaUnavailableError: mvn is missing, or no candidate version resolves.
    """
    versions = (version,) if version else candidate_versions()
    for candidate in versions:
        parse_kafka_version(candidate)
    cache = cache_root()
    failures: list[str] = []
    for candidate in versions:
        home = kafka_home(candidate, cache=cache)
        home.mkdir(parents=True, exist_ok=True)
        with (home / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            libs = prepared_libs(candidate, cache=cache)
            if libs is not None:
                return libs
            (home / _COMPLETE_MARKER).unlink(missing_ok=True)
            try:
                return _resolve_with_maven(candidate, home, cache=cache, timeout=timeout)
            except KafkaUnavailableError as exc:
                failures.append(str(exc))
                if candidate != versions[-1]:
                    _say(f"Kafka {candidate} did not resolve; trying the next version")
    raise KafkaUnavailableError("\n\n".join(failures))


def prepare() -> None:
    """`python -m devservices prepare`: resolve the broker's jars into the cache."""
    libs = prepare_kafka()
    broker = LocalKafka(libs=libs, work_dir=Path(tempfile.mkdtemp(prefix="tuneloop-kafka-")))
    if not broker.class_archive_path.is_file():
        # One start proves that the jars make a working broker on this JVM, and its stop
        # records the class-data archive that makes every later start about twice as fast.
        _say(f"starting Kafka {broker.version} once to check it ({broker.work_dir})")
        try:
            with broker:
                pass
        finally:
            shutil.rmtree(broker.work_dir, ignore_errors=True)
        _say(f"the broker started in {broker.last_start_seconds or 0:.1f} s and stopped cleanly")
    else:
        broker.work_dir.rmdir()
    _say(f"ready: {libs}")


# --- the broker ----------------------------------------------------------------------------


def render_server_properties(
    *,
    version: str,
    port: int,
    controller_port: int,
    data_dir: Path,
    overrides: Mapping[str, str] | None = None,
) -> str:
    """The `server.properties` of a one-node KRaft cluster on 127.0.0.1.

    Static quorum (`controller.quorum.voters`) works unchanged on 3.9 and 4.x and needs no
    `--standalone` at format time. *overrides* replace a key in place or are appended, so
    every key appears once (a fault suite may shorten `broker.session.timeout.ms`, say).
    """
    major, _, _ = parse_kafka_version(version)
    lines = [
        "# written by tuneloop (devservices/kafka.py); one node, loopback only",
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name=PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={data_dir}",
        "num.partitions=1",
        "default.replication.factor=1",
        "min.insync.replicas=1",
        "auto.create.topics.enable=true",
        "# one partition each: the defaults (50) make the first group join and the first",
        "# InitProducerId take seconds on two cores",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=1",
        "# tests join fresh groups all the time; waiting for more members only slows them",
        "group.initial.rebalance.delay.ms=0",
        "num.network.threads=2",
        "num.io.threads=2",
        "# after a crash the controller refuses the restarted broker until the dead one's",
        "# session expires: 6 s instead of 9, still six missed heartbeats from a false fence",
        "broker.heartbeat.interval.ms=1000",
        "broker.session.timeout.ms=6000",
    ]
    if major >= 4:
        # 3.9 logs "isn't a known config" for these, so they are written for 4.x only.
        lines += [
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
        ]
    pending = dict(overrides or {})
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0]
        if not line.startswith("#") and key in pending:
            lines[index] = f"{key}={pending.pop(key)}"
    if pending:
        lines.append("# overrides")
        lines += [f"{key}={value}" for key, value in pending.items()]
    return "\n".join(lines) + "\n"


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # Kafka's own Uuid.randomUuid() rejects ids that start with "-": CLIs read them as flags.
        if not cluster_id.startswith("-"):
            return cluster_id


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_ports(count: int, *, attempts: int = 200) -> tuple[int, ...]:
    """*count* distinct free TCP ports on 127.0.0.1, below the kernel's ephemeral range.

    A port from the ephemeral range could be taken as the source port of some client's
    outgoing connection while the broker is down for a restart, and the broker could then
    not listen on it again. Below that range only listeners take ports.
    """
    low, _ = _ephemeral_port_range()
    pool_start = 10_000 if low > 11_000 else 1_024
    chooser = random.SystemRandom()
    sockets: list[socket.socket] = []
    try:
        for _ in range(attempts):
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", chooser.randrange(pool_start, low)))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        while len(sockets) < count:  # a crowded range: let the kernel pick
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return tuple(sock.getsockname()[1] for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


class LocalKafka(LocalServer):
    """A single-node KRaft Kafka broker on 127.0.0.1 with ports picked once, kept across restarts.

    ```python
    with LocalKafka(libs=prepare_kafka(), work_dir=tmp) as kafka:
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
        kafka.restart()        # same data, same ports: clients reconnect on their own
    ```

    The JVM runs in its own session, so `stop()` and `kill()` reach its whole process tree.
    Everything it writes (properties, data, `broker.log`) is under *work_dir*.
    """

    def __init__(
        self,
        *,
        libs: Path,
        work_dir: Path,
        version: str | None = None,
        heap: str = "512m",
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        use_class_archive: bool = True,
        overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.libs = Path(libs)
        self.work_dir = Path(work_dir)
        self.version = version or _version_of_libs(self.libs)
        self.heap = heap
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port, self.controller_port = free_ports(2)
        self._server = ServiceProcess("the Kafka broker", log_path=self.log_path)
        self._formatted = False
        self._recording_archive: Path | None = None
        self.use_class_archive = use_class_archive
        self.overrides = dict(overrides or {})
        self.last_start_seconds: float | None = None

    @property
    def bootstrap(self) -> str:
        """`127.0.0.1:<port>`, the same for the broker's whole life, restarts included."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker JVM's process id while it runs (the benchmark reads its CPU time)."""
        return self._server.pid

    @property
    def log_path(self) -> Path:
        """The broker's stdout and stderr, appended across restarts."""
        return self.work_dir / "broker.log"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def properties_path(self) -> Path:
        return self.work_dir / "server.properties"

    @property
    def running(self) -> bool:
        return self._server.running

    def log_tail(self, lines: int = 60) -> str:
        """The last *lines* lines of the broker log, for a failing test's report."""
        return self._server.log_tail(lines)

    def start(self) -> Self:
        """Format storage on the first start, launch the JVM and wait until it serves metadata.

        Raises:
            BrokerStartError: the JVM exited, or was not ready within `start_timeout`.
        """
        if self.running:
            return self
        started = time.monotonic()
        java = _java_executable()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not self._formatted:
            self._format(java)
        command = broker_command(
            java=java,
            libs=self.libs,
            properties=self.properties_path,
            heap=self.heap,
            class_archive=self._class_archive_flags(),
        )
        log_offset = self._server.launch(command)
        try:
            self._wait_until_ready(log_offset, started=started)
        except BaseException:
            self.kill()
            raise
        self.last_start_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Controlled shutdown (SIGTERM); SIGKILL if it has not exited after `stop_timeout`."""
        self._keep_class_archive(
            complete=self._server.stop(signal.SIGTERM, timeout=self.stop_timeout)
        )

    def kill(self) -> None:
        """Crash the broker (SIGKILL to its process group): no controlled shutdown, no flush.

        The next start takes about 6 s longer: the controller refuses the new incarnation
        (DUPLICATE_BROKER_REGISTRATION) until the crashed one's session expires
        (`broker.session.timeout.ms`, 6 s here, 9 s in Kafka's defaults). Shorter is possible
        (`overrides={"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms":
        "500"}` measured 6.8 s for the whole restart instead of 13.2 s with 9 s) at the risk
        of fencing a live broker that a busy machine starves of CPU for a few seconds.
        """
        self._server.stop(signal.SIGKILL, timeout=self.stop_timeout)
        self._keep_class_archive(complete=False)

    def restart(self, *, graceful: bool = True) -> Self:
        """Stop (or kill) and start again on the same data directory and the same ports."""
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalKafka({self.version}, {self.bootstrap}, {state}, {self.work_dir})"

    @property
    def class_archive_path(self) -> Path:
        """The JVM class-data archive shared by every broker of this classpath (see below)."""
        return self.libs.parent / "broker.jsa"

    def _class_archive_flags(self) -> tuple[str, ...]:
        # Loading Kafka's ~10,000 classes dominates a cold start on two cores. The first broker
        # of a classpath records them at exit into an AppCDS archive (JDK 13+); later starts map
        # it and start about twice as fast. A stale or foreign archive only makes the JVM warn
        # and load classes as usual, so the archive can never stop a broker from starting.
        self._recording_archive = None
        if not self.use_class_archive or not os.access(self.libs.parent, os.W_OK):
            return ()
        if self.class_archive_path.is_file():
            return (f"-XX:SharedArchiveFile={self.class_archive_path}",)
        _remove_abandoned_recordings(self.libs.parent)
        self._recording_archive = self.libs.parent / f"broker.jsa.partial-{os.getpid()}-{self.port}"
        # Recording lists every class it cannot archive, hundreds of lines at exit: silenced.
        return (f"-XX:ArchiveClassesAtExit={self._recording_archive}", "-Xlog:cds*=off")

    def _format_archive_flag(self) -> tuple[str, ...]:
        if self.use_class_archive and self.class_archive_path.is_file():
            return (f"-XX:SharedArchiveFile={self.class_archive_path}",)
        return ()

    def _keep_class_archive(self, *, complete: bool) -> None:
        recording, self._recording_archive = self._recording_archive, None
        if recording is None:
            return
        if complete and recording.is_file() and recording.stat().st_size > 0:
            recording.replace(self.class_archive_path)
        else:
            # A killed JVM may have left half an archive: never let it be used.
            recording.unlink(missing_ok=True)

    def _format(self, java: str) -> None:
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise BrokerStartError(
                f"{self.data_dir} is not empty; a new cluster needs an empty data directory"
            )
        self.properties_path.write_text(
            render_server_properties(
                version=self.version,
                port=self.port,
                controller_port=self.controller_port,
                data_dir=self.data_dir,
                overrides=self.overrides,
            )
        )
        result = subprocess.run(
            [
                java,
                "-Xmx256m",
                "-XX:TieredStopAtLevel=1",
                # Reads the broker's archive when there is one (same classpath, same classes).
                *self._format_archive_flag(),
                "-cp",
                f"{self.libs}/*",
                "kafka.tools.StorageTool",
                "format",
                "-t",
                new_cluster_id(),
                "-c",
                str(self.properties_path),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=self.start_timeout,
            check=False,
        )
        with self.log_path.open("ab") as log:
            log.write(b"--- kafka.tools.StorageTool format ---\n" + result.stdout + result.stderr)
        if result.returncode != 0:
            raise BrokerStartError(
                f"formatting {self.data_dir} failed (exit {result.returncode}):\n"
                + (result.stdout + result.stderr).decode(errors="replace")[-4000:]
            )
        self._formatted = True

    def _wait_until_ready(self, log_offset: int, *, started: float) -> None:
        def logged_started() -> bool:
            with self.log_path.open("rb") as log:
                log.seek(log_offset)
                return STARTED_MESSAGE in log.read()

        self._server.wait_until_ready(
            logged_started,
            awaited=f"log {STARTED_MESSAGE.decode()!r}",
            started=started,
            timeout=self.start_timeout,
            poll_seconds=0.2,
            error=BrokerStartError,
        )
        # The log line says the broker is up; a metadata round trip proves it serves clients.
        deadline = started + self.start_timeout
        wait_for_metadata(self.bootstrap, timeout=max(5.0, deadline - time.monotonic()))


def _remove_abandoned_recordings(folder: Path) -> None:
    """Delete archive recordings (~45 MB each) whose recording process no longer exists."""
    for recording in folder.glob("broker.jsa.partial-*"):
        pid = recording.name.removeprefix("broker.jsa.partial-").split("-", 1)[0]
        try:
            os.kill(int(pid), 0)
        except (ValueError, ProcessLookupError):
            recording.unlink(missing_ok=True)
        except PermissionError:
            continue  # alive, somebody else's


def broker_command(
    *, java: str, libs: Path, properties: Path, heap: str, class_archive: Sequence[str] = ()
) -> list[str]:
    """The command line of the broker JVM."""
    return [
        java,
        f"-Xmx{heap}",
        "-Xms128m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        # C1 only: a test broker never runs long enough to profit from C2, and C2's compile
        # threads compete for the same two cores while the broker starts (5 s instead of 9 s).
        "-XX:TieredStopAtLevel=1",
        # The archive options need JDK 13+; an older JVM skips them instead of refusing to start.
        "-XX:+IgnoreUnrecognizedVMOptions",
        *class_archive,
        "-Djava.awt.headless=true",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
        "-cp",
        f"{libs}/*",
        "kafka.Kafka",
        str(properties),
    ]


def _version_of_libs(libs: Path) -> str:
    for jar in libs.glob("kafka_2.13-*.jar"):
        return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")
    raise KafkaUnavailableError(f"no kafka_2.13-<version>.jar in {libs}; run prepare first")


def wait_for_metadata(bootstrap: str, *, timeout: float = 30.0) -> None:
    """Return once a metadata request to *bootstrap* succeeds.

    Raises:
        BrokerStartError: no broker answered within *timeout* seconds.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap,
                client_id="tuneloop-ready-check",
                request_timeout_ms=5000,
            )
        except KafkaError as exc:
            last_error = exc
            time.sleep(0.5)
            continue
        try:
            admin.describe_cluster()
            return
        except KafkaError as exc:
            last_error = exc
            time.sleep(0.5)
        finally:
            admin.close()
    raise BrokerStartError(f"no metadata from {bootstrap} within {timeout:.0f} s: {last_error}")


# --- choosing a broker for a test run ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KafkaEndpoint:
    """The Kafka a test run uses: its address, where it comes from, and the broker if local."""

    bootstrap: str
    kind: BrokerKind
    broker: LocalKafka | None = None
    version: str | None = None


def docker_answers(*, timeout: float = 3.0) -> bool:
    """True when a Docker engine answers a ping within *timeout*; a bare client is not enough."""
    if os.environ.get("TUNELOOP_KAFKA_DOCKER", "").strip() == "0":
        return False
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach an engine means "no Docker"
        return False


@contextlib.contextmanager
def kafka_for_tests(work_dir: Path) -> Iterator[KafkaEndpoint]:
    """Provide a Kafka for a test session, stopping what it started on exit.

    The order: `TUNELOOP_KAFKA_BOOTSTRAP` (an external cluster, left alone) → a testcontainers
    broker when a Docker engine answers (developer laptops; CI machines cannot pull images) →
    the local JVM broker, resolving its jars first if needed.

    Raises:
        KafkaUnavailableError: no leg can provide a broker (no java/mvn, jars unresolvable).
        BrokerStartError: the local broker was started but failed.
    """
    external = resolve_bootstrap()
    if external:
        try:
            wait_for_metadata(external, timeout=30.0)
        except BrokerStartError as exc:
            raise BrokerStartError(f"TUNELOOP_KAFKA_BOOTSTRAP={external}: {exc}") from exc
        yield KafkaEndpoint(bootstrap=external, kind=BrokerKind.EXTERNAL)
        return
    container = _started_container() if docker_answers() else None
    if container is not None:
        try:
            yield KafkaEndpoint(
                bootstrap=container.get_bootstrap_server(), kind=BrokerKind.CONTAINER
            )
        finally:
            container.stop()
        return
    version = os.environ.get("KAFKA_VERSION", "").strip() or None
    libs = prepare_kafka(version)
    broker = LocalKafka(libs=libs, work_dir=work_dir)
    with broker:
        yield KafkaEndpoint(
            bootstrap=broker.bootstrap,
            kind=BrokerKind.LOCAL,
            broker=broker,
            version=broker.version,
        )


def _started_container() -> Any:
    """A started testcontainers Kafka, or None (with the reason on stderr) if it cannot start.

    An engine that answers may still be unable to pull images (no registry access), so a
    failure here falls back to the local broker instead of failing the run.
    """
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(CONTAINER_IMAGE).with_kraft()
    try:
        container.start(timeout=120)
    except Exception as exc:  # docker, network and timeout errors alike: fall back
        _say(f"testcontainers could not start {CONTAINER_IMAGE} ({exc}); using the local broker")
        with contextlib.suppress(Exception):
            container.stop()
        return None
    return container


def resolve_bootstrap() -> str | None:
    """An already-running Kafka to use without starting one: `TUNELOOP_KAFKA_BOOTSTRAP`, or None."""
    return os.environ.get("TUNELOOP_KAFKA_BOOTSTRAP", "").strip() or None


# --- by hand -----------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    """`python -m devservices.kafka prepare|run`.

    `run` keeps a broker up until Ctrl-C or SIGTERM, so that repeated test runs can share it
    through `TUNELOOP_KAFKA_BOOTSTRAP` instead of starting one each.
    """
    if list(argv) == ["prepare"]:
        prepare()
        return 0
    if list(argv) != ["run"]:
        print("usage: python -m devservices.kafka prepare|run", file=sys.stderr)
        return 2
    libs = prepare_kafka()

    def announce(broker: LocalKafka) -> None:
        _say(f"Kafka {broker.version} up in {broker.last_start_seconds or 0:.1f} s")
        _say(f"log: {broker.log_path}")
        print(f"export TUNELOOP_KAFKA_BOOTSTRAP={broker.bootstrap}", flush=True)

    return serve_until_interrupted(
        lambda work_dir: LocalKafka(libs=libs, work_dir=work_dir),
        work_dir_prefix="tuneloop-kafka-",
        announce=announce,
        say=_say,
        what="the broker",
    )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

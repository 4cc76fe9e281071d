"""Local Kubernetes for the tests, the benchmarks and the demo: where an API comes from, and the
pieces every local server is made of.

Where an API comes from (`connect()`; the pytest plugin `tests/fixtures/kubernetes.py` makes
the same choice), first match wins:
1. `TUNELOOP_KUBECONFIG`: a real cluster that already has Kubeflow Trainer installed (its CRDs
   are checked before anything runs);
2. else the local control plane (`devservices/control_plane.py`): etcd, kube-apiserver,
   kube-controller-manager, the JobSet and Kubeflow Trainer controllers and the node agent,
   built by `make services`. It is the only local Kubernetes: the etcd +
   apiextensions-apiserver pair that served CRDs without controllers, and K3s in Docker,
   which ran no Trainer either, are gone.

What else lives here, shared by `control_plane.py`, the node agent and the test fixtures:
- building with Go into `~/.cache/tuneloop/bin`: `run_go`, version stamps, `build_etcd`
  (deploy/local/etcd) and `build_helm` (the chart's tests);
- the Trainer v2.3.0 manifests from its Go module (`trainer_manifests`);
- certificates, kubeconfigs and etcd's command line (pure, unit-tested);
- `ManagedProcess`, one server process with its log;
- creating CRDs, ClusterTrainingRuntimes and namespaces (`create_namespace`, whose
  `hold_pods` sets the label that makes the node agent leave the namespace's pods Pending).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from devservices.node_agent import HOLD_LABEL, HOLD_VALUE
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from devservices.control_plane import LocalControlPlane

HELM_PACKAGE = "helm.sh/helm/v4/cmd/helm"
HELM_VERSION = "v4.3.2"
"""Helm renders and lints `deploy/helm/tuneloop` in its tests; nothing at run time needs it."""

TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
TRAINER_VERSION = "v2.3.0"
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_API_VERSION = "v1alpha1"
TRAINER_CRD_NAMES = (
    "trainjobs.trainer.kubeflow.org",
    "trainingruntimes.trainer.kubeflow.org",
    "clustertrainingruntimes.trainer.kubeflow.org",
)
TORCH_DISTRIBUTED_RUNTIME = "torch-distributed"

ETCD_PREFIX = "/tuneloop"
REPO_ROOT = Path(__file__).resolve().parents[1]
ETCD_WRAPPER_DIR = REPO_ROOT / "deploy" / "local" / "etcd"

_CRD_FILES = (
    "trainer.kubeflow.org_trainjobs.yaml",
    "trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer.kubeflow.org_clustertrainingruntimes.yaml",
)
_RUNTIME_FILE = "torch_distributed.yaml"
_HEARTBEAT_SECONDS = 30.0
_STOP_GRACE_SECONDS = 10.0


class KubernetesUnavailableError(ConfigError):
    """No Kubernetes API can be built, started or reached: refuse to start, say why."""


# --------------------------------------------------------------------------------------------
# Building: binaries and manifests in the cache
# --------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """`TUNELOOP_CACHE`, else `~/.cache/tuneloop`: builds and state never go in the repo."""
    configured = os.environ.get("TUNELOOP_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tuneloop"


def go_environment(cache: Path) -> dict[str, str]:
    """The environment for every `go` call: the caches under *cache*, this machine's toolchain.

    `GOTOOLCHAIN=local` because a go.mod `toolchain` line must never trigger a download of
    another Go; the module cache and the build cache are shared by all our builds.
    """
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN="local",
        GOMODCACHE=str(cache / "go" / "mod"),
        GOCACHE=str(cache / "go" / "build"),
        GOFLAGS="-buildvcs=false",
    )
    env.pop("GOBIN", None)
    return env


def progress(message: str) -> None:
    print(f"kubernetes: {message}", file=sys.stderr, flush=True)


def run_go(args: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path, what: str) -> None:
    """Run a long `go` command, its output into *log*, a progress line every 30 s."""
    go = shutil.which("go", path=env.get("PATH"))
    if go is None:
        raise KubernetesUnavailableError(
            f"cannot build {what}: no `go` on PATH (Go >= 1.26 is needed; see README)"
        )
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [go, *args], cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT
        )
        while True:
            try:
                code = process.wait(timeout=_HEARTBEAT_SECONDS)
                break
            except subprocess.TimeoutExpired:
                progress(f"still building {what} ({time.monotonic() - started:.0f} s)")
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        raise KubernetesUnavailableError(
            f"building {what} failed (exit {code}); log {log}:\n" + "\n".join(tail)
        )
    progress(f"built {what} in {time.monotonic() - started:.0f} s")


def stamp_matches(binary: Path, stamp: str) -> bool:
    stamp_file = binary.with_name(binary.name + ".stamp")
    return (
        binary.is_file()
        and stamp_file.is_file()
        and stamp_file.read_text(encoding="utf-8").strip() == stamp
    )


def write_stamp(binary: Path, stamp: str) -> None:
    binary.with_name(binary.name + ".stamp").write_text(stamp + "\n", encoding="utf-8")


def _built_module_version(binary: Path, env: Mapping[str, str]) -> str | None:
    """`package@version` of a Go binary: its main package and its module's version, from its
    embedded build info (as `go install package@version` names it)."""
    go = shutil.which("go", path=env.get("PATH"))
    if go is None or not binary.is_file():
        return None
    shown = subprocess.run(
        [go, "version", "-m", str(binary)],
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    package = None
    for line in shown.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "path":
            package = parts[1]
        if len(parts) >= 3 and parts[0] == "mod":
            return f"{package or parts[1]}@{parts[2]}"
    return None


def _etcd_stamp() -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((ETCD_WRAPPER_DIR / name).read_bytes())
    return f"etcd-wrapper sha256:{digest.hexdigest()[:16]}"


def build_helm(cache: Path | None = None) -> Path:
    """`go install` helm into *cache*/bin for the chart's tests, unless that version is there."""
    cache = cache or cache_root()
    return _go_install(cache, HELM_PACKAGE, HELM_VERSION, "helm", cold="4 min")


def _go_install(cache: Path, package: str, version: str, name: str, *, cold: str) -> Path:
    """`go install package@version` into *cache*/bin/*name*, unless that version is there."""
    env = go_environment(cache)
    binary = cache / "bin" / name
    stamp = f"{package}@{version}"
    if stamp_matches(binary, stamp):
        return binary
    if _built_module_version(binary, env) == stamp:
        # Built by hand (or by an older prepare) with the same version: adopt it.
        write_stamp(binary, stamp)
        return binary
    progress(f"building {stamp} (cold: about {cold} on 2 cores, then cached)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent, prefix=f".{name}-build-") as staging:
        env["GOBIN"] = staging
        run_go(
            ["install", "-trimpath", "-ldflags=-s -w", stamp],
            env=env,
            cwd=cache,
            log=cache / "logs" / f"build-{name}.log",
            what=stamp,
        )
        # Rename into place so that a half-written binary is never taken for a built one.
        os.replace(Path(staging) / Path(package).name, binary)
    write_stamp(binary, stamp)
    return binary


def build_etcd(cache: Path) -> Path:
    """`go build` the etcd wrapper module (deploy/local/etcd) into *cache*/bin."""
    binary = cache / "bin" / "etcd"
    stamp = _etcd_stamp()
    if stamp_matches(binary, stamp):
        return binary
    progress("building etcd from deploy/local/etcd (cold: about 3 min on 2 cores)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: a concurrent `prepare` or an interrupted
    # build never leaves a half-written etcd that looks built.
    with tempfile.TemporaryDirectory(dir=binary.parent, prefix=".etcd-build-") as staging:
        partial = Path(staging) / "etcd"
        run_go(
            ["build", "-trimpath", "-ldflags=-s -w", "-o", str(partial), "."],
            env=go_environment(cache),
            cwd=ETCD_WRAPPER_DIR,
            log=cache / "logs" / "build-etcd.log",
            what="etcd",
        )
        os.replace(partial, binary)
    write_stamp(binary, stamp)
    return binary


_GET_MANIFESTS = (
    "run `make services` (it runs `go mod download "
    f"{TRAINER_MODULE}@{TRAINER_VERSION}` into the cache's Go module cache)"
)
"""What to do when the Trainer manifests are missing: named in every such error."""


def trainer_module_dir(cache: Path) -> Path:
    """The Trainer Go module's source tree, which holds the CRDs and the runtimes.

    `go mod download` answers from the module cache when the module is there, so a warm
    cache needs no network.

    Raises:
        KubernetesUnavailableError: Go is missing or the module did not download.
    """
    go = shutil.which("go")
    if go is None:
        raise KubernetesUnavailableError(
            f"the Kubeflow Trainer manifests come from the Go module {TRAINER_MODULE}"
            f"@{TRAINER_VERSION}, and `go` is not on PATH: install Go, then {_GET_MANIFESTS}"
        )
    cache.mkdir(parents=True, exist_ok=True)
    try:
        downloaded = subprocess.run(
            [go, "mod", "download", "-json", f"{TRAINER_MODULE}@{TRAINER_VERSION}"],
            cwd=cache,  # outside any go.mod, so nothing here is edited
            env=go_environment(cache),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise KubernetesUnavailableError(
            f"{TRAINER_MODULE}@{TRAINER_VERSION}: the download timed out; {_GET_MANIFESTS}"
        ) from None
    if downloaded.returncode != 0:
        raise KubernetesUnavailableError(
            f"{TRAINER_MODULE}@{TRAINER_VERSION} did not download "
            f"({downloaded.stdout.strip() or downloaded.stderr.strip()}); {_GET_MANIFESTS}"
        )
    return Path(json.loads(downloaded.stdout)["Dir"])


def trainer_manifests(cache: Path) -> tuple[tuple[Path, ...], tuple[Path, ...], str]:
    """The Trainer CRDs and the torch-distributed runtime, from the v2.3.0 Go module.

    There is no other source: the product never reads files outside its package, and a
    copy in the repository would drift from the version the tests claim to meet.

    Returns:
        (crd files, runtime files, a description of the source).

    Raises:
        KubernetesUnavailableError: the module is not there; the message says how to get it.
    """
    module = trainer_module_dir(cache)
    crds = tuple(module / "manifests" / "base" / "crds" / name for name in _CRD_FILES)
    runtime = module / "manifests" / "base" / "runtimes" / _RUNTIME_FILE
    missing = [str(path) for path in (*crds, runtime) if not path.is_file()]
    if missing:
        raise KubernetesUnavailableError(
            f"the Go module {TRAINER_MODULE}@{TRAINER_VERSION} lacks {', '.join(missing)}"
        )
    return crds, (runtime,), f"Go module {TRAINER_MODULE}@{TRAINER_VERSION}"


def prepare_helm() -> None:
    """Entry point of `python -m devservices prepare helm`."""
    progress(f"ready: {build_helm()}")


# --------------------------------------------------------------------------------------------
# Certificates, kubeconfigs and command lines (pure, unit-tested)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Certificates:
    """PEM files of a throwaway CA, the server's certificate and an admin client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


ADMIN_GROUP = "system:masters"
"""The API server's privileged group: always allowed, whatever RBAC says."""


def make_certificates(
    directory: Path,
    *,
    now: datetime.datetime,
    days: int = 30,
    server_dns_names: Sequence[str] = (),
) -> Certificates:
    """Write a CA, a server certificate for 127.0.0.1/localhost and an admin client certificate.

    *server_dns_names* are added to the server certificate's names: the local control plane's
    controllers serve their webhooks with it, under the Service names their clients use.

    The client certificate's organisation is `system:masters`: the API server authorizes with
    RBAC, and lets that group do everything without asking it.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)

    def name(**attributes: str) -> x509.Name:
        oids = {"CN": NameOID.COMMON_NAME, "O": NameOID.ORGANIZATION_NAME}
        return x509.Name(
            [x509.NameAttribute(oids[key], value) for key, value in attributes.items()]
        )

    def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def issue(
        subject: x509.Name,
        key: ec.EllipticCurvePrivateKey,
        *,
        issuer: x509.Name,
        issuer_key: ec.EllipticCurvePrivateKey,
        extensions: Sequence[tuple[x509.ExtensionType, bool]],
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name(CN="tuneloop-local-ca")
    ca_cert = issue(
        ca_name,
        ca_key,
        issuer=ca_name,
        issuer_key=ca_key,
        extensions=[
            (x509.BasicConstraints(ca=True, path_length=None), True),
            (_key_usage(cert_sign=True), True),
            (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
        ],
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = issue(
        name(CN="127.0.0.1"),
        server_key,
        issuer=ca_name,
        issuer_key=ca_key,
        extensions=[
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(cert_sign=False), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (
                x509.SubjectAlternativeName(
                    [
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.DNSName("localhost"),
                        *(x509.DNSName(extra) for extra in server_dns_names),
                    ]
                ),
                False,
            ),
        ],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = issue(
        name(O=ADMIN_GROUP, CN="tuneloop-admin"),
        client_key,
        issuer=ca_name,
        issuer_key=ca_key,
        extensions=[
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(cert_sign=False), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False),
        ],
    )
    paths = Certificates(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "admin.crt",
        client_key=directory / "admin.key",
    )
    pem = serialization.Encoding.PEM
    paths.ca.write_bytes(ca_cert.public_bytes(pem))
    paths.server_cert.write_bytes(server_cert.public_bytes(pem))
    paths.client_cert.write_bytes(client_cert.public_bytes(pem))
    write_key(paths.server_key, server_key)
    write_key(paths.client_key, client_key)
    return paths


def _key_usage(*, cert_sign: bool) -> Any:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not cert_sign,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def render_kubeconfig(*, server: str, certificates: Certificates) -> dict[str, Any]:
    """A kubeconfig that reaches *server* as the admin client certificate."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tuneloop-local",
                "cluster": {"server": server, "certificate-authority": str(certificates.ca)},
            }
        ],
        "users": [
            {
                "name": "tuneloop-admin",
                "user": {
                    "client-certificate": str(certificates.client_cert),
                    "client-key": str(certificates.client_key),
                },
            }
        ],
        "contexts": [
            {
                "name": "tuneloop-local",
                "context": {"cluster": "tuneloop-local", "user": "tuneloop-admin"},
            }
        ],
        "current-context": "tuneloop-local",
    }


@dataclass(frozen=True, slots=True)
class EtcdPorts:
    """etcd's loopback ports; kept across stop()/start() so that clients reconnect."""

    client: int
    peer: int


def render_etcd_args(binary: Path, *, data_dir: Path, ports: EtcdPorts) -> tuple[str, ...]:
    """etcd's command line: one member, loopback only, no fsync (test data, speed first)."""
    client = f"http://127.0.0.1:{ports.client}"
    peer = f"http://127.0.0.1:{ports.peer}"
    return (
        str(binary),
        "--name=tuneloop",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=tuneloop={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    )


# --------------------------------------------------------------------------------------------
# Running: server processes
# --------------------------------------------------------------------------------------------


GO_GC_PERCENT = "400"
"""`GOGC` of the local etcd and API server. They share two cores with Kafka and the worker
under test; Go's default (100) spends about a fifth of the API server's CPU per TrainJob
create on garbage collection. 400 trades ~250 MiB of heap for that CPU (measured: 8.5 -> 6.6
ms of API server CPU per create at 100 creates/s). An operator's `GOGC` wins."""


def server_environment() -> dict[str, str]:
    """The environment the local servers start with: ours, plus `GOGC` unless it is set."""
    return {"GOGC": GO_GC_PERCENT, **os.environ}


def free_loopback_port() -> int:
    """A port nothing listens on right now (the OS picks; another process may still race us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(slots=True)
class ManagedProcess:
    name: str
    args: tuple[str, ...]
    log: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Variables set for this process on top of `server_environment()`."""
    popen: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = self.log.open("ab")
        self.log_file.write(f"\n--- start {time.strftime('%H:%M:%S')}\n".encode())
        self.log_file.flush()
        # A session of its own: Ctrl-C in a terminal reaches us, not the servers, and stop()
        # can signal the whole group.
        self.popen = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env={**server_environment(), **self.extra_env},
            start_new_session=True,
        )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, *, grace: float = _STOP_GRACE_SECONDS) -> None:
        """SIGTERM the process group, and SIGKILL it if it has not exited after *grace*
        seconds."""
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


# --------------------------------------------------------------------------------------------
# Loading manifests and making namespaces (any API server)
# --------------------------------------------------------------------------------------------


def new_api_client(kubeconfig: Path) -> Any:
    """A `kubernetes.client.ApiClient` for *kubeconfig*, independent of the global config."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


def documents(path: Path) -> list[dict[str, Any]]:
    # The C loader reads a 900 KB CRD in 0.1 s; the pure-Python one takes a second per file.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as stream:
        return [doc for doc in yaml.load_all(stream, Loader=loader) if doc]


def _discard(response: Any) -> None:
    """Read an unparsed answer to the end so its connection goes back to the pool.

    With `_preload_content=False` an unread answer keeps its connection busy, and when it is
    dropped the server logs a broken pipe while echoing a 900 KB CRD back.
    """
    response.drain_conn()
    response.release_conn()


def create_crds(
    kubeconfig: Path, files: Sequence[Path], names: Sequence[str], *, timeout: float
) -> None:
    """Create the CRDs in *files* (skip those that exist) and wait until *names* are Established.

    Raises:
        KubernetesUnavailableError: a CRD was refused or not Established within *timeout*.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with new_api_client(kubeconfig) as api:
        extensions = client.ApiextensionsV1Api(api)
        for path in files:
            crd: Any  # a plain dict: the client's typed model would cost seconds to build
            for crd in documents(path):
                try:
                    # _preload_content=False: the client would otherwise turn a 900 KB schema
                    # into model objects, which takes seconds and is thrown away.
                    _discard(
                        extensions.create_custom_resource_definition(
                            body=crd, _preload_content=False
                        )
                    )
                except ApiException as exc:
                    if exc.status != 409:
                        raise KubernetesUnavailableError(
                            f"the API server refused {path.name}: {exc.status} {exc.reason}"
                        ) from exc
        for name in names:
            _wait_for_established(extensions, name, timeout=timeout)


def create_cluster_runtimes(kubeconfig: Path, files: Sequence[Path], *, timeout: float) -> None:
    """Create the ClusterTrainingRuntimes in *files*, skipping those that exist.

    A 404 (the resource is Established but not served yet) or a 500 (the Trainer's webhook is
    not answering yet) is retried until *timeout*.

    Raises:
        KubernetesUnavailableError: the server refused a runtime.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with new_api_client(kubeconfig) as api:
        objects = client.CustomObjectsApi(api)
        deadline = time.monotonic() + timeout
        for path in files:
            for runtime in documents(path):
                while True:
                    try:
                        _discard(
                            objects.create_cluster_custom_object(
                                TRAINER_GROUP,
                                TRAINER_API_VERSION,
                                "clustertrainingruntimes",
                                runtime,
                                _preload_content=False,
                            )
                        )
                        break
                    except ApiException as exc:
                        if exc.status == 409:
                            break
                        if exc.status in (404, 500) and time.monotonic() < deadline:
                            time.sleep(0.2)
                            continue
                        raise KubernetesUnavailableError(
                            f"the API server refused {path.name}: {exc.status} {exc.body!r}"
                        ) from exc


def _wait_for_established(extensions: Any, name: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        answer = extensions.read_custom_resource_definition_status(name, _preload_content=False)
        document = json.loads(answer.data)
        answer.release_conn()
        conditions = (document.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise KubernetesUnavailableError(f"CRD {name} not Established after {timeout:.0f} s")
        time.sleep(0.2)


def create_namespace(
    api_client: Any, name: str, *, hold_pods: bool = False, timeout: float = 30.0
) -> None:
    """Create namespace *name* and wait for its default ServiceAccount (pods need it).

    *hold_pods* labels it `tuneloop.io/node-agent=hold`: the local node agent then leaves its
    pods Pending and unbound, as a cluster without room for them would, so that TrainJobs
    there get their JobSet, Jobs and pods from the real controllers but no container runs.
    (Only the node agent reads the label; a real cluster's kubelets run the pods.)

    Raises:
        kubernetes.client.ApiException: the server refused the namespace, or its default
            ServiceAccount did not appear within *timeout* seconds.
    """
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    labels = {HOLD_LABEL: HOLD_VALUE} if hold_pods else {}
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except client.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def delete_namespace(api_client: Any, name: str) -> None:
    """Delete namespace *name* and everything in it, without waiting (the namespace controller
    finishes it in the background); a namespace that is already gone is fine."""
    from kubernetes import client

    with contextlib.suppress(client.ApiException):
        client.CoreV1Api(api_client).delete_namespace(name, propagation_policy="Background")


# --------------------------------------------------------------------------------------------
# Choosing an API: an external cluster, or the local control plane
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KubeEndpoint:
    """A Kubernetes API with the Trainer CRDs, and how to reach it."""

    kubeconfig: Path
    source: str
    """`TUNELOOP_KUBECONFIG` or `control-plane`."""
    server: LocalControlPlane | None = None
    """The local control plane when we started it (tests may stop and start its API server:
    `stop_apiserver()`, `start()`), else None."""

    def api_client(self) -> Any:
        """A fresh `kubernetes.client.ApiClient` for this API (close it when done)."""
        return new_api_client(self.kubeconfig)


def _require_trainer_crds(kubeconfig: Path) -> None:
    """Fail now, with the reason, if an external cluster is unreachable or lacks the Trainer."""
    import urllib3
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        api = new_api_client(kubeconfig)
    except Exception as exc:  # the kubernetes config loader raises plain exceptions
        raise KubernetesUnavailableError(f"TUNELOOP_KUBECONFIG={kubeconfig}: {exc}") from exc
    with api:
        extensions = client.ApiextensionsV1Api(api)
        for name in TRAINER_CRD_NAMES:
            try:
                _discard(
                    extensions.read_custom_resource_definition(
                        name, _preload_content=False, _request_timeout=10
                    )
                )
            except ApiException as exc:
                raise KubernetesUnavailableError(
                    f"TUNELOOP_KUBECONFIG={kubeconfig}: CRD {name} is missing ({exc.status}); "
                    "install Kubeflow Trainer v2 there first"
                ) from exc
            except urllib3.exceptions.HTTPError as exc:
                raise KubernetesUnavailableError(
                    f"TUNELOOP_KUBECONFIG={kubeconfig}: the API server does not answer: {exc}"
                ) from exc


def external_endpoint() -> KubeEndpoint | None:
    """The cluster `TUNELOOP_KUBECONFIG` names, checked; None when the variable is not set.

    Raises:
        KubernetesUnavailableError: the file is missing, the cluster does not answer, or it
            lacks the Trainer's CRDs.
    """
    external = os.environ.get("TUNELOOP_KUBECONFIG")
    if not external:
        return None
    path = Path(external).expanduser()
    if not path.is_file():
        raise KubernetesUnavailableError(f"TUNELOOP_KUBECONFIG={external}: no such file")
    _require_trainer_crds(path)
    return KubeEndpoint(kubeconfig=path, source="TUNELOOP_KUBECONFIG")


@contextlib.contextmanager
def connect(workdir: Path, *, controller_api_qps: int | None = None) -> Iterator[KubeEndpoint]:
    """Yield a Kubernetes API with the Trainer: external, else the local control plane (see the
    module doc), which is started in *workdir* and stopped on exit. *controller_api_qps* sets
    the local controller manager's client rate limit (`local_control_plane`); an external
    cluster is used as it is.

    Raises:
        KubernetesUnavailableError: the external cluster cannot be used, or the control plane
            is not built (run `make services`) or did not start.
    """
    external = external_endpoint()
    if external is not None:
        yield external
        return
    from devservices.control_plane import local_control_plane

    with local_control_plane(workdir, controller_api_qps=controller_api_qps) as plane:
        yield KubeEndpoint(kubeconfig=plane.kubeconfig, source="control-plane", server=plane)

"""A real Kubernetes API with the Kubeflow Trainer CRDs, on 127.0.0.1, for tests and the demo.

Who calls it: `python -m devservices prepare` (via `prepare()`), the pytest plugin
`tests/fixtures/kubernetes.py` and the demo (via `connect()`).

What it runs: `apiextensions-apiserver` (k8s.io/apiextensions-apiserver, the API server that
serves CRDs and custom resources and nothing else) in front of an etcd, both built with Go
from the module proxy into `~/.cache/tuneloop/bin`. There is no Trainer controller: a TrainJob
is stored, validated against the real CRD schema (OpenAPI + CEL) and watched, and tests play
the controller by patching its `/status`. There are no core objects (namespaces, pods,
events): custom resources accept any namespace name.

Where an API comes from (`connect()`), first match wins:
1. `TUNELOOP_KUBECONFIG`: a real cluster that already has Kubeflow Trainer installed;
2. K3s in Docker through testcontainers, only when a Docker engine answers (the CRDs and the
   `torch-distributed` runtime are applied to it);
3. with `TUNELOOP_LOCAL_KUBERNETES=control-plane`, the local control plane with the real
   controllers and the node agent (`devservices/control_plane.py`);
4. else the local etcd + apiextensions-apiserver pair of this module.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from devservices.control_plane import LocalControlPlane

APISERVER_MODULE = "k8s.io/apiextensions-apiserver"
APISERVER_VERSION = "v0.37.2"
"""Kubernetes 1.37.2's apiextensions-apiserver; it uses the etcd v3.7 client, so etcd is 3.7."""

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

LOCAL_KUBERNETES_VARIABLE = "TUNELOOP_LOCAL_KUBERNETES"
"""Which local API `connect()` starts: `apiserver` (the default for now: etcd and
apiextensions-apiserver, CRDs only, no controllers) or `control-plane` (the real controllers
and the node agent, `devservices/control_plane.py`)."""
_STOP_GRACE_SECONDS = 10.0


class KubernetesUnavailableError(ConfigError):
    """No Kubernetes API can be built, started or reached: refuse to start, say why."""


# --------------------------------------------------------------------------------------------
# Preparing: binaries and manifests in the cache
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Paths:
    """Everything the local API needs, resolved by `prepare_kubernetes()`."""

    apiserver: Path
    etcd: Path
    crds: tuple[Path, ...]
    """TrainJob, TrainingRuntime and ClusterTrainingRuntime CRD manifests, in that order."""
    runtimes: tuple[Path, ...]
    """ClusterTrainingRuntime manifests to install (the upstream `torch-distributed`)."""
    manifest_source: str
    """Where the manifests came from, for logs and reports (the Go module and its version)."""


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


def build_apiserver(cache: Path) -> Path:
    """`go install` apiextensions-apiserver into *cache*/bin, unless that version is there."""
    return _go_install(
        cache, APISERVER_MODULE, APISERVER_VERSION, "apiextensions-apiserver", cold="8 min"
    )


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


def prepare_kubernetes(cache: Path | None = None) -> Paths:
    """Build both binaries and resolve the manifests; a no-op (a second or so) when warm.

    Raises:
        KubernetesUnavailableError: Go is missing, a build failed, or no manifests exist.
    """
    cache = cache or cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    etcd = build_etcd(cache)
    apiserver = build_apiserver(cache)
    crds, runtimes, source = trainer_manifests(cache)
    return Paths(
        apiserver=apiserver, etcd=etcd, crds=crds, runtimes=runtimes, manifest_source=source
    )


def binaries_built(cache: Path | None = None) -> bool:
    """Both server binaries are in the cache (`make services` has run)."""
    bin_dir = (cache or cache_root()) / "bin"
    return (bin_dir / "apiextensions-apiserver").is_file() and (bin_dir / "etcd").is_file()


def installed_paths(cache: Path | None = None) -> Paths | None:
    """The prepared paths without building anything, or None when a binary is missing."""
    cache = cache or cache_root()
    if not binaries_built(cache):
        return None
    apiserver = cache / "bin" / "apiextensions-apiserver"
    etcd = cache / "bin" / "etcd"
    crds, runtimes, source = trainer_manifests(cache)
    return Paths(
        apiserver=apiserver, etcd=etcd, crds=crds, runtimes=runtimes, manifest_source=source
    )


def prepare() -> None:
    """Entry point of `python -m devservices prepare`."""
    paths = prepare_kubernetes()
    progress(f"ready: {paths.apiserver}, {paths.etcd}; Trainer CRDs from {paths.manifest_source}")


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
"""The apiserver's privileged group: always allowed, with no authorizer to ask."""


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

    The client certificate's organisation is `system:masters`: apiextensions-apiserver has no
    AlwaysAllow mode, but it lets that group do everything without asking an authorizer.
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


def render_unreachable_kubeconfig() -> dict[str, Any]:
    """The kubeconfig for the apiserver's delegated-auth and core-API clients.

    apiextensions-apiserver insists on talking to a "real" kube-apiserver for delegated
    authentication, authorization and its core informers. Upstream's own test server points
    them at an address where nothing listens; port 1 on loopback is closed, so every such call
    fails at once and only `system:masters` client certificates get through.
    """
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "nowhere", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}],
        "current-context": "nowhere",
    }


@dataclass(frozen=True, slots=True)
class Ports:
    """Loopback ports of one local API; kept across stop()/start() so clients reconnect."""

    etcd_client: int
    etcd_peer: int
    apiserver: int


def render_etcd_args(binary: Path, *, data_dir: Path, ports: Ports) -> tuple[str, ...]:
    """etcd's command line: one member, loopback only, no fsync (test data, speed first)."""
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
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


DISABLED_ADMISSION_PLUGINS = (
    # No Namespace objects exist here, so namespace checks would reject every custom resource.
    "NamespaceLifecycle",
    # Webhooks and admission policies would be looked up through the unreachable core API.
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "MutatingAdmissionPolicy",
)


def render_apiserver_args(
    binary: Path,
    *,
    ports: Ports,
    certificates: Certificates,
    unreachable_kubeconfig: Path,
    etcd_prefix: str = ETCD_PREFIX,
) -> tuple[str, ...]:
    """apiextensions-apiserver's command line, after upstream's own integration test server."""
    return (
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--etcd-prefix={etcd_prefix}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={certificates.server_cert}",
        f"--tls-private-key-file={certificates.server_key}",
        f"--client-ca-file={certificates.ca}",
        "--authentication-skip-lookup",
        f"--authentication-kubeconfig={unreachable_kubeconfig}",
        f"--authorization-kubeconfig={unreachable_kubeconfig}",
        f"--kubeconfig={unreachable_kubeconfig}",
        "--enable-priority-and-fairness=false",
        f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}",
    )


# --------------------------------------------------------------------------------------------
# Running: the local pair
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

    def stop(self) -> None:
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=_STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


class LocalKubeAPI:
    """etcd + apiextensions-apiserver on loopback, with the Trainer CRDs and runtime loaded.

    `start()` brings both up (on first start: ports, certificates, kubeconfig, CRDs, the
    `torch-distributed` ClusterTrainingRuntime); `stop()` stops both but keeps etcd's data and
    the ports, so a later `start()` is the same cluster at the same address. `close()` stops
    for good. Usable as a context manager.
    """

    def __init__(self, paths: Paths, workdir: Path, *, startup_timeout: float = 90.0) -> None:
        self.paths = paths
        self.workdir = workdir
        self.startup_timeout = startup_timeout
        self.kubeconfig = workdir / "kubeconfig.yaml"
        self._ports: Ports | None = None
        self._certificates: Certificates | None = None
        self._etcd: ManagedProcess | None = None
        self._apiserver: ManagedProcess | None = None
        self._loaded = False

    # -- public --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._require_ports().apiserver}"

    @property
    def ports(self) -> Ports:
        return self._require_ports()

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the servers running now, by name (the benchmark reads their CPU)."""
        running = (self._etcd, self._apiserver)
        return {
            process.name: process.popen.pid
            for process in running
            if process is not None and process.popen is not None and process.running()
        }

    @property
    def certificates(self) -> Certificates:
        if self._certificates is None:
            raise RuntimeError("LocalKubeAPI has not been started")
        return self._certificates

    def start(self) -> None:
        """Start what is not running, wait for `/healthz`, load the CRDs once.

        Raises:
            KubernetesUnavailableError: a server exited or did not get healthy in time
                (the message carries the end of its log).
        """
        first = self._ports is None
        if first:
            self._first_setup()
        try:
            self._start_processes()
        except KubernetesUnavailableError:
            if not first:
                raise
            # Another process may have taken a port between our probe and the bind.
            self._stop_processes()
            self._ports = self._pick_ports()
            self._write_process_specs()
            self._start_processes()
        if not self._loaded:
            load_trainer_manifests(self.kubeconfig, self.paths, timeout=self.startup_timeout)
            self._loaded = True

    def stop(self) -> None:
        """Stop the API server, then etcd (data and ports kept for `start()`)."""
        self._stop_processes()

    def stop_apiserver(self) -> None:
        """Stop only the API server: clients see connection refused, etcd keeps running."""
        if self._apiserver is not None:
            self._apiserver.stop()

    def close(self) -> None:
        self._stop_processes()
        with contextlib.suppress(ValueError):
            atexit.unregister(self.close)

    def __enter__(self) -> LocalKubeAPI:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def running(self) -> bool:
        return all(p is not None and p.running() for p in (self._etcd, self._apiserver))

    def log_tail(self, lines: int = 40) -> str:
        """The last *lines* of each server's log, for error messages and failing tests."""
        parts = []
        for name in ("etcd", "apiserver"):
            log = self.workdir / "logs" / f"{name}.log"
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            parts.append(f"--- {log} (last {lines} lines)\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def healthy(self) -> bool:
        """`/healthz` answers ok (not `/readyz`: its informer check never passes here)."""
        try:
            with urllib.request.urlopen(  # noqa: S310 (our own https URL, never user input)
                f"{self.url}/healthz", context=self._ssl_context(), timeout=2
            ) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    # -- internals -----------------------------------------------------------------------

    def _require_ports(self) -> Ports:
        if self._ports is None:
            raise RuntimeError("LocalKubeAPI has not been started")
        return self._ports

    def _pick_ports(self) -> Ports:
        chosen: set[int] = set()
        while len(chosen) < 3:
            chosen.add(free_loopback_port())
        etcd_client, etcd_peer, apiserver = sorted(chosen)
        return Ports(etcd_client=etcd_client, etcd_peer=etcd_peer, apiserver=apiserver)

    def _first_setup(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._certificates = make_certificates(
            self.workdir / "pki", now=datetime.datetime.now(datetime.UTC)
        )
        (self.workdir / "unreachable.kubeconfig").write_text(
            yaml.safe_dump(render_unreachable_kubeconfig()), encoding="utf-8"
        )
        self._ports = self._pick_ports()
        self._write_process_specs()
        atexit.register(self.close)

    def _write_process_specs(self) -> None:
        ports = self._require_ports()
        logs = self.workdir / "logs"
        self._etcd = ManagedProcess(
            "etcd",
            render_etcd_args(self.paths.etcd, data_dir=self.workdir / "etcd", ports=ports),
            logs / "etcd.log",
        )
        self._apiserver = ManagedProcess(
            "apiserver",
            render_apiserver_args(
                self.paths.apiserver,
                ports=ports,
                certificates=self.certificates,
                unreachable_kubeconfig=self.workdir / "unreachable.kubeconfig",
            ),
            logs / "apiserver.log",
        )
        self.kubeconfig.write_text(
            yaml.safe_dump(render_kubeconfig(server=self.url, certificates=self.certificates)),
            encoding="utf-8",
        )

    def _start_processes(self) -> None:
        assert self._etcd is not None
        assert self._apiserver is not None
        if not self._etcd.running():
            self._etcd.start()
            self._wait_until(self._etcd_healthy, self._etcd, "etcd")
        if not self._apiserver.running():
            self._apiserver.start()
            self._wait_until(self.healthy, self._apiserver, "apiextensions-apiserver")

    def _stop_processes(self) -> None:
        for process in (self._apiserver, self._etcd):
            if process is not None:
                process.stop()

    def _etcd_healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self._require_ports().etcd_client}/health"
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _wait_until(self, check: Any, process: ManagedProcess, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if check():
                return
            if not process.running():
                raise KubernetesUnavailableError(
                    f"{what} exited during start-up:\n{self.log_tail()}"
                )
            time.sleep(0.2)
        raise KubernetesUnavailableError(
            f"{what} not healthy after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    def _ssl_context(self) -> ssl.SSLContext:
        certificates = self.certificates
        context = ssl.create_default_context(cafile=str(certificates.ca))
        context.load_cert_chain(str(certificates.client_cert), str(certificates.client_key))
        return context


# --------------------------------------------------------------------------------------------
# Loading the Trainer manifests (any API server)
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


def load_trainer_manifests(kubeconfig: Path, paths: Paths, *, timeout: float = 90.0) -> None:
    """Create the Trainer CRDs (skip those that exist), wait for Established, add the runtimes.

    Raises:
        KubernetesUnavailableError: a CRD was not Established within *timeout* seconds, or
            the server refused a manifest.
    """
    create_crds(kubeconfig, paths.crds, TRAINER_CRD_NAMES, timeout=timeout)
    create_cluster_runtimes(kubeconfig, paths.runtimes, timeout=timeout)


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


# --------------------------------------------------------------------------------------------
# Choosing an API: external cluster, K3s in Docker, or the local pair
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KubeEndpoint:
    """A Kubernetes API with the Trainer CRDs, and how to reach it."""

    kubeconfig: Path
    source: str
    """`TUNELOOP_KUBECONFIG`, `k3s` or `local`."""
    server: LocalKubeAPI | LocalControlPlane | None = None
    """The local server when we started it (tests can stop/start it), else None."""

    def api_client(self) -> Any:
        """A fresh `kubernetes.client.ApiClient` for this API (close it when done)."""
        return new_api_client(self.kubeconfig)


def docker_answers() -> bool:
    """A Docker engine answers a ping within 3 s (the CLI alone is not enough)."""
    if os.environ.get("TUNELOOP_NO_DOCKER"):
        return False
    try:
        import docker

        return bool(docker.from_env(timeout=3).ping())
    except Exception:  # any failure means "no usable engine", which is the answer we need
        return False


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


@contextlib.contextmanager
def connect(workdir: Path) -> Iterator[KubeEndpoint]:
    """Yield a Kubernetes API with the Trainer CRDs: external, K3s or local (see module doc).

    Raises:
        KubernetesUnavailableError: the chosen API cannot be reached or started, or the local
            binaries are not built (run `make services`).
    """
    external = os.environ.get("TUNELOOP_KUBECONFIG")
    if external:
        path = Path(external).expanduser()
        if not path.is_file():
            raise KubernetesUnavailableError(f"TUNELOOP_KUBECONFIG={external}: no such file")
        _require_trainer_crds(path)
        yield KubeEndpoint(kubeconfig=path, source="TUNELOOP_KUBECONFIG")
        return
    if docker_answers():
        with _k3s(workdir) as endpoint:
            yield endpoint
        return
    if os.environ.get(LOCAL_KUBERNETES_VARIABLE, "apiserver") == "control-plane":
        from devservices.control_plane import local_control_plane

        # Only `torch-distributed`, as on the apiextensions pair: the suites install tuneloop's
        # runtimes themselves when they need them.
        with local_control_plane(workdir, runtime_files=()) as plane:
            yield KubeEndpoint(kubeconfig=plane.kubeconfig, source="control-plane", server=plane)
        return
    paths = installed_paths()
    if paths is None:
        raise KubernetesUnavailableError(
            f"apiextensions-apiserver/etcd are not built in {cache_root() / 'bin'}: "
            "run `make services` (or `python -m devservices prepare`)"
        )
    with LocalKubeAPI(paths, workdir) as server:
        yield KubeEndpoint(kubeconfig=server.kubeconfig, source="local", server=server)


@contextlib.contextmanager
def _k3s(workdir: Path) -> Iterator[KubeEndpoint]:
    from testcontainers.community.k3s import K3SContainer

    # Without a local binary build we still need the manifests, never the binaries.
    crds, runtimes, source = trainer_manifests(cache_root())
    container = K3SContainer()
    container.start()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = workdir / "k3s.kubeconfig"
        kubeconfig.write_text(container.config_yaml(), encoding="utf-8")
        manifests = Paths(
            apiserver=Path(),
            etcd=Path(),
            crds=crds,
            runtimes=runtimes,
            manifest_source=source,
        )
        load_trainer_manifests(kubeconfig, manifests)
        yield KubeEndpoint(kubeconfig=kubeconfig, source="k3s")
    finally:
        container.stop()

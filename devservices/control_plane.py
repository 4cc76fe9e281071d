"""A local Kubernetes control plane with the real controllers, on 127.0.0.1 only.

What runs (each its own process, logs under `<workdir>/logs/`):
- etcd (deploy/local/etcd);
- `kube-apiserver` and `kube-controller-manager` from k8s.io/kubernetes v1.37.2
  (deploy/local/kubernetes): RBAC, ServiceAccount tokens (TokenRequest, TokenReview), admission
  webhooks; the controller manager runs only the job, deployment, replica-set,
  ServiceAccount, token, root-CA, namespace and garbage-collector controllers;
- the JobSet controller v0.12.0 and the Kubeflow Trainer controller v2.3.0
  (deploy/local/kubeflow), their webhooks served on 127.0.0.1 with certificates we issue, the
  Trainer's `TrainJobStatus` feature gate on;
- the node agent (`devservices/node_agent.py`), which runs pods as local processes.

Nothing ever sends traffic to a non-loopback address: there is no kube-proxy, Services get an
IP from `SERVICE_CLUSTER_IP_RANGE` for bookkeeping only, the API server publishes no endpoints
for itself, and the node agent gives pods no service environment variables and resolves pod
and Service names to 127.0.0.1.

It is the only local Kubernetes. `LocalControlPlane` is the one start/stop object: every
Kubernetes suite shares one per test session through `tests/fixtures/kubernetes.py` (the
`control_plane` and `kube_api` fixtures), the benchmarks get it from
`devservices.kubernetes.connect()`, and newcomers from `tuneloop services up --kubernetes`.
Suites that must not run trainers put their objects in namespaces labelled
`tuneloop.io/node-agent=hold` (`devservices.kubernetes.create_namespace(hold_pods=True)`):
the controllers act there, and the node agent leaves the pods Pending.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devservices import kubernetes as local_kubernetes
from devservices.kubernetes import (
    REPO_ROOT,
    Certificates,
    KubernetesUnavailableError,
    cache_root,
    free_loopback_port,
    go_environment,
    make_certificates,
    render_etcd_args,
    render_kubeconfig,
)

KUBERNETES_WRAPPER_DIR = REPO_ROOT / "deploy" / "local" / "kubernetes"
KUBEFLOW_WRAPPER_DIR = REPO_ROOT / "deploy" / "local" / "kubeflow"
KUBERNETES_COMMANDS = (
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
)
KUBEFLOW_COMMANDS = (
    "sigs.k8s.io/jobset",
    "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
)
KUBERNETES_VERSION = "v1.37.2"
"""k8s.io/kubernetes as deploy/local/kubernetes/go.mod requires it, stamped into the binaries."""
JOBSET_MODULE = "sigs.k8s.io/jobset"
JOBSET_VERSION = "v0.12.0"

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"
"""Needed by the API server to allocate Service IPs; nothing routes to them, ever."""

_STATELESS = frozenset({"kube-apiserver", "kube-controller-manager", "jobset", "trainer"})
"""The processes whose state is all in etcd: stopping them may kill them."""
_QUICK_STOP_SECONDS = 1.0
"""How long they get after SIGTERM. kube-apiserver and the Trainer otherwise sit out the
whole 10 s grace before the SIGKILL (measured: each stop took 10.0 s), once per API-outage
test and at the end of every session."""

TRAINER_NAMESPACE = "kubeflow-system"
"""Where the Trainer looks for its webhook secret (it reads no in-cluster namespace file)."""
TRAINER_SERVICE = "kubeflow-trainer-controller-manager"
TRAINER_SECRET = "kubeflow-trainer-webhook-cert"  # noqa: S105 (a Secret's name)
TRAINER_SERVICE_HOST = f"{TRAINER_SERVICE}.{TRAINER_NAMESPACE}.svc"
"""The status server's host in `KUBEFLOW_TRAINER_SERVER_URL`: on our certificate, and the
node agent resolves it to 127.0.0.1."""
NODE_NAME = "tuneloop-local"

KUBE_CONTROLLERS = (
    "job-controller",
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "garbage-collector-controller",
)
"""The controller manager's controllers: what Jobs, Deployments (the Helm chart's worker),
pods' tokens and deletions need, no more (no node lifecycle, no endpoints, no cloud)."""

_WEBHOOK_CERT_PARENT = Path("/tmp/k8s-webhook-server")  # noqa: S108 (the Trainer's fixed path)
"""The Trainer reads its status server's certificate from this fixed path (pkg/util/cert)."""
_IN_CLUSTER_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""The Trainer reads its namespace here, and a token whose `iss` names the issuer that its
status server then discovers over OIDC (pkg/statusserver/auth.go)."""
TRAINER_SERVICE_ACCOUNT = TRAINER_SERVICE


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------


def _module_stamp(directory: Path, ldflags: str) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "tools.go"):
        digest.update((directory / name).read_bytes())
    if ldflags:
        digest.update(ldflags.encode())
    return f"{directory.name}-wrapper sha256:{digest.hexdigest()[:16]}"


def version_ldflags(version: str) -> str:
    """The linker flags that stamp *version* into `k8s.io/component-base/version`, as
    Kubernetes' own build does (hack/lib/version.sh). Without them the API server reports
    `v0.0.0-master+$Format:%H$`, and clients that check its version refuse it (helm installs
    no chart with a `kubeVersion`). Only the link step changes: the compiled packages are
    reused from Go's build cache."""
    major, minor = version.removeprefix("v").split(".")[:2]
    stamped = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    return " ".join(f"-X k8s.io/component-base/version.{k}={v}" for k, v in stamped.items())


def _build_module(
    cache: Path, directory: Path, packages: Sequence[str], *, cold: str, ldflags: str = ""
) -> dict[str, Path]:
    """`go build` *packages* of the wrapper module *directory* into *cache*/bin, once."""
    bin_dir = cache / "bin"
    binaries = {Path(package).name: bin_dir / Path(package).name for package in packages}
    stamp = _module_stamp(directory, ldflags)
    if all(local_kubernetes.stamp_matches(binary, stamp) for binary in binaries.values()):
        return binaries
    local_kubernetes.progress(f"building {', '.join(binaries)} from {directory} (cold: {cold})")
    bin_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=bin_dir, prefix=f".{directory.name}-build-") as staging:
        local_kubernetes.run_go(
            ["build", "-trimpath", f"-ldflags=-s -w {ldflags}", "-o", staging + "/", *packages],
            env=go_environment(cache),
            cwd=directory,
            log=cache / "logs" / f"build-{directory.name}.log",
            what=", ".join(binaries),
        )
        # Renamed into place: a half-written binary is never taken for a built one.
        for name, binary in binaries.items():
            os.replace(Path(staging) / name, binary)
            local_kubernetes.write_stamp(binary, stamp)
    return binaries


@dataclass(frozen=True, slots=True)
class ControlPlaneBinaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    jobset: Path
    trainer: Path


def build_control_plane(cache: Path | None = None) -> ControlPlaneBinaries:
    """Build etcd, the Kubernetes control plane and the two controllers; a no-op when warm.

    Raises:
        KubernetesUnavailableError: Go is missing or a build failed (the log tail says why).
    """
    cache = cache or cache_root()
    etcd = local_kubernetes.build_etcd(cache)
    kubernetes = _build_module(
        cache,
        KUBERNETES_WRAPPER_DIR,
        KUBERNETES_COMMANDS,
        cold="about 10 min on 2 cores",
        ldflags=version_ldflags(KUBERNETES_VERSION),
    )
    kubeflow = _build_module(
        cache, KUBEFLOW_WRAPPER_DIR, KUBEFLOW_COMMANDS, cold="about 3 min more"
    )
    return ControlPlaneBinaries(
        etcd=etcd,
        kube_apiserver=kubernetes["kube-apiserver"],
        kube_controller_manager=kubernetes["kube-controller-manager"],
        jobset=kubeflow["jobset"],
        trainer=kubeflow["trainer-controller-manager"],
    )


def installed_binaries(cache: Path | None = None) -> ControlPlaneBinaries | None:
    """The built binaries, or None when one is missing (run `make services`)."""
    bin_dir = (cache or cache_root()) / "bin"
    binaries = ControlPlaneBinaries(
        etcd=bin_dir / "etcd",
        kube_apiserver=bin_dir / "kube-apiserver",
        kube_controller_manager=bin_dir / "kube-controller-manager",
        jobset=bin_dir / "jobset",
        trainer=bin_dir / "trainer-controller-manager",
    )
    present = all(
        path.is_file()
        for path in (
            binaries.etcd,
            binaries.kube_apiserver,
            binaries.kube_controller_manager,
            binaries.jobset,
            binaries.trainer,
        )
    )
    return binaries if present else None


def prepare() -> None:
    """Entry point of `python -m devservices prepare kubernetes` (and of `make services`)."""
    started = time.monotonic()
    binaries = build_control_plane()
    local_kubernetes.progress(
        f"control plane built in {time.monotonic() - started:.0f} s "
        f"into {binaries.kube_apiserver.parent}"
    )


def _module_dir(cache: Path, module: str, version: str) -> Path:
    """A Go module's source in the module cache (downloaded by the build)."""
    directory = cache / "go" / "mod" / f"{module}@{version}"
    if not directory.is_dir():
        raise KubernetesUnavailableError(f"{module}@{version} is not in {directory.parent}")
    return directory


# --------------------------------------------------------------------------------------------
# Command lines and configuration files (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControlPlanePorts:
    """Loopback ports, kept across stop()/start() so clients reconnect."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    jobset_webhook: int
    jobset_health: int
    trainer_webhook: int
    trainer_health: int
    trainer_status: int


@dataclass(frozen=True, slots=True)
class ControlPlaneFiles:
    """The files the processes read: certificates, the ServiceAccount key, kubeconfig."""

    certificates: Certificates
    service_account_key: Path
    kubeconfig: Path
    jobset_certs: Path
    trainer_certs: Path
    """Mounted on `/tmp/k8s-webhook-server` in the Trainer's own mount namespace."""


def render_kube_apiserver_args(
    binary: Path, *, ports: ControlPlanePorts, files: ControlPlaneFiles
) -> tuple[str, ...]:
    certificates = files.certificates
    return (
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--etcd-prefix={local_kubernetes.ETCD_PREFIX}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={certificates.server_cert}",
        f"--tls-private-key-file={certificates.server_key}",
        f"--client-ca-file={certificates.ca}",
        "--authorization-mode=RBAC",
        # The issuer is the API server's own loopback URL: the Trainer's status server discovers
        # its keys over OIDC at `<issuer>/.well-known/openid-configuration`, and nothing may
        # ever call a Service address.
        f"--service-account-issuer=https://127.0.0.1:{ports.apiserver}",
        f"--service-account-key-file={files.service_account_key}",
        f"--service-account-signing-key-file={files.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        # The API server would publish its own (loopback) address as the `kubernetes` Service's
        # endpoint; nothing may route there, so it publishes none.
        "--endpoint-reconciler-type=none",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
    )


def render_kube_controller_manager_args(
    binary: Path, *, files: ControlPlaneFiles, api_qps: int | None = None
) -> tuple[str, ...]:
    """The controller manager's command line. *api_qps* raises its client's rate limit
    (burst: twice as much) from client-go's default of 20 requests/s; None keeps the
    default, as a cluster's controller manager has it."""
    limits = (
        () if api_qps is None else (f"--kube-api-qps={api_qps}", f"--kube-api-burst={2 * api_qps}")
    )
    return (
        str(binary),
        f"--kubeconfig={files.kubeconfig}",
        "--leader-elect=false",
        f"--controllers={','.join(KUBE_CONTROLLERS)}",
        f"--service-account-private-key-file={files.service_account_key}",
        f"--root-ca-file={files.certificates.ca}",
        "--use-service-account-credentials=false",
        # It serves nothing we read; 0 turns its HTTPS endpoint off.
        "--secure-port=0",
        "--profiling=false",
        *limits,
    )


def render_jobset_config(ports: ControlPlanePorts, files: ControlPlaneFiles) -> dict[str, Any]:
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {
            "port": ports.jobset_webhook,
            "host": "127.0.0.1",
            "certDir": str(files.jobset_certs),
        },
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.jobset_health}"},
        "metrics": {"bindAddress": "0"},
    }


def render_trainer_config(ports: ControlPlanePorts) -> dict[str, Any]:
    """The Trainer's Configuration (pkg/apis/config/v1alpha1), read from the v2.3.0 module."""
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{ports.trainer_health}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": ports.trainer_webhook, "host": "127.0.0.1"},
        "leaderElection": {
            "leaderElect": False,
            "resourceName": "trainer.kubeflow.org",
            "leaseDuration": "15s",
            "renewDeadline": "10s",
            "retryPeriod": "2s",
        },
        # "certificates must be provided externally": we issue them (ControlPlaneFiles).
        "certManagement": {
            "enable": False,
            "webhookServiceName": TRAINER_SERVICE,
            "webhookSecretName": TRAINER_SECRET,
        },
        "statusServer": {"port": ports.trainer_status},
        "featureGates": {"TrainJobStatus": True},
    }


def unshare_available() -> bool:
    """`unshare --mount` works here (root, or a user namespace the kernel allows)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "true"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def with_private_mounts(
    mounts: Sequence[tuple[Path, Path]], command: Sequence[str]
) -> tuple[str, ...]:
    """*command* in its own mount namespace, each (source, target) of *mounts* bind-mounted.

    The Trainer reads fixed paths: its status server's certificate under /tmp, and the
    ServiceAccount token (to find the token issuer) and namespace under /var/run/secrets. A
    private mount namespace gives each control plane its own without touching the host's.
    """
    script = "".join(
        f"mkdir -p {shlex.quote(str(target))} && "
        f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))} && "
        for source, target in mounts
    )
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        script + 'exec "$@"',
        "sh",
        *command,
    )


def webhook_configurations(
    documents: Sequence[dict[str, Any]], *, prefix: str, port: int, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """The controllers' webhook configurations, pointed at https://127.0.0.1:*port*.

    Upstream points them at a Service; ours call the controller on loopback by URL. Names get
    *prefix* (JobSet's and the Trainer's are both `validating-webhook-configuration`), and
    JobSet's pod webhooks get the object selector its kustomize patch adds.
    """
    rendered = []
    for document in documents:
        copy = json.loads(json.dumps(document))
        copy["metadata"] = {"name": f"{prefix}-{document['metadata']['name']}"}
        for webhook in copy["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            if webhook["name"] in ("mpod.kb.io", "vpod.kb.io"):
                webhook["objectSelector"] = {
                    "matchExpressions": [
                        {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}
                    ]
                }
        rendered.append(copy)
    return rendered


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def _make_service_account_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _http_ok(url: str, *, context: Any = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as answer:  # noqa: S310
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class LocalControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, JobSet, Trainer and the node agent.

    `start()` brings up what is not running and waits for each to be healthy (on first start:
    ports, certificates, kubeconfig, CRDs, webhooks, runtimes); `stop()` stops all but keeps
    etcd's data and the ports; `close()` stops for good. Usable as a context manager.
    """

    def __init__(
        self,
        binaries: ControlPlaneBinaries,
        workdir: Path,
        *,
        startup_timeout: float = 120.0,
        runtime_files: Sequence[Path] = (),
        controller_api_qps: int | None = None,
    ) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.startup_timeout = startup_timeout
        self.runtime_files = tuple(runtime_files)
        self.controller_api_qps = controller_api_qps
        """The controller manager's client rate limit (`render_kube_controller_manager_args`)."""
        self.kubeconfig = workdir / "kubeconfig.yaml"
        self._ports: ControlPlanePorts | None = None
        self._files: ControlPlaneFiles | None = None
        self._processes: dict[str, local_kubernetes.ManagedProcess] = {}
        self._loaded = False
        self._controllers_lost_the_server = False

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def ports(self) -> ControlPlanePorts:
        if self._ports is None:
            raise RuntimeError("LocalControlPlane has not been started")
        return self._ports

    @property
    def files(self) -> ControlPlaneFiles:
        if self._files is None:
            raise RuntimeError("LocalControlPlane has not been started")
        return self._files

    @property
    def certificates(self) -> Certificates:
        return self.files.certificates

    @property
    def pids(self) -> dict[str, int]:
        return {
            name: process.popen.pid
            for name, process in self._processes.items()
            if process.popen is not None and process.running()
        }

    @property
    def _trainer_account_dir(self) -> Path:
        return self.workdir / "trainer-serviceaccount"

    @property
    def pods_dir(self) -> Path:
        """Where the node agent keeps each pod's volumes and container logs."""
        return self.workdir / "node"

    def start(self) -> None:
        """Start what is not running, in dependency order, each waited for.

        Raises:
            KubernetesUnavailableError: a process exited or did not get healthy in time (the
                message carries the end of its log).
        """
        if self._ports is None:
            self._first_setup()
        self._start("etcd", self._etcd_healthy)
        self._start("kube-apiserver", self.healthy)
        if self._controllers_lost_the_server:
            self._restart_controllers()
        self._start("kube-controller-manager", self._default_service_account_exists)
        if not self._loaded:
            self._load_before_controllers()
        self._start(
            "jobset", lambda: _http_ok(f"http://127.0.0.1:{self.ports.jobset_health}/readyz")
        )
        self._start(
            "trainer", lambda: _http_ok(f"http://127.0.0.1:{self.ports.trainer_health}/readyz")
        )
        self._start("node-agent", self._node_ready)
        if not self._loaded:
            self._load_after_controllers()
            self._loaded = True

    def stop(self) -> None:
        """Stop every process, the node agent first and etcd last (data and ports kept).

        etcd gets its full grace to close its data cleanly, and the node agent to stop its
        pods; the Go API server and controllers keep nothing of their own and are killed
        after `_QUICK_STOP_SECONDS`."""
        for name, process in reversed(list(self._processes.items())):
            if name in _STATELESS:
                process.stop(grace=_QUICK_STOP_SECONDS)
            else:
                process.stop()

    def stop_apiserver(self) -> None:
        """Stop only the API server: clients see connection refused, the rest keeps running.

        The next `start()` restarts the controllers too (see `_restart_controllers`)."""
        self._processes["kube-apiserver"].stop(grace=_QUICK_STOP_SECONDS)
        self._controllers_lost_the_server = True

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(ValueError):
            atexit.unregister(self.close)

    def __enter__(self) -> LocalControlPlane:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def running(self) -> bool:
        return bool(self._processes) and all(p.running() for p in self._processes.values())

    def healthy(self) -> bool:
        return _http_ok(f"{self.url}/readyz", context=self._ssl_context())

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for name in self._processes:
            log = self.workdir / "logs" / f"{name}.log"
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            parts.append(f"--- {log} (last {lines} lines)\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    # -- internals -----------------------------------------------------------------------

    def _first_setup(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        certificates = make_certificates(
            pki,
            now=datetime.datetime.now(datetime.UTC),
            server_dns_names=(TRAINER_SERVICE_HOST, f"{TRAINER_SERVICE_HOST}.cluster.local"),
        )
        service_account_key = pki / "service-account.key"
        _make_service_account_key(service_account_key)
        jobset_certs = self.workdir / "jobset-certs"
        trainer_certs = self.workdir / "trainer-certs"
        for directory in (jobset_certs, trainer_certs / "serving-certs"):
            directory.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(certificates.server_cert, directory / "tls.crt")
            shutil.copyfile(certificates.server_key, directory / "tls.key")
        self._files = ControlPlaneFiles(
            certificates=certificates,
            service_account_key=service_account_key,
            kubeconfig=self.kubeconfig,
            jobset_certs=jobset_certs,
            trainer_certs=trainer_certs,
        )
        chosen: list[int] = []
        while len(chosen) < 8:
            port = free_loopback_port()
            if port not in chosen:
                chosen.append(port)
        self._ports = ControlPlanePorts(*chosen)
        self.kubeconfig.write_text(
            yaml.safe_dump(render_kubeconfig(server=self.url, certificates=certificates)),
            encoding="utf-8",
        )
        self._define_processes()
        atexit.register(self.close)

    def _define_processes(self) -> None:
        ports, files, binaries = self.ports, self.files, self.binaries
        logs = self.workdir / "logs"
        config_dir = self.workdir / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        jobset_config = config_dir / "jobset.yaml"
        jobset_config.write_text(yaml.safe_dump(render_jobset_config(ports, files)))
        trainer_config = config_dir / "trainer.yaml"
        trainer_config.write_text(yaml.safe_dump(render_trainer_config(ports)))
        trainer_command: tuple[str, ...] = (
            str(binaries.trainer),
            f"--config={trainer_config}",
            "--feature-gates=TrainJobStatus=true",
        )
        if not unshare_available():
            raise KubernetesUnavailableError(
                "the local control plane needs `unshare --mount` (root or user namespaces): the "
                "Trainer reads fixed paths that each control plane must give it privately"
            )
        trainer_command = with_private_mounts(
            (
                (files.trainer_certs, _WEBHOOK_CERT_PARENT),
                (self._trainer_account_dir, _IN_CLUSTER_ACCOUNT),
            ),
            trainer_command,
        )
        controller_env = {"KUBECONFIG": str(files.kubeconfig)}
        definitions: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
            "etcd": (
                render_etcd_args(
                    binaries.etcd, data_dir=self.workdir / "etcd", ports=self._etcd_ports()
                ),
                {},
            ),
            "kube-apiserver": (
                render_kube_apiserver_args(binaries.kube_apiserver, ports=ports, files=files),
                {},
            ),
            "kube-controller-manager": (
                render_kube_controller_manager_args(
                    binaries.kube_controller_manager,
                    files=files,
                    api_qps=self.controller_api_qps,
                ),
                {},
            ),
            "jobset": (
                (str(binaries.jobset), f"--config={jobset_config}", "--zap-log-level=info"),
                controller_env,
            ),
            "trainer": (trainer_command, controller_env),
            "node-agent": (
                (
                    sys.executable,
                    "-m",
                    "devservices.node_agent",
                    f"--kubeconfig={files.kubeconfig}",
                    f"--root={self.pods_dir}",
                    f"--node-name={NODE_NAME}",
                ),
                {"PYTHONPATH": str(REPO_ROOT)},
            ),
        }
        self._processes = {
            name: local_kubernetes.ManagedProcess(name, args, logs / f"{name}.log", extra_env=env)
            for name, (args, env) in definitions.items()
        }

    def _etcd_ports(self) -> local_kubernetes.EtcdPorts:
        return local_kubernetes.EtcdPorts(client=self.ports.etcd_client, peer=self.ports.etcd_peer)

    def _restart_controllers(self) -> None:
        """Stop the Go controllers after an API server outage, for `start()` to start afresh.

        client-go's informers back off after a lost connection (0.8 s doubling to 30 s, with
        up to as much again in jitter), and until they list again the controllers act on
        nothing. Measured here: a TrainJob created right after a 20 s outage got its JobSet
        42 s and its pod 71 s later; right after a restart, within a second. A cluster's
        controllers would wait that out; the tests after an outage test must not. (The node
        agent retries every second and keeps its pods running, so it stays.)"""
        for name in ("trainer", "jobset", "kube-controller-manager"):
            self._processes[name].stop(grace=_QUICK_STOP_SECONDS)
        self._controllers_lost_the_server = False

    def _start(self, name: str, healthy: Callable[[], bool]) -> None:
        process = self._processes[name]
        if process.running():
            return
        process.start()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if healthy():
                return
            if not process.running():
                raise KubernetesUnavailableError(
                    f"{name} exited during start-up:\n{self.log_tail()}"
                )
            time.sleep(0.25)
        raise KubernetesUnavailableError(
            f"{name} not healthy after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    def _etcd_healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.ports.etcd_client}/health"
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _ssl_context(self) -> Any:
        import ssl

        certificates = self.certificates
        context = ssl.create_default_context(cafile=str(certificates.ca))
        context.load_cert_chain(str(certificates.client_cert), str(certificates.client_key))
        return context

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(  # noqa: S310 (our own https URL)
                f"{self.url}{path}", context=self._ssl_context(), timeout=5
            ) as answer:
                document: dict[str, Any] = json.loads(answer.read())
                return document
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def _default_service_account_exists(self) -> bool:
        return self._get("/api/v1/namespaces/default/serviceaccounts/default") is not None

    def _node_ready(self) -> bool:
        node = self._get(f"/api/v1/nodes/{NODE_NAME}")
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _load_before_controllers(self) -> None:
        """CRDs (Trainer and JobSet), the Trainer's namespace and webhook secret."""
        from kubernetes import client

        cache = cache_root()
        crds, _runtimes, source = local_kubernetes.trainer_manifests(cache)
        jobset_dir = _module_dir(cache, JOBSET_MODULE, JOBSET_VERSION)
        jobset_crd = (
            jobset_dir / "config" / "components" / "crd" / "bases" / "jobset.x-k8s.io_jobsets.yaml"
        )
        local_kubernetes.create_crds(
            self.kubeconfig,
            (*crds, jobset_crd),
            (*local_kubernetes.TRAINER_CRD_NAMES, "jobsets.jobset.x-k8s.io"),
            timeout=self.startup_timeout,
        )
        certificates = self.certificates
        with local_kubernetes.new_api_client(self.kubeconfig) as api:
            core = client.CoreV1Api(api)
            _create_ignoring_conflict(
                core.create_namespace, {"metadata": {"name": TRAINER_NAMESPACE}}
            )
            secret = {
                "metadata": {"name": TRAINER_SECRET, "namespace": TRAINER_NAMESPACE},
                "type": "kubernetes.io/tls",
                "data": {
                    key: base64.b64encode(path.read_bytes()).decode()
                    for key, path in (
                        ("ca.crt", certificates.ca),
                        ("tls.crt", certificates.server_cert),
                        ("tls.key", certificates.server_key),
                    )
                },
            }
            _create_ignoring_conflict(core.create_namespaced_secret, TRAINER_NAMESPACE, secret)
            _create_ignoring_conflict(
                core.create_namespaced_service_account,
                TRAINER_NAMESPACE,
                {"metadata": {"name": TRAINER_SERVICE_ACCOUNT}},
            )
            # Read once, at start-up, for its issuer: a week outlives any local session.
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7 * 24 * 3600)
            )
            answer = core.create_namespaced_service_account_token(
                TRAINER_SERVICE_ACCOUNT, TRAINER_NAMESPACE, request
            )
            if answer.status is None or not answer.status.token:
                raise KubernetesUnavailableError("the API server issued no ServiceAccount token")
            token: str = answer.status.token
        account = self._trainer_account_dir
        account.mkdir(parents=True, exist_ok=True)
        (account / "token").write_text(token, encoding="utf-8")
        (account / "namespace").write_text(TRAINER_NAMESPACE, encoding="utf-8")
        shutil.copyfile(certificates.ca, account / "ca.crt")
        local_kubernetes.progress(
            f"control plane: CRDs from {source} and {JOBSET_MODULE}@{JOBSET_VERSION}"
        )

    def _load_after_controllers(self) -> None:
        """Webhook configurations, then the runtimes (the Trainer's webhook validates them)."""
        from kubernetes import client

        cache = cache_root()
        trainer_dir = local_kubernetes.trainer_module_dir(cache)
        jobset_dir = _module_dir(cache, JOBSET_MODULE, JOBSET_VERSION)
        ca = self.certificates.ca.read_bytes()
        configurations = [
            *webhook_configurations(
                local_kubernetes.documents(
                    trainer_dir / "manifests" / "base" / "webhook" / "manifests.yaml"
                ),
                prefix="trainer",
                port=self.ports.trainer_webhook,
                ca_bundle=ca,
            ),
            *webhook_configurations(
                local_kubernetes.documents(
                    jobset_dir / "config" / "components" / "webhook" / "manifests.yaml"
                ),
                prefix="jobset",
                port=self.ports.jobset_webhook,
                ca_bundle=ca,
            ),
        ]
        with local_kubernetes.new_api_client(self.kubeconfig) as api:
            admission = client.AdmissionregistrationV1Api(api)
            create: dict[str, Callable[..., object]] = {
                "MutatingWebhookConfiguration": admission.create_mutating_webhook_configuration,
                "ValidatingWebhookConfiguration": admission.create_validating_webhook_configuration,
            }
            for configuration in configurations:
                _create_ignoring_conflict(create[configuration["kind"]], configuration)
        _crds, runtimes, _source = local_kubernetes.trainer_manifests(cache)
        local_kubernetes.create_cluster_runtimes(
            self.kubeconfig, (*runtimes, *self.runtime_files), timeout=self.startup_timeout
        )


def _create_ignoring_conflict(create: Callable[..., object], *args: object) -> None:
    """`create(*args)`; an object that already exists (409) is the one we wanted."""
    from kubernetes.client.exceptions import ApiException

    try:
        create(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise


def shipped_runtime_files() -> tuple[Path, ...]:
    """tuneloop's ClusterTrainingRuntimes, as the end-to-end tests and the chart install them."""
    return tuple(sorted((REPO_ROOT / "deploy" / "runtimes").glob("*.yaml")))


@contextlib.contextmanager
def local_control_plane(
    workdir: Path,
    *,
    runtime_files: Sequence[Path] | None = None,
    controller_api_qps: int | None = None,
) -> Iterator[LocalControlPlane]:
    """Yield a started `LocalControlPlane`; stop it on exit.

    *runtime_files*: the ClusterTrainingRuntimes installed besides the Trainer's
    `torch-distributed`; by default tuneloop's own (`shipped_runtime_files()`).
    *controller_api_qps*: the controller manager's client rate limit (None: client-go's).

    Raises:
        KubernetesUnavailableError: the binaries are not built (run `make services`) or a
            process did not start.
    """
    binaries = installed_binaries()
    if binaries is None:
        raise KubernetesUnavailableError(
            f"the control plane is not built in {cache_root() / 'bin'}: run `make services` "
            "(or `python -m devservices prepare kubernetes`)"
        )
    if runtime_files is None:
        runtime_files = shipped_runtime_files()
    with LocalControlPlane(
        binaries, workdir, runtime_files=runtime_files, controller_api_qps=controller_api_qps
    ) as plane:
        yield plane

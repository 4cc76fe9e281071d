"""How the local Kubernetes API is configured: certificates, kubeconfigs, command lines, cache.

No server runs here; the real one is exercised by tests/integration/test_kubernetes_api.py.
"""

from __future__ import annotations

import datetime
import shutil
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devservices import kubernetes as local_kubernetes
from devservices.kubernetes import (
    Certificates,
    EtcdPorts,
    make_certificates,
    render_etcd_args,
    render_kubeconfig,
)

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
ETCD_PORTS = EtcdPorts(client=20001, peer=20002)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("pki"), now=NOW, days=2)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def flags(args: tuple[str, ...]) -> dict[str, str]:
    return dict(arg.removeprefix("--").partition("=")[::2] for arg in args[1:])


# --- certificates ---------------------------------------------------------------------------


def test_client_certificate_is_in_the_system_masters_group_and_signed_by_the_ca(certificates):
    ca, client = load(certificates.ca), load(certificates.client_cert)

    client.verify_directly_issued_by(ca)
    organisations = client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in organisations] == ["system:masters"]
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_server_certificate_names_the_loopback_address_and_localhost(certificates):
    server = load(certificates.server_cert)

    server.verify_directly_issued_by(load(certificates.ca))
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]


def test_certificates_are_valid_from_just_before_now_for_the_days_asked(certificates):
    ca = load(certificates.ca)

    assert ca.not_valid_before_utc < NOW < ca.not_valid_after_utc
    assert ca.not_valid_after_utc == NOW + datetime.timedelta(days=2)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_private_keys_are_readable_by_their_owner_only(certificates):
    assert certificates.server_key.stat().st_mode & 0o077 == 0
    assert certificates.client_key.stat().st_mode & 0o077 == 0


def test_certificates_complete_a_mutual_tls_handshake_on_loopback(tmp_path):
    """What the API server does with them: require a client certificate from our CA."""
    # Made now, not at the fixed NOW: the handshake checks validity against the real clock.
    certificates = make_certificates(tmp_path, now=datetime.datetime.now(datetime.UTC), days=1)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certificates.server_cert, certificates.server_key)
    server_context.load_verify_locations(certificates.ca)
    server_context.verify_mode = ssl.CERT_REQUIRED
    client_context = ssl.create_default_context(cafile=str(certificates.ca))
    client_context.load_cert_chain(certificates.client_cert, certificates.client_key)
    seen_subject: list[Any] = []

    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True) as tls:
                seen_subject.append((tls.getpeercert() or {}).get("subject"))
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve)
        thread.start()
        port = listener.getsockname()[1]
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client_context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
        thread.join(timeout=5)

    assert (("organizationName", "system:masters"),) in seen_subject[0]


# --- kubeconfigs ----------------------------------------------------------------------------


def test_kubeconfig_reaches_the_server_with_the_admin_certificate(certificates, tmp_path):
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(
        yaml.safe_dump(
            render_kubeconfig(server="https://127.0.0.1:20003", certificates=certificates)
        )
    )

    with local_kubernetes.new_api_client(path) as api:
        configuration = api.configuration
        assert configuration.host == "https://127.0.0.1:20003"
        assert configuration.ssl_ca_cert == str(certificates.ca)
        assert configuration.cert_file == str(certificates.client_cert)
        assert configuration.key_file == str(certificates.client_key)
        assert configuration.verify_ssl


# --- command lines --------------------------------------------------------------------------


def test_etcd_listens_on_loopback_only_and_keeps_data_in_the_given_directory(tmp_path):
    args = render_etcd_args(Path("/bin/etcd"), data_dir=tmp_path / "etcd", ports=ETCD_PORTS)

    assert args[0] == "/bin/etcd"
    rendered = flags(args)
    assert rendered["data-dir"] == str(tmp_path / "etcd")
    assert rendered["listen-client-urls"] == "http://127.0.0.1:20001"
    assert rendered["listen-peer-urls"] == "http://127.0.0.1:20002"
    assert rendered["initial-cluster"] == "tuneloop=http://127.0.0.1:20002"
    assert all("0.0.0.0" not in arg for arg in args)


# --- the cache ------------------------------------------------------------------------------


def test_local_servers_trade_heap_for_cpu_unless_the_operator_set_gogc(monkeypatch):
    monkeypatch.delenv("GOGC", raising=False)
    assert local_kubernetes.server_environment()["GOGC"] == local_kubernetes.GO_GC_PERCENT

    monkeypatch.setenv("GOGC", "100")
    assert local_kubernetes.server_environment()["GOGC"] == "100"


def test_local_servers_inherit_the_rest_of_the_environment(monkeypatch):
    monkeypatch.setenv("TUNELOOP_SOMETHING", "kept")
    assert local_kubernetes.server_environment()["TUNELOOP_SOMETHING"] == "kept"


def test_cache_root_honours_tuneloop_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNELOOP_CACHE", str(tmp_path))

    assert local_kubernetes.cache_root() == tmp_path


def test_go_builds_use_the_local_toolchain_and_caches_under_the_cache_root(tmp_path):
    env = local_kubernetes.go_environment(tmp_path)

    assert env["GOTOOLCHAIN"] == "local"
    assert env["GOMODCACHE"] == str(tmp_path / "go" / "mod")
    assert env["GOCACHE"] == str(tmp_path / "go" / "build")


def test_etcd_with_a_matching_version_stamp_is_not_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")  # a build attempt would fail loudly: no go on PATH
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "etcd"
    binary.write_bytes(b"built before")
    (tmp_path / "bin" / "etcd.stamp").write_text(local_kubernetes._etcd_stamp() + "\n")

    assert local_kubernetes.build_etcd(tmp_path) == binary
    assert binary.read_bytes() == b"built before"


def test_etcd_with_a_stale_stamp_is_rebuilt_and_a_missing_go_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "etcd").write_bytes(b"old")
    (tmp_path / "bin" / "etcd.stamp").write_text("etcd-wrapper sha256:0000\n")

    with pytest.raises(local_kubernetes.KubernetesUnavailableError, match="no `go` on PATH"):
        local_kubernetes.build_etcd(tmp_path)


def test_helm_with_a_matching_version_stamp_is_not_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "helm"
    binary.write_bytes(b"built before")
    stamp = f"{local_kubernetes.HELM_PACKAGE}@{local_kubernetes.HELM_VERSION}"
    (tmp_path / "bin" / "helm.stamp").write_text(stamp + "\n")

    assert local_kubernetes.build_helm(tmp_path) == binary
    assert binary.read_bytes() == b"built before"


def test_a_missing_helm_is_built_and_a_missing_go_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")

    with pytest.raises(local_kubernetes.KubernetesUnavailableError, match="no `go` on PATH"):
        local_kubernetes.build_helm(tmp_path)


def test_without_go_the_trainer_manifests_are_refused_naming_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")

    with pytest.raises(local_kubernetes.KubernetesUnavailableError) as error:
        local_kubernetes.trainer_manifests(tmp_path)

    assert "make services" in str(error.value)
    assert "go mod download github.com/kubeflow/trainer/v2@v2.3.0" in str(error.value)


def test_the_trainer_manifests_come_from_the_v2_3_0_go_module():
    if shutil.which("go") is None:
        pytest.skip("needs Go, which `make services` uses to fetch the module")
    cache = local_kubernetes.cache_root()
    if not (cache / "go" / "mod" / "github.com" / "kubeflow" / "trainer").is_dir():
        pytest.skip("the module is not in the cache yet: make services")

    crds, runtimes, source = local_kubernetes.trainer_manifests(cache)

    assert source == "Go module github.com/kubeflow/trainer/v2@v2.3.0"
    assert [p.name for p in crds] == [
        "trainer.kubeflow.org_trainjobs.yaml",
        "trainer.kubeflow.org_trainingruntimes.yaml",
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ]
    assert all("v2@v2.3.0" in str(p) for p in (*crds, *runtimes))
    assert [p.name for p in runtimes] == ["torch_distributed.yaml"]

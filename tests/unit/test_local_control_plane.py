"""The local control plane's command lines and manifests, checked without starting anything."""

from __future__ import annotations

import base64
from pathlib import Path

from devservices.control_plane import (
    KUBE_CONTROLLERS,
    KUBERNETES_VERSION,
    KUBERNETES_WRAPPER_DIR,
    ControlPlaneFiles,
    ControlPlanePorts,
    render_kube_apiserver_args,
    render_kube_controller_manager_args,
    render_trainer_config,
    version_ldflags,
    webhook_configurations,
    with_private_mounts,
)
from devservices.kubernetes import Certificates

PORTS = ControlPlanePorts(
    etcd_client=2379,
    etcd_peer=2380,
    apiserver=6443,
    jobset_webhook=9443,
    jobset_health=8081,
    trainer_webhook=9444,
    trainer_health=8082,
    trainer_status=10443,
)
PKI = Path("/pki")
FILES = ControlPlaneFiles(
    certificates=Certificates(
        ca=PKI / "ca.crt",
        server_cert=PKI / "server.crt",
        server_key=PKI / "server.key",
        client_cert=PKI / "admin.crt",
        client_key=PKI / "admin.key",
    ),
    service_account_key=PKI / "sa.key",
    kubeconfig=Path("/kubeconfig"),
    jobset_certs=Path("/jobset"),
    trainer_certs=Path("/trainer"),
)


def flags(args: tuple[str, ...]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in args[1:])


def test_the_api_server_listens_on_loopback_and_publishes_no_endpoints_of_its_own() -> None:
    given = flags(render_kube_apiserver_args(Path("kube-apiserver"), ports=PORTS, files=FILES))

    assert given["bind-address"] == "127.0.0.1"
    assert given["secure-port"] == "6443"
    assert given["endpoint-reconciler-type"] == "none"
    assert given["etcd-servers"] == "http://127.0.0.1:2379"


def test_the_token_issuer_is_the_api_servers_own_loopback_url_so_oidc_discovery_stays_local() -> (
    None
):
    given = flags(render_kube_apiserver_args(Path("kube-apiserver"), ports=PORTS, files=FILES))

    assert given["service-account-issuer"] == "https://127.0.0.1:6443"
    assert given["service-account-signing-key-file"] == "/pki/sa.key"
    assert given["authorization-mode"] == "RBAC"


def test_the_controller_manager_runs_only_the_listed_controllers_without_leader_election() -> None:
    given = flags(render_kube_controller_manager_args(Path("kube-controller-manager"), files=FILES))

    assert given["controllers"].split(",") == list(KUBE_CONTROLLERS)
    assert "job-controller" in KUBE_CONTROLLERS
    assert given["leader-elect"] == "false"
    assert given["secure-port"] == "0"


def test_the_controller_manager_keeps_client_gos_rate_limit_unless_told_otherwise() -> None:
    default = flags(render_kube_controller_manager_args(Path("kcm"), files=FILES))
    raised = flags(render_kube_controller_manager_args(Path("kcm"), files=FILES, api_qps=200))

    assert "kube-api-qps" not in default
    assert "kube-api-burst" not in default
    assert raised["kube-api-qps"] == "200"
    assert raised["kube-api-burst"] == "400"


def test_the_trainer_serves_on_loopback_with_the_status_server_gate_on_and_our_certificates() -> (
    None
):
    config = render_trainer_config(PORTS)

    assert config["webhook"] == {"port": 9444, "host": "127.0.0.1"}
    assert config["featureGates"] == {"TrainJobStatus": True}
    assert config["certManagement"]["enable"] is False
    assert config["statusServer"] == {"port": 10443}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:8082"


def test_webhooks_are_called_by_loopback_url_with_our_ca_and_keep_their_rules() -> None:
    upstream = {
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            {
                "name": "vjobset.kb.io",
                "clientConfig": {
                    "service": {"name": "webhook-service", "namespace": "system", "path": "/v"}
                },
                "rules": [{"operations": ["CREATE"]}],
            }
        ],
    }

    [rendered] = webhook_configurations([upstream], prefix="jobset", port=9443, ca_bundle=b"CA")

    assert rendered["metadata"] == {"name": "jobset-validating-webhook-configuration"}
    webhook = rendered["webhooks"][0]
    assert webhook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/v",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert webhook["rules"] == [{"operations": ["CREATE"]}]
    assert upstream["webhooks"][0]["clientConfig"]["service"]["path"] == "/v"


def test_jobsets_pod_webhooks_only_see_jobset_pods_as_its_kustomize_patch_says() -> None:
    upstream = {
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [{"name": "mpod.kb.io", "clientConfig": {"service": {"path": "/m"}}}],
    }

    [rendered] = webhook_configurations([upstream], prefix="jobset", port=1, ca_bundle=b"")

    assert rendered["webhooks"][0]["objectSelector"] == {
        "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
    }


def test_a_private_mount_runs_the_command_after_binding_each_directory() -> None:
    command = with_private_mounts([(Path("/a b"), Path("/tmp/x"))], ["trainer", "--config=c"])

    assert command[:5] == ("unshare", "--mount", "--propagation", "private", "--")
    assert command[-2:] == ("trainer", "--config=c")
    assert "mount --bind '/a b' /tmp/x" in command[7]


def test_the_stamped_kubernetes_version_is_the_one_the_wrapper_module_requires() -> None:
    go_mod = (KUBERNETES_WRAPPER_DIR / "go.mod").read_text()
    assert f"require k8s.io/kubernetes {KUBERNETES_VERSION}\n" in go_mod


def test_the_binaries_report_their_release_as_kubernetes_own_build_stamps_it() -> None:
    assert version_ldflags("v1.37.2").split() == [
        "-X",
        "k8s.io/component-base/version.gitVersion=v1.37.2",
        "-X",
        "k8s.io/component-base/version.gitMajor=1",
        "-X",
        "k8s.io/component-base/version.gitMinor=37",
        "-X",
        "k8s.io/component-base/version.gitTreeState=clean",
    ]

"""The Helm chart: `helm lint`, and what `helm template` renders, checked three ways.

The test API server has only the Trainer CRDs (no Deployment or RBAC kinds), so the rendered
objects are checked here instead:

1. `helm lint --strict` on the chart;
2. each rendered object survives a round trip through the kubernetes client's typed model
   of its kind unchanged: a misspelled or misplaced field would be dropped and show up as a
   difference (the models know every field of the core API);
3. the RBAC grants exactly `runtimes.kubernetes.backend.RBAC_RULES`, and secrets are only
   referenced, never rendered.

helm is found as `$TUNELOOP_HELM`, on PATH, or in `$TUNELOOP_CACHE/bin`, where `make services`
(`python -m devservices prepare helm`) builds it: about 4 min cold on 2 cores, then
cached. Without it these tests skip and say so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from runtimes.kubernetes.backend import CORE_RBAC_RULES, RBAC_RULES

CHART = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "tuneloop"
MODELS = {
    "Deployment": "V1Deployment",
    "ServiceAccount": "V1ServiceAccount",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "ConfigMap": "V1ConfigMap",
    "Service": "V1Service",
    "PersistentVolumeClaim": "V1PersistentVolumeClaim",
}
SASL = (
    "--set",
    "kafka.securityProtocol=SASL_SSL",
    "--set",
    "kafka.sasl.existingSecret=kafka-credentials",
    "--set",
    "kafka.sasl.mechanism=SCRAM-SHA-512",
)


def find_helm() -> str | None:
    cache = Path(os.environ.get("TUNELOOP_CACHE", Path.home() / ".cache" / "tuneloop"))
    for candidate in (
        os.environ.get("TUNELOOP_HELM"),
        shutil.which("helm"),
        cache / "bin" / "helm",
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


HELM = find_helm()
pytestmark = pytest.mark.skipif(
    HELM is None,
    reason="helm not found; build it: python -m devservices prepare helm",
)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60, check=False)


@functools.cache
def _rendered(values: tuple[str, ...]) -> str:
    done = helm("template", "rel", str(CHART), "--namespace", "ml", *values)
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(*values: str) -> dict[str, dict]:
    """The objects `helm template` renders with *values*, by `Kind/name` (fresh copies)."""
    objects = [doc for doc in yaml.safe_load_all(_rendered(values)) if doc]
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def test_chart_lints_strictly():
    done = helm("lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr


def test_default_render_has_every_object_the_orchestrator_needs():
    assert sorted(render()) == [
        "ClusterRole/rel-tuneloop-runtimes",
        "ClusterRoleBinding/rel-tuneloop-runtimes",
        "ConfigMap/rel-tuneloop-rules",
        "Deployment/rel-tuneloop",
        "PersistentVolumeClaim/tuneloop-adapters",
        "Role/rel-tuneloop",
        "RoleBinding/rel-tuneloop",
        "Service/rel-tuneloop",
        "ServiceAccount/rel-tuneloop",
    ]


@pytest.mark.parametrize("values", [(), SASL], ids=["defaults", "sasl"])
def test_every_rendered_object_is_a_valid_object_of_its_kind(values):
    api = client.ApiClient()
    for name, obj in render(*values).items():
        model = api._ApiClient__deserialize(obj, MODELS[obj["kind"]])
        assert api.sanitize_for_serialization(model) == obj, f"{name} has unknown fields"


def test_rbac_grants_exactly_what_the_backend_uses():
    objects = render()
    granted: dict[tuple[str, str], tuple[str, ...]] = {}
    for key in ("Role/rel-tuneloop", "ClusterRole/rel-tuneloop-runtimes"):
        for rule in objects[key]["rules"]:
            (group,) = rule["apiGroups"]
            for resource in rule["resources"]:
                granted[group, resource] = tuple(sorted(rule["verbs"]))
    used = {("trainer.kubeflow.org", r): tuple(sorted(v)) for r, v in RBAC_RULES.items()}
    used |= {("", r): tuple(sorted(v)) for r, v in CORE_RBAC_RULES.items()}
    assert granted == used
    assert objects["Role/rel-tuneloop"]["metadata"]["namespace"] == "ml"


def test_trainjobs_can_live_in_another_namespace():
    objects = render("--set", "trainJobNamespace=training")
    assert objects["Role/rel-tuneloop"]["metadata"]["namespace"] == "training"
    assert objects["RoleBinding/rel-tuneloop"]["subjects"][0]["namespace"] == "ml"
    env = _env(objects["Deployment/rel-tuneloop"])
    assert env["TUNELOOP_KUBERNETES_NAMESPACE"]["value"] == "training"


def _env(deployment):
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item for item in container["env"]}


def test_a_grown_group_and_its_partition_count_reach_the_worker():
    # docs/partitions.md: after `tuneloop partitions grow`, the workers start in the new group
    objects = render("--set", "kafka.groupId=tuneloop-16", "--set", "kafka.internalPartitions=16")
    env = _env(objects["Deployment/rel-tuneloop"])
    assert env["TUNELOOP_KAFKA_GROUP_ID"]["value"] == "tuneloop-16"
    assert env["TUNELOOP_KAFKA_INTERNAL_PARTITIONS"]["value"] == "16"
    default = _env(render()["Deployment/rel-tuneloop"])
    assert default["TUNELOOP_KAFKA_INTERNAL_PARTITIONS"]["value"] == "8"


def test_kafka_credentials_are_secret_references_only():
    deployment = render(*SASL)["Deployment/rel-tuneloop"]
    env = _env(deployment)
    for name, key in (
        ("TUNELOOP_KAFKA_SASL_USERNAME", "username"),
        ("TUNELOOP_KAFKA_SASL_PASSWORD", "password"),
    ):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "kafka-credentials", "key": key}


def test_sasl_without_a_secret_refuses_to_render():
    done = helm("template", "rel", str(CHART), "--set", "kafka.securityProtocol=SASL_SSL")
    assert done.returncode != 0
    assert "kafka.sasl.existingSecret" in done.stderr


def test_pods_are_annotated_for_prometheus_and_locked_down():
    pod = render()["Deployment/rel-tuneloop"]["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8080"
    assert annotations["prometheus.io/path"] == "/metrics"
    (container,) = pod["spec"]["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_probes_ask_the_web_server_for_health_and_readiness_not_metrics():
    objects = render()
    (container,) = objects["Deployment/rel-tuneloop"]["spec"]["template"]["spec"]["containers"]
    probes = {
        kind: (container[kind]["httpGet"]["path"], container[kind]["httpGet"]["port"])
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {
        "startupProbe": ("/healthz", "http"),
        "livenessProbe": ("/healthz", "http"),
        "readinessProbe": ("/readyz", "http"),
    }
    env = _env(objects["Deployment/rel-tuneloop"])
    assert env["TUNELOOP_WEB_PORT"]["value"] == "8080"
    assert env["TUNELOOP_WEB_BIND"]["value"] == "0.0.0.0"
    service = objects["Service/rel-tuneloop"]["spec"]
    assert service["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]


def test_the_ingress_token_is_a_secret_reference_and_trusted_networks_a_list():
    objects = render(
        "--set",
        "ingress.tokenSecret=ingress-token",
        "--set",
        "ingress.trustedNetworks={10.244.0.0/16,fd00::/8}",
    )
    env = _env(objects["Deployment/rel-tuneloop"])
    assert "value" not in env["TUNELOOP_INGRESS_TOKEN"]
    assert env["TUNELOOP_INGRESS_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "ingress-token",
        "key": "token",
    }
    assert env["TUNELOOP_INGRESS_TRUSTED_NETWORKS"]["value"] == "10.244.0.0/16,fd00::/8"
    assert "TUNELOOP_INGRESS_TOKEN" not in _env(render()["Deployment/rel-tuneloop"])


def test_rule_files_become_the_mounted_configmap():
    rules = "rules:\n  - name: retrain-on-drift\n"
    objects = render("--set-string", f"rules.files.drift\\.yaml={rules}")
    assert objects["ConfigMap/rel-tuneloop-rules"]["data"] == {"drift.yaml": rules}
    (container,) = objects["Deployment/rel-tuneloop"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "rules", "mountPath": "/etc/tuneloop/rules", "readOnly": True} in container[
        "volumeMounts"
    ]


def test_the_adapters_claim_is_the_one_the_shipped_runtimes_mount_and_outlives_the_release():
    runtimes = [
        doc
        for path in sorted((CHART.parents[1] / "runtimes").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    mounted = {
        volume["persistentVolumeClaim"]["claimName"]
        for runtime in runtimes
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        for volume in job["template"]["spec"]["template"]["spec"].get("volumes", [])
        if "persistentVolumeClaim" in volume
    }
    claim = render("--set", "trainJobNamespace=training")["PersistentVolumeClaim/tuneloop-adapters"]
    assert mounted == {claim["metadata"]["name"]}
    assert claim["metadata"]["namespace"] == "training"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in claim["spec"]  # the cluster's default
    assert "PersistentVolumeClaim/tuneloop-adapters" not in render("--set", "adapters.create=false")


def test_the_storage_secret_is_handed_to_the_worker_by_name_only():
    env = _env(render("--set", "trainer.storageSecret=s3-keys")["Deployment/rel-tuneloop"])
    assert env["TUNELOOP_KUBERNETES_STORAGE_SECRET"] == {
        "name": "TUNELOOP_KUBERNETES_STORAGE_SECRET",
        "value": "s3-keys",
    }
    assert "TUNELOOP_KUBERNETES_STORAGE_SECRET" not in _env(render()["Deployment/rel-tuneloop"])

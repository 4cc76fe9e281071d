"""`python -m devservices prepare [kafka] [kubernetes] [helm] [object-storage] [mlflow]
[serving]`: resolve Kafka's jars, build the local control plane (etcd, kube-apiserver,
kube-controller-manager, the JobSet and Kubeflow Trainer controllers), helm for the chart's
tests, s3proxy (the S3 server of the storage tests), the MLflow tracking server's venv and
vLLM's (the serving tests), once, into ~/.cache/tuneloop.

With no name, all of them (`make services`); `make demo` needs all but kubernetes and helm
(and not serving with `TUNELOOP_DEMO_MODEL=tiny`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from devservices import control_plane, kafka, kubernetes, mlflow_server, object_storage, serving

PREPARERS: dict[str, Callable[[], None]] = {
    "kafka": kafka.prepare,
    "kubernetes": control_plane.prepare,
    "helm": kubernetes.prepare_helm,
    "object-storage": object_storage.prepare,
    "mlflow": mlflow_server.prepare,
    "serving": serving.prepare,
}


def main(argv: list[str]) -> int:
    names = argv[1:] or list(PREPARERS)
    if argv[:1] != ["prepare"] or any(name not in PREPARERS for name in names):
        print(
            "usage: python -m devservices prepare [kafka] [kubernetes] [helm]"
            " [object-storage] [mlflow] [serving]",
            file=sys.stderr,
        )
        return 2
    for name in names:
        PREPARERS[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

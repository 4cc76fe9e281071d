"""Real Kafka and a real Kubernetes on 127.0.0.1, started by tuneloop itself.

For `make demo`, `make test` and developers without Docker or a cluster: a single-node KRaft
Kafka broker from jars Maven resolves, and a local Kubernetes control plane built with Go
(etcd, kube-apiserver, kube-controller-manager, the JobSet and Kubeflow Trainer controllers)
with a node agent that runs pods as local processes. Everything they need is cached under
~/.cache/tuneloop.
"""

"""Real Kafka and a real Kubernetes API on 127.0.0.1, started by tuneloop itself.

For `make demo`, `make test` and developers without Docker or a cluster: a single-node KRaft
Kafka broker from jars Maven resolves, and apiextensions-apiserver + etcd built with Go, with
the Kubeflow Trainer CRDs loaded. Everything they need is cached under ~/.cache/tuneloop.
"""

"""`python -m handlers.local_services prepare`: resolve Kafka's jars and build the Kubernetes
API server and etcd once, into ~/.cache/tuneloop. `make services` calls it."""

from __future__ import annotations

import sys

from handlers.local_services import kafka, kubernetes


def main(argv: list[str]) -> int:
    if argv[:1] != ["prepare"]:
        print("usage: python -m handlers.local_services prepare", file=sys.stderr)
        return 2
    kafka.prepare()
    kubernetes.prepare()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

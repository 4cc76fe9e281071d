"""`python -m handlers.local_services prepare [kafka] [kubernetes]`: resolve Kafka's jars and
build the Kubernetes API server and etcd once, into ~/.cache/tuneloop.

With no name, both (`make services`); `make demo` needs only Kafka.
"""

from __future__ import annotations

import sys

from handlers.local_services import kafka, kubernetes

PREPARERS = {"kafka": kafka.prepare, "kubernetes": kubernetes.prepare}


def main(argv: list[str]) -> int:
    names = argv[1:] or list(PREPARERS)
    if argv[:1] != ["prepare"] or any(name not in PREPARERS for name in names):
        print(
            "usage: python -m handlers.local_services prepare [kafka] [kubernetes]", file=sys.stderr
        )
        return 2
    for name in names:
        PREPARERS[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

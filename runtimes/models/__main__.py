"""`python -m runtimes.models prepare`: build the tiny model and convert SmolLM2 once, cached.
`make models` calls it."""

from __future__ import annotations

import sys

from runtimes.models import catalog


def main(argv: list[str]) -> int:
    if argv[:1] != ["prepare"]:
        print("usage: python -m runtimes.models prepare", file=sys.stderr)
        return 2
    catalog.prepare()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""`python -m runtimes.models prepare [NAME...]`: build the offline models once, cached.

With no name, every catalogued model (`make models`); `make demo` names only the one it uses.
"""

from __future__ import annotations

import sys

from runtimes.models import catalog


def main(argv: list[str]) -> int:
    if argv[:1] != ["prepare"]:
        print("usage: python -m runtimes.models prepare [tiny|smollm2 ...]", file=sys.stderr)
        return 2
    names = argv[1:]
    if not names:
        catalog.prepare()
        return 0
    for name in names:
        try:
            print(catalog.model_dir(name), file=sys.stderr)
        except KeyError as exc:
            print(f"runtimes.models: {exc.args[0]}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
